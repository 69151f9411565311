"""What the root FSDP unit keeps for all its units across one forward and backward (issue 44):

  order      the units in the order their forwards ran, recorded in the first iteration; the
             unit after the current one is prefetched (its all-gather issued before it is
             needed: in forward with forward_prefetch, in backward per backward_prefetch).
  identity   every collective is preceded, on the same comm thread, by an all-gather of
             (unit, phase, iteration) from each rank: a rank that skipped a unit's forward or
             backward, or ran another, is named at the first collective after, instead of
             pairing its gathers with the wrong unit's (same-sized units would do so silently).
             A rank that stops running collectives is named by the backend's timeout.
  reductions the gradients' reduce-scatters run on the comm thread while backward goes on;
             at most one is in flight (the previous one is awaited when the next is issued),
             so at most two units' full gradients are held.
  non-finite at the end of each synced backward, TESSERA_ON_NONFINITE's policy (error, skip
             or off, as tessera-worker's --on-nonfinite): every rank learns whether any shard
             holds a NaN or Inf, and every rank stops naming it or drops the step.

Metrics go to the process's Prometheus registry (tessera.torch.metrics_url()).
"""

import ctypes
import logging
import os
import time

import torch
import torch.distributed as dist

from tessera.torch import _C
from tessera.torch.fsdp.collectives import all_gather_into

_LOG = logging.getLogger("tessera.torch.fsdp")

FORWARD_GATHER, BACKWARD_GATHER, REDUCE_SCATTER, ALL_REDUCE, REPLICATE = range(5)
_PHASES = ("forward all-gather", "backward all-gather", "gradient reduce-scatter",
           "gradient all-reduce", "gradient all-reduce across replicas")
_METRIC_OPS = ("all_gather", "all_gather", "reduce_scatter", "all_reduce", "all_reduce")

_POLICIES = ("error", "skip", "off")


def nonfinite_policy():
    """TESSERA_ON_NONFINITE: error (the default), skip or off."""
    policy = os.environ.get("TESSERA_ON_NONFINITE", "error")
    if policy not in _POLICIES:
        raise ValueError(f"tessera FSDP: TESSERA_ON_NONFINITE={policy!r}: expected error, skip "
                         f"or off (as tessera-worker's --on-nonfinite)")
    return policy


_MALLOC_TUNED = False


def tune_malloc():
    """Once per process, with TESSERA_FSDP_MMAP_THRESHOLD=BYTES: glibc's malloc told to map
    every block of BYTES or more on its own, so that the unit-sized tensors FSDP frees leave
    the process (glibc's default threshold rises to the largest block freed, up to 32 MiB, and
    what the heap takes back it keeps). It costs step time: every such block is fresh pages
    (measured on the 91.4M-parameter GPT of tessera-bench torch --fsdp at 2 ranks: FULL_SHARD
    at 1.10x DDP's step without it, 1.27x at 16 MiB, 1.75x at 128 KiB; its peak above the
    activations 1181, 883 and 541 MiB). Unset or 0, or MALLOC_MMAP_THRESHOLD_ set: malloc is
    left as it is."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    text = os.environ.get("TESSERA_FSDP_MMAP_THRESHOLD", "0")
    try:
        threshold = int(text)
    except ValueError:
        raise ValueError(f"tessera FSDP: TESSERA_FSDP_MMAP_THRESHOLD={text!r}: a number of "
                         f"bytes (0 leaves glibc's malloc as it is)") from None
    if threshold <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    if mallopt(-3, threshold) == 1:  # M_MMAP_THRESHOLD
        _LOG.info("tessera FSDP: glibc's malloc maps every block of %d bytes or more on its "
                  "own (TESSERA_FSDP_MMAP_THRESHOLD), so freed units leave memory", threshold)


def use_block_cache():
    """Once per process: torch's CPU tensors of TESSERA_FSDP_BLOCK_CACHE bytes or more (default
    1 MiB; 0: off) come from a cache of mapped blocks (worker/torch/block_cache.h) that keeps
    what FSDP and autograd free for the next tensor of its size: the unit-sized tensors of a
    step reuse the same pages, and what stays mapped never exceeds the most held at once."""
    text = os.environ.get("TESSERA_FSDP_BLOCK_CACHE", str(1 << 20))
    try:
        min_bytes = int(text)
    except ValueError:
        raise ValueError(f"tessera FSDP: TESSERA_FSDP_BLOCK_CACHE={text!r}: a number of bytes "
                         f"(0 leaves torch's CPU allocator as it is)") from None
    if min_bytes > 0 and _C.fsdp_use_block_cache(min_bytes):
        _LOG.info("tessera FSDP: CPU tensors of %d bytes or more come from a block cache "
                  "(TESSERA_FSDP_BLOCK_CACHE)", min_bytes)



def empty_block_cache():
    """Returns to the kernel the blocks the block cache keeps for reuse (as
    torch.cuda.empty_cache does on CUDA): for a process done with one FSDP model that goes on
    without it. A no-op when the cache is off."""
    _C.fsdp_empty_block_cache()


def add_bytes(kind, delta):
    """Held bytes of kind (shard, gathered, gradient_shard, full_gradient) change by delta."""
    if delta:
        _C.fsdp_add_param_bytes(kind, int(delta))


class Issued:
    """A collective of a unit, issued on the comm thread behind its identity check."""

    def __init__(self, runtime, unit, phase, group, launch, nbytes, keep=()):
        self._runtime = runtime
        self._unit = unit
        self._phase = phase
        self._group = group
        self._nbytes = nbytes
        self._keep = keep  # tensors the backend reads until wait()
        self._started = time.perf_counter()
        self._check = None
        try:
            if runtime is not None:  # not before the first forward (nothing to tell apart)
                world = dist.get_world_size(group)
                self._identity = torch.tensor([unit._index, phase, runtime.iteration],
                                              dtype=torch.int64)
                self._identities = torch.empty(3 * world, dtype=torch.int64)
                self._check = all_gather_into(self._identities, self._identity, group,
                                              async_op=True)
            self._handle = launch()
        except RuntimeError as error:
            raise self._failed(error) from error

    def _what(self, index, phase, iteration):
        if not (0 <= index < len(self._runtime.units) and 0 <= phase < len(_PHASES)):
            return f"a collective that is no unit's (identity {[index, phase, iteration]})"
        return (f"unit '{self._runtime.units[index]._unit_name}' {_PHASES[phase]} (iteration "
                f"{iteration})")

    def _failed(self, error):
        rank = dist.get_rank(self._group)
        what = f"unit '{self._unit._unit_name}' {_PHASES[self._phase]}"
        if self._runtime is not None:
            what += f" (iteration {self._runtime.iteration})"
        return RuntimeError(f"tessera FSDP: rank {rank}: {what}: {error}")

    def wait(self, prefetched=False):
        waited = time.perf_counter()
        try:
            if self._check is not None:
                self._check.wait()
                self._compare_identities()  # before the op itself, which may then mismatch
            self._handle.wait()
        except _Mismatch:
            raise
        except RuntimeError as error:
            raise self._failed(error) from error
        now = time.perf_counter()
        if prefetched and now - waited > 1e-4:
            _C.fsdp_prefetch_wait(now - waited)
        _C.fsdp_observe_collective(_METRIC_OPS[self._phase], now - self._started, self._nbytes)
        self._keep = ()

    def _compare_identities(self):
        mine = self._identity.tolist()
        for rank, theirs in enumerate(self._identities.view(-1, 3).tolist()):
            if theirs != mine:
                me = dist.get_rank(self._group)
                raise _Mismatch(
                    f"tessera FSDP: rank {me} ran {self._what(*mine)} where rank {rank} ran "
                    f"{self._what(*theirs)}: the ranks' forward or backward passes differ (a "
                    f"rank skipped a unit, or ran one the others did not)")


class _Mismatch(RuntimeError):
    """The ranks ran different collectives (raised as it is, not wrapped)."""


class Runtime:
    """The root's state for its units (one instance per root, shared by every unit in it)."""

    def __init__(self, root, units):
        self.root = root
        self.units = units
        for index, unit in enumerate(units):
            unit._index = index
            unit._runtime = self
        self.iteration = 0
        self.order = []          # units by forward, recorded until the first backward ends
        self.recording = True
        self.next_in_forward = {}   # unit: the unit whose forward comes next
        self.next_in_backward = {}  # unit: the unit whose backward comes next
        self.in_backward = False
        self.pending_reduction = None  # (unit, Issued, finish) of the reduce-scatter in flight
        self.reduced = []        # units whose gradients were reduced in this backward
        self.policy = nonfinite_policy()
        self.skipped_steps = 0

    # -- order and prefetch ---------------------------------------------------------------------

    def forward_started(self, unit):
        """Called as unit's forward starts; returns the unit to prefetch next (or None)."""
        if self.recording:
            if unit is self.root:  # the last forward before the first backward counts
                self.order = []
            self.order.append(unit)
            return None
        return self.next_in_forward.get(unit)

    def backward_started(self, unit):
        """Called as unit's backward starts; returns the unit whose backward comes next."""
        return None if self.recording else self.next_in_backward.get(unit)

    def _learn_order(self):
        """Backward runs the forward order backwards; the root's own backward starts first
        (its output's gradient), and the last unit's comes next."""
        order = self.order
        for i, unit in enumerate(order):
            if i + 1 < len(order):
                self.next_in_forward.setdefault(unit, order[i + 1])
            if i >= 1:
                self.next_in_backward[unit] = order[i - 1]
        if len(order) > 1 and order[0] is self.root:
            self.next_in_backward[self.root] = order[-1]
        self.recording = False

    # -- reductions -----------------------------------------------------------------------------

    def reduce(self, unit, issued, finish):
        """A unit's gradient reduction was issued: the one before it is finished first."""
        self.finish_reduction()
        self.pending_reduction = (unit, issued, finish)
        self.reduced.append(unit)

    def finish_reduction(self):
        if self.pending_reduction is None:
            return
        unit, issued, finish = self.pending_reduction
        self.pending_reduction = None
        issued.wait()
        finish()

    def backward_finished(self):
        """The root's autograd callback: every reduction done, every unit freed, the
        gradients checked."""
        try:
            for unit in self.units:
                unit.finish_partial_gradient()
            self.finish_reduction()
        finally:
            for unit in self.units:
                unit._free_full()
            reduced, self.reduced = self.reduced, []
            if self.recording:
                self._learn_order()
            self.in_backward = False
            self.iteration += 1
        held = sum(u.flat_param.grad.numel() * u.flat_param.grad.element_size()
                   for u in self.units if u.flat_param is not None
                   and u.flat_param.grad is not None)
        add_bytes("gradient_shard", held - self.root._gradient_shard_bytes)
        self.root._gradient_shard_bytes = held
        if reduced and self.policy != "off":
            self._check_finite(reduced)

    # -- non-finite gradients -------------------------------------------------------------------

    def _first_nonfinite(self, units):
        """'name' (element e of n) of the first NaN or Inf in units' gradient shards, its
        value; or None."""
        for unit in units:
            grad = unit.flat_param.grad
            if grad is None or bool(torch.isfinite(grad).all()):
                continue
            at = int((~torch.isfinite(grad)).nonzero()[0])
            value = float(grad[at])
            return unit._name_of_shard_element(at), value
        return None

    def _check_finite(self, reduced):
        found = self._first_nonfinite(reduced)
        root = self.root
        # The lowest global rank that found one, through every group the units reduce over
        # (as world - rank, by MAX).
        world, me = dist.get_world_size(), dist.get_rank()
        flag = torch.tensor([world - me if found is not None else 0], dtype=torch.int64)
        for group in (root.process_group, root._replicate_group):
            if group is not None:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if int(flag) == 0:
            return
        first = world - int(flag)
        if found is not None:
            where, value = found
            what = (f"rank {me}: the reduced gradient of {where} in its shard is "
                    f"{'NaN' if value != value else value}")
        else:
            what = (f"rank {first} found a NaN or Inf in its gradient shards "
                    f"(reduced from every rank's)")
        if self.policy == "skip":
            for unit in self.units:
                unit.drop_gradients()
            for m in root._ignored_modules:
                for p in m.parameters(recurse=False):
                    p.grad = None
            self.skipped_steps += 1
            _LOG.warning("tessera FSDP: iteration %d skipped: %s (TESSERA_ON_NONFINITE=skip: "
                         "the gradients are dropped, so optimizer.step() leaves the parameters "
                         "as they are)", self.iteration - 1, what)
            return
        raise FloatingPointError(f"tessera FSDP: {what}; stopping (TESSERA_ON_NONFINITE=skip "
                                 f"drops such steps instead, =off checks nothing)")
