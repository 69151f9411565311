#!/usr/bin/python3
"""Ranks of `tessera-bench pipeline` (issue 46): tessera.torch.pipelining's schedules.

tessera-bench starts these processes (they meet through a file store in --store-dir, no port
is chosen):
  --mode=single    one process (--world 1) trains the whole model on the global batch: the
                   one-process reference.
  --mode=pipeline  --world P processes on the tessera backend. First DistributedDataParallel
                   over them, each rank on batch / P (the data-parallel reference), then each
                   schedule of --schedules at each M of --micro-batches, in that order, with the
                   model cut into P stages (interleaved: 2 P, two per rank).
  --mode=tp        the tensor-parallel part (issue 46: T = 2 at >= 0.8x DDP's throughput for
                   a 4096 x 4096 layer), on its own model (below): --world 1 trains it as one
                   process; --world 2 on the tessera backend runs DDP over the two processes
                   (each rank on --tp-batch / 2 rows), then tensor parallelism T = 2
                   (tessera.torch.tensor_parallel: each rank on all --tp-batch rows, the
                   weights halved).

Model: --layers blocks of Linear(--dim, --dim) + ReLU (an nn.Sequential, weights from --seed,
the same in every configuration), cut evenly into the stages; MSE loss against a synthetic
target; SGD with momentum 0.9. The global batch is --batch-size rows.

A configuration: --warmup-steps untimed steps, one untimed step that measures activation
memory (below), then --steps timed steps, each after a barrier of a gloo group kept for the
bench's bookkeeping (so the ranks start a step together and no bookkeeping is timed). A
step is zero_grad, schedule.step (or forward, loss and backward), optimizer.step, timed with
perf_counter; a step's time is the max over the ranks and the configuration's step_s the
median over its steps; samples_per_second = batch / step_s.

Bubble: schedule.step() keeps the step's timeline of compute actions (F, B, I, W) and their
total, busy_s, and its wall time step_s (schedules.py). A step's length is the longest
step_s over the ranks (they started together), and rank r's idle share
1 - busy_s(r) / length, waits for messages included; bubble_per_rank is its median over the
timed steps, bubble_measured their mean over the ranks. The library's bubble_fraction (from
running the schedule with F = 1, B = 2, free messages) comes with it as bubble_formula.

Activation memory: during the untimed memory step a saved_tensors_hooks pair counts the bytes
of the distinct tensors (by address and size) autograd holds for backward (parameters and
their views excepted) while the graph holds them (a handle per saved tensor, released when
autograd releases it); peak_activation_bytes_per_rank is the most held at once on each rank
over the step, all its stages' micro-batches together, and activation_bytes_left_after_step
what was still held at its end (0: every saved tensor was released).

Rank 0 prints a {"bench": "torch_pipeline_info", ...} line, then one {"bench":
"torch_pipeline", "config": "single" | "ddp" | <schedule>, ...} line per configuration. Exit
status 3 when torch or tessera.torch cannot be imported (stderr says which).

Tensor parallel (--mode=tp): one Megatron pair, Linear(--tp-dim, --tp-dim) (ColwiseParallel
under TP), ReLU, Linear(--tp-dim, --tp-dim) (RowwiseParallel), weights from --seed; MSE loss,
SGD with momentum 0.9, a global batch of --tp-batch rows; steps timed as above (TP's step
holds the row layer's all-reduce in forward and the column layer's in backward, DDP's its
gradient all-reduce). After the timed steps, a forward without autograd gives each
configuration's loss on the whole batch (DDP: the mean of the ranks' losses on their halves,
the same mean squared error): every configuration takes the same steps from the same weights
on the same batch, so a TP that computes something else shows a different loss. Rank 0 prints
{"bench": "torch_pipeline", "config": "tp_single" | "tp_ddp" | "tp", "loss": ..., ...}.
"""

import argparse
import collections
import datetime
import gc
import json
import os
import statistics
import sys
import time

SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved": ("ScheduleInterleaved1F1B", 2),
    "zb-h1": ("ScheduleZBH1", 1),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("single", "pipeline", "tp"), required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--store-dir", required=True, help="directory of the file store")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="process groups' timeout")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256, help="the global batch")
    parser.add_argument("--schedules", default="gpipe,1f1b,interleaved,zb-h1")
    parser.add_argument("--micro-batches", default="4,8")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tp-dim", type=int, default=4096, help="d of --mode=tp's layers")
    parser.add_argument("--tp-batch", type=int, default=128, help="--mode=tp's global batch")
    args = parser.parse_args()
    if args.mode == "tp":
        if args.world not in (1, 2):
            parser.error("--mode=tp runs on --world 1 or 2, not %d" % args.world)
        if args.tp_dim % 2 or args.tp_batch % 2:
            parser.error("--tp-dim %d and --tp-batch %d must be even (T = 2, two DDP halves)"
                         % (args.tp_dim, args.tp_batch))
        return args
    args.schedules = args.schedules.split(",")
    args.micro_batches = [int(m) for m in args.micro_batches.split(",")]
    for kind in args.schedules:
        if kind not in SCHEDULES:
            parser.error("--schedules: %r is not one of %s" % (kind, ", ".join(SCHEDULES)))
        stages = args.world * SCHEDULES[kind][1]
        if args.mode == "pipeline" and args.layers % stages:
            parser.error("--layers %d does not cut evenly into %s's %d stages"
                         % (args.layers, kind, stages))
    for m in args.micro_batches:
        if m < 1 or args.batch_size % m:
            parser.error("--batch-size %d does not cut into %d micro-batches"
                         % (args.batch_size, m))
    if args.batch_size % args.world:
        parser.error("--batch-size %d does not split over %d ranks" % (args.batch_size,
                                                                       args.world))
    return args


def emit(record):
    print(json.dumps(record), flush=True)


class LiveActivations:
    """Bytes of the distinct tensors autograd holds for backward at each moment, the
    parameters excepted, and the most held at once. pack wraps each saved tensor in a
    handle that autograd keeps in its graph; the handle's release (when autograd frees the
    saved tensor: after the backward, or after W for zero bubble's split backward) is the
    moment the graph stops holding it."""

    class _Handle:
        __slots__ = ("owner", "key", "tensor")

        def __init__(self, owner, key, tensor):
            self.owner, self.key, self.tensor = owner, key, tensor

        def __del__(self):
            self.owner._release(self.key)

    def __init__(self, torch, parameters):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self.parameter_storages = {p.storage().data_ptr() for p in parameters}
        self.counts = {}  # (address, bytes) -> handles alive
        self.sizes = {}   # (address, bytes) -> bytes
        self.live = 0
        self.peak = 0

    def _pack(self, tensor):
        if tensor.storage().data_ptr() in self.parameter_storages:
            return tensor  # a parameter, or a view of one (Linear's weight.t())
        # By address and size, not by storage: a micro-batch of the batch (stage 0's input, the
        # last stage's target) is a view of the whole batch's storage, of which it holds only
        # its rows.
        key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        if self.counts.get(key, 0) == 0:
            self.sizes[key] = key[1]
            self.live += self.sizes[key]
            self.peak = max(self.peak, self.live)
        self.counts[key] = self.counts.get(key, 0) + 1
        # Detached (the same storage, no grad_fn; autograd gives an output back its own when it
        # unpacks it): a handle holding a saved output itself would tie it to the node that
        # saved it, a cycle that a graph kept with retain_graph (ZB-H1's I) never frees.
        return LiveActivations._Handle(self, key, tensor.detach())

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, LiveActivations._Handle) else saved

    def _release(self, key):
        self.counts[key] -= 1
        if self.counts[key] == 0:
            del self.counts[key]
            self.live -= self.sizes.pop(key)


def make_model(torch, args):
    torch.manual_seed(args.seed)
    modules = []
    for _ in range(args.layers):
        modules += [torch.nn.Linear(args.dim, args.dim), torch.nn.ReLU()]
    return torch.nn.Sequential(*modules)


def make_batch(torch, args):
    generator = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.batch_size, args.dim, generator=generator)
    y = torch.randn(args.batch_size, args.dim, generator=generator)
    return x, y


def optimizer_of(torch, args, parameters):
    return torch.optim.SGD(parameters, lr=args.lr, momentum=0.9)


def whole_model_steps(torch, args, model, x, y, barrier):
    """Trains `model` on (x, y) as one process (or one DDP rank) does; each step's seconds."""
    optimizer = optimizer_of(torch, args, model.parameters())
    loss_fn = torch.nn.MSELoss()

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(args.warmup_steps + 1):  # + 1: the pipeline's memory step
        step()
    times = []
    for _ in range(args.steps):
        barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def run_single(torch, args):
    model = make_model(torch, args)
    x, y = make_batch(torch, args)
    times = whole_model_steps(torch, args, model, x, y, lambda: None)
    step_s = statistics.median(times)
    emit({"bench": "torch_pipeline_info", "torch_version": torch.__version__,
          "threads": torch.get_num_threads()})
    emit({"bench": "torch_pipeline", "config": "single", "world": 1, "step_s": step_s,
          "steps_s": times, "samples_per_second": args.batch_size / step_s,
          "parameters": sum(p.numel() for p in model.parameters())})


class _Ranks:
    """This rank in the tessera process group of the run, with a Gloo group beside it for the
    benchmark's own bookkeeping (barriers between steps, the ranks' figures), so that it never
    shares the backend it measures."""

    def __init__(self, torch, dist, args):
        timeout = datetime.timedelta(seconds=args.timeout_s)
        dist.init_process_group("tessera", init_method="file://%s/store" % args.store_dir,
                                rank=args.rank, world_size=args.world, timeout=timeout)
        self.book = dist.new_group(backend="gloo", timeout=timeout)
        self.world, self.rank = args.world, args.rank
        self._torch, self._dist = torch, dist

    def barrier(self):
        self._dist.barrier(group=self.book)

    def gathered(self, values):
        """values (a list, one per step) of every rank: a list per rank."""
        t = self._torch.zeros(self.world, len(values), dtype=self._torch.float64)
        t[self.rank] = self._torch.tensor(values, dtype=self._torch.float64)
        self._dist.all_reduce(t, group=self.book)
        return t.tolist()

    def slowest(self, values):
        """The largest over the ranks of each of values."""
        return [max(column) for column in zip(*self.gathered(values))]


def run_pipeline(torch, dist, args):
    import tessera.torch as tessera_torch
    from tessera.torch import pipelining

    ranks = _Ranks(torch, dist, args)
    world, rank, barrier, gathered = ranks.world, ranks.rank, ranks.barrier, ranks.gathered

    if rank == 0:
        emit({"bench": "torch_pipeline_info", "torch_version": torch.__version__,
              "threads": torch.get_num_threads(), "world": world,
              "tessera_package": getattr(tessera_torch, "__file__", ""),
              "tessera_channel": getattr(dist.group.WORLD, "channel", "")})
    x, y = make_batch(torch, args)
    loss_fn = torch.nn.MSELoss()

    # Data parallelism over the same processes: each rank its share of the batch.
    share = args.batch_size // world
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(torch, args))
    times = whole_model_steps(torch, args, ddp, x[rank * share:(rank + 1) * share],
                              y[rank * share:(rank + 1) * share], barrier)
    times = ranks.slowest(times)
    if rank == 0:
        step_s = statistics.median(times)
        emit({"bench": "torch_pipeline", "config": "ddp", "world": world, "step_s": step_s,
              "steps_s": times, "samples_per_second": args.batch_size / step_s})
    del ddp
    gc.collect()

    for kind in args.schedules:
        class_name, per_rank = SCHEDULES[kind]
        stages_total = world * per_rank
        per_stage = 2 * args.layers // stages_total  # modules: a Linear and a ReLU per block
        for m in args.micro_batches:
            model = make_model(torch, args)
            parts = {s: model[s * per_stage:(s + 1) * per_stage]
                     for s in range(rank, stages_total, world)}
            stages = [pipelining.PipelineStage(parts[s], s, stages_total, torch.device("cpu"))
                      for s in sorted(parts)]
            cls = getattr(pipelining, class_name)
            schedule = cls(stages if per_rank > 1 else stages[0], m, loss_fn=loss_fn)
            parameters = [p for s in sorted(parts) for p in parts[s].parameters()]
            optimizer = optimizer_of(torch, args, parameters)
            last = rank == (stages_total - 1) % world

            def step():
                optimizer.zero_grad(set_to_none=True)
                if rank == 0:
                    schedule.step(x, **({"target": y} if last else {}))
                elif last:
                    schedule.step(target=y)
                else:
                    schedule.step()
                optimizer.step()

            for _ in range(args.warmup_steps):
                step()
            live = LiveActivations(torch, parameters)
            with live.hooks:
                step()
            step_times, schedule_s, busy_s = [], [], []
            for _ in range(args.steps):
                barrier()
                start = time.perf_counter()
                step()
                step_times.append(time.perf_counter() - start)
                schedule_s.append(schedule.step_s)
                busy_s.append(schedule.busy_s)
            step_times = ranks.slowest(step_times)
            lengths = ranks.slowest(schedule_s)
            busy = gathered(busy_s)
            bubbles = [statistics.median(1 - b / length for b, length in zip(busy[r], lengths))
                       for r in range(world)]
            peaks = [int(v[0]) for v in gathered([live.peak])]
            left = [int(v[0]) for v in gathered([live.live])]
            held = [int(v[0]) for v in gathered([schedule.peak_held])]
            if rank == 0:
                step_s = statistics.median(step_times)
                emit({"bench": "torch_pipeline", "config": kind, "schedule": kind,
                      "world": world, "stages_per_rank": per_rank, "micro_batches": m,
                      "step_s": step_s, "steps_s": step_times,
                      "schedule_step_s": statistics.median(lengths),
                      "samples_per_second": args.batch_size / step_s,
                      "bubble_measured": sum(bubbles) / world, "bubble_per_rank": bubbles,
                      "bubble_formula": schedule.bubble_fraction,
                      "peak_activation_bytes_per_rank": peaks,
                      "activation_bytes_left_after_step": left,
                      "peak_held_per_rank": held,
                      "expected_peak_held_per_rank": pipelining_peaks(kind, world, m,
                                                                      per_rank)})
            del schedule, stages, parts, model, optimizer
            gc.collect()


def make_tp_model(torch, args):
    """The Megatron pair: a column layer, ReLU, a row layer (named for the TP plan)."""
    torch.manual_seed(args.seed)
    d = args.tp_dim
    return torch.nn.Sequential(collections.OrderedDict(
        [("fc1", torch.nn.Linear(d, d)), ("relu", torch.nn.ReLU()),
         ("fc2", torch.nn.Linear(d, d))]))


def make_tp_batch(torch, args):
    generator = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.tp_batch, args.tp_dim, generator=generator)
    y = torch.randn(args.tp_batch, args.tp_dim, generator=generator)
    return x, y


def loss_after(torch, model, x, y):
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


def tp_record(args, config, world, times, loss):
    step_s = statistics.median(times)
    return {"bench": "torch_pipeline", "config": config, "world": world, "step_s": step_s,
            "steps_s": times, "samples_per_second": args.tp_batch / step_s, "loss": loss,
            "dim": args.tp_dim, "batch_size": args.tp_batch}


def run_tp(torch, dist, args):
    """--mode=tp: the one-process reference (--world 1), or DDP then TP T = 2 (--world 2)."""
    x, y = make_tp_batch(torch, args)
    if args.world == 1:
        model = make_tp_model(torch, args)
        times = whole_model_steps(torch, args, model, x, y, lambda: None)
        emit({"bench": "torch_pipeline_info", "torch_version": torch.__version__,
              "threads": torch.get_num_threads()})
        emit(tp_record(args, "tp_single", 1, times, loss_after(torch, model, x, y)))
        return
    import tessera.torch as tessera_torch
    from tessera.torch.tensor_parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

    ranks = _Ranks(torch, dist, args)
    world, rank, barrier, slowest = ranks.world, ranks.rank, ranks.barrier, ranks.slowest

    def gathered(value):
        """value of every rank, by rank."""
        return [v[0] for v in ranks.gathered([value])]

    if rank == 0:
        emit({"bench": "torch_pipeline_info", "torch_version": torch.__version__,
              "threads": torch.get_num_threads(), "world": world,
              "tessera_package": getattr(tessera_torch, "__file__", ""),
              "tessera_channel": getattr(dist.group.WORLD, "channel", "")})

    share = args.tp_batch // world
    mine = slice(rank * share, (rank + 1) * share)
    ddp = torch.nn.parallel.DistributedDataParallel(make_tp_model(torch, args))
    times = slowest(whole_model_steps(torch, args, ddp, x[mine], y[mine], barrier))
    # Equal halves: the mean of the halves' mean squared errors is the whole batch's.
    loss = sum(gathered(loss_after(torch, ddp.module, x[mine], y[mine]))) / world
    if rank == 0:
        emit(tp_record(args, "tp_ddp", world, times, loss))
    del ddp
    gc.collect()

    model = parallelize_module(make_tp_model(torch, args), dist.group.WORLD,
                               {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    times = slowest(whole_model_steps(torch, args, model, x, y, barrier))
    loss = loss_after(torch, model, x, y)  # the row layer's output is whole on every rank
    losses = gathered(loss)  # equal on the ranks unless the all-reduce is broken
    if rank == 0:
        record = tp_record(args, "tp", world, times, loss)
        record["loss_per_rank"] = losses
        record["shard_parameters"] = sum(p.numel() for p in model.parameters())
        emit(record)


def pipelining_peaks(kind, world, m, per_rank):
    from tessera.torch import _C
    return list(_C.pipeline_schedule(kind, world, m, per_rank)["peak_held"])


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print("torch_pipeline_bench.py: cannot import torch.distributed (%s); install "
              "Debian's PyTorch with `apt-get install python3-torch`" % error, file=sys.stderr)
        return 3
    if args.mode == "pipeline" or (args.mode == "tp" and args.world > 1):
        try:
            import tessera.torch  # noqa: F401  (registers the backend)
        except ImportError as error:
            print("torch_pipeline_bench.py: cannot import tessera.torch (%s); sys.path: %s"
                  % (error, sys.path), file=sys.stderr)
            return 3
    torch.set_num_threads(args.threads)
    if args.mode == "single":
        run_single(torch, args)
    elif args.mode == "tp":
        run_tp(torch, dist, args)
    else:
        run_pipeline(torch, dist, args)
    sys.stdout.flush()
    sys.stderr.flush()
    # Exits before the groups and DDP's reducer are released, as torch_fsdp_bench.py does
    # (a rank hung once in those destructors after the others had exited); all is done.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
