#!/usr/bin/python3
"""One rank of `tessera-bench torch --fsdp`: a GPT-like model trained under DDP or FSDP.

tessera-bench starts --world of these (each with --rank) per run, one run per configuration
(--config), so that each run's peak memory is its own; they meet through a file store in
--store-dir (no port is chosen). The default process group is the backend under test (gloo
for ddp-gloo, tessera otherwise: FSDP's process_group=None and hybrid_groups() then use it);
a second, gloo, group does the bench's bookkeeping (max over ranks) outside the clock.

Configurations:
  ddp-tessera, ddp-gloo     DistributedDataParallel over the default group.
  FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD
                            tessera.torch.fsdp.FullyShardedDataParallel with that strategy and
                            transformer_auto_wrap_policy over the Block class (torch's own
                            torch.distributed.fsdp.wrap when it imports, else tessera's copy
                            with the same signature). HYBRID_SHARD with --hybrid-shard-size S:
                            hybrid_groups(shard_size=S), blocks of S consecutive ranks as the
                            "hosts"; with 0: hybrid_groups() by hostname (ranks really on
                            different hosts or network namespaces with their own hostnames).

Model (GPT-like): token and position embeddings, --layers blocks of pre-LayerNorm causal
self-attention (--heads heads) and a 4x GELU MLP, a final LayerNorm and an output head tied to
the token embedding; --dim wide, --vocab tokens, --seq positions. Initial weights from --seed
(equal on every rank and configuration); each rank trains on its own pool of 4 synthetic
batches of --batch-size sequences (next-token cross-entropy), SGD with momentum 0.9.

A run: --warmup-steps untimed steps, a barrier, --steps timed steps, each step (zero_grad,
forward, loss, backward, optimizer.step, loss.item()) timed with perf_counter; a step's time is
the max over the ranks, and the run's step time the median over its steps.

Memory (per rank, bytes): the process's resident set as the kernel counts it. torch's CPU
allocator keeps no statistics in 1.13 and tracemalloc does not see tensors, so: `base` is
VmRSS once the process group and the batches exist and one step of a tiny model and a few
tiny collectives have touched the code and buffers the run will use (after malloc_trim);
then the model is built and wrapped and the optimizer made, VmHWM is reset (writing 5 to
/proc/self/clear_refs) so that construction (every rank builds the whole model before FSDP
shards it) does not count, and `peak` is VmHWM after the steps minus base. It includes what
glibc's malloc keeps (MALLOC_MMAP_THRESHOLD_, set by tessera-bench's --malloc-mmap-threshold,
changes that). `activation_bytes` are the distinct storages autograd saved for backward in
one step (saved_tensors_hooks), parameters and their views excepted: what the state formula
leaves out. Rank 0 prints one line
  {"bench":"torch_fsdp","config":...,"strategy":...,"backend":...,"world":W,"parameters":P,
   "step_s":median,"steps_s":[...],"peak_bytes":max over ranks,"peak_bytes_per_rank":[...],
   "activation_bytes":...,"unit_numels":[...],"rank0_losses":[...],...}
after a {"bench":"torch_fsdp_info",...} line. Exit status 3 when torch or tessera.torch cannot
be imported (the message on stderr says which).
"""

import argparse
import ctypes
import datetime
import functools
import gc
import json
import math
import os
import statistics
import sys
import time

CONFIGS = ("ddp-tessera", "ddp-gloo", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--store-dir", required=True, help="directory of the file store")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="process groups' timeout")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--meta-init", action="store_true",
                        help="FSDP: build the model on the meta device, materialized unit by "
                             "unit (param_init_fn); DDP builds it whole either way")
    parser.add_argument("--hybrid-shard-size", type=int, default=0,
                        help="HYBRID_SHARD: ranks per emulated host; 0: by hostname")
    args = parser.parse_args()
    if args.dim % args.heads:
        parser.error("--dim %d is not a multiple of --heads %d" % (args.dim, args.heads))
    return args


def emit(record):
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------------
# Memory of this process, as the kernel counts it

def status_bytes(field):
    """VmRSS, VmHWM, ... of /proc/self/status in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no %s in /proc/self/status" % field)


def settle():
    """Frees what Python and glibc's malloc hold but no longer use."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def reset_peak():
    """Resets VmHWM to the current VmRSS (Linux >= 4.0); False when the kernel refused."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return status_bytes("VmHWM") <= status_bytes("VmRSS") + (1 << 20)


class SavedActivations:
    """Bytes of the distinct storages autograd saves for backward while active, the model's
    parameters excepted: leaves that require grad, views of them, and the storages of the
    tensors the modules hold as attributes (FSDP's gathered parameters, views of its flat
    tensor: each a leaf of its own whose base does not require grad)."""

    def __init__(self, torch, model):
        self.torch = torch
        self.model = model
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.storages = {}

    def _parameter_storages(self):
        held = set()
        for m in self.model.modules():
            for value in list(vars(m).values()) + list(m.parameters(recurse=False)):
                if isinstance(value, self.torch.Tensor) and value.device.type != "meta":
                    held.add(value.storage().data_ptr())
        return held

    def pack(self, t):
        base = t._base if t._base is not None else t
        if not (base.requires_grad and base.is_leaf):
            storage = t.storage()
            if storage.data_ptr() not in self._parameter_storages():
                self.storages[storage.data_ptr()] = storage.size() * t.element_size()
        return t

    def total(self):
        return sum(self.storages.values())


# ---------------------------------------------------------------------------------------------
# The model

def make_model_classes(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        """Pre-LayerNorm transformer block: causal self-attention, then a 4x GELU MLP."""

        def __init__(self, dim, heads, seq, device=None):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(dim, device=device)
            self.qkv = nn.Linear(dim, 3 * dim, device=device)
            self.proj = nn.Linear(dim, dim, device=device)
            self.ln2 = nn.LayerNorm(dim, device=device)
            self.fc = nn.Linear(dim, 4 * dim, device=device)
            self.fc_out = nn.Linear(4 * dim, dim, device=device)
            # Additive causal mask (float: Gloo broadcasts no bool buffers).
            self.register_buffer("mask", torch.empty((seq, seq), device=device),
                                 persistent=False)
            self.reset_mask()

        def reset_mask(self):
            with torch.no_grad():
                self.mask.copy_(torch.full(self.mask.shape, float("-inf")).triu(1))

        def forward(self, x):
            batch, seq, dim = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
            shape = (batch, seq, self.heads, dim // self.heads)
            q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(dim // self.heads)
            scores = scores + self.mask[:seq, :seq]
            attended = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, dim)
            x = x + self.proj(attended)
            return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))

    def init_weights(module):
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()
            elif isinstance(m, Block):
                m.reset_mask()

    class GPT(nn.Module):
        def __init__(self, args, device=None):
            super().__init__()
            self.tokens = nn.Embedding(args.vocab, args.dim, device=device)
            self.positions = nn.Embedding(args.seq, args.dim, device=device)
            self.blocks = nn.ModuleList(Block(args.dim, args.heads, args.seq, device)
                                        for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(args.dim, device=device)
            self.head = nn.Linear(args.dim, args.vocab, bias=False, device=device)
            self.head.weight = self.tokens.weight  # tied
            if device is None:
                init_weights(self)

        def param_init_fn(self, module):
            """FSDP's param_init_fn for a GPT built on the meta device: each module on the
            CPU, initialized as __init__ would (in another order: other values), the head
            tied to the token embedding again (made before it)."""
            module.to_empty(device="cpu")
            init_weights(module)
            if module is self.head:
                module.weight = self.tokens.weight

        def forward(self, ids):
            positions = torch.arange(ids.shape[1])
            x = self.tokens(ids) + self.positions(positions)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    return Block, GPT


def auto_wrap_policy(block_class):
    """(policy, where it came from): torch's transformer_auto_wrap_policy when
    torch.distributed.fsdp.wrap imports (it does not with torch 1.13 on Python 3.11), else
    tessera's, which has its signature."""
    try:
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        source = "torch.distributed.fsdp.wrap"
    except Exception:  # noqa: BLE001 (1.13 on 3.11 raises ValueError from a dataclass)
        from tessera.torch.fsdp.wrap import transformer_auto_wrap_policy
        source = "tessera.torch.fsdp.wrap"
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={block_class})
    return policy, source


# ---------------------------------------------------------------------------------------------
# The run

def warm_code(args, gpt_class, torch, dist, backend):
    """Runs once, before the base is taken, what the measured steps will run on a tiny model
    and tiny tensors: the code pages of torch's kernels and the backend's buffers (Tessera's
    shared-memory rings) count in VmRSS once touched, a fixed cost of the process that is not
    the model's."""
    tiny = argparse.Namespace(**vars(args))
    tiny.dim, tiny.heads, tiny.layers, tiny.vocab = 32, 2, 1, 64
    model = gpt_class(tiny)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ids = torch.randint(0, tiny.vocab, (args.batch_size, args.seq))
    loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, tiny.vocab), ids.reshape(-1))
    loss.backward()
    optimizer.step()
    world = dist.get_world_size()
    t = torch.zeros(1024 * world)
    dist.all_reduce(t)
    dist.all_gather(list(t.chunk(world)), t[:1024].clone())
    if backend != "gloo":  # Gloo in 1.13 has neither on the CPU
        dist.all_gather_into_tensor(t, t[:1024].clone())
        dist.reduce_scatter_tensor(t[:1024].clone(), t)


def wrap(args, model, block_class, torch, dist):
    """The model under args.config, and the auto-wrap policy's source (FSDP) or "". With
    --meta-init, an FSDP model is on the meta device and materialized unit by unit."""
    if args.config.startswith("ddp-"):
        return torch.nn.parallel.DistributedDataParallel(model), ""
    from tessera.torch.fsdp import FullyShardedDataParallel, ShardingStrategy

    policy, source = auto_wrap_policy(block_class)
    strategy = ShardingStrategy[args.config]
    process_group = None  # the default group: tessera
    if strategy == ShardingStrategy.HYBRID_SHARD and args.hybrid_shard_size > 0:
        from tessera.torch.fsdp import hybrid_groups
        process_group = hybrid_groups(shard_size=args.hybrid_shard_size)
    return FullyShardedDataParallel(
        model, process_group=process_group, sharding_strategy=strategy, auto_wrap_policy=policy,
        param_init_fn=model.param_init_fn if args.meta_init else None), source


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print("torch_fsdp_bench.py: cannot import torch.distributed (%s); install Debian's "
              "PyTorch with `apt-get install python3-torch`" % error, file=sys.stderr)
        return 3
    backend = "gloo" if args.config == "ddp-gloo" else "tessera"
    if backend == "tessera":
        try:
            import tessera.torch  # noqa: F401  (registers the backend)
        except ImportError as error:
            print("torch_fsdp_bench.py: cannot import tessera.torch (%s); sys.path: %s"
                  % (error, sys.path), file=sys.stderr)
            return 3
    torch.set_num_threads(args.threads)
    F = torch.nn.functional
    timeout = datetime.timedelta(seconds=args.timeout_s)
    dist.init_process_group(backend, init_method="file://%s/store" % args.store_dir,
                            rank=args.rank, world_size=args.world, timeout=timeout)
    book = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None

    def slowest(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=book)
        return t.tolist()

    def per_rank(value):
        t = torch.zeros(args.world, dtype=torch.float64)
        t[args.rank] = value
        dist.all_reduce(t, group=book)
        return [int(v) for v in t.tolist()]

    block_class, gpt_class = make_model_classes(torch)
    warm_code(args, gpt_class, torch, dist, backend)
    generator = torch.Generator().manual_seed(args.seed + 1 + args.rank)  # own batches
    batches = []
    for _ in range(4):
        ids = torch.randint(0, args.vocab, (args.batch_size, args.seq + 1), generator=generator)
        batches.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    settle()
    base = status_bytes("VmRSS")

    torch.manual_seed(args.seed)  # the same initial weights on every rank and configuration
    meta = args.meta_init and not args.config.startswith("ddp-")
    model = gpt_class(args, device="meta" if meta else None)
    parameters = sum(p.numel() for p in model.parameters())
    # FSDP's units under the policy: one per block, and the root with the rest.
    unit_numels = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    unit_numels.append(parameters - sum(unit_numels))
    start = time.perf_counter()
    model, policy_source = wrap(args, model, block_class, torch, dist)
    wrap_s = time.perf_counter() - start
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    settle()
    after_wrap = status_bytes("VmRSS") - base
    peak_reset = reset_peak()
    if args.rank == 0:
        import tessera.torch as tessera_torch
        emit({"bench": "torch_fsdp_info", "torch_version": torch.__version__,
              "threads": torch.get_num_threads(), "world": args.world, "config": args.config,
              "tessera_package": getattr(tessera_torch, "__file__", ""),
              "tessera_channel": getattr(dist.group.WORLD, "channel", ""),
              "wrap_policy": policy_source, "peak_reset": peak_reset})

    saved = SavedActivations(torch, model)
    losses = []

    def step(index, measure=False):
        ids, targets = batches[index % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        if measure:
            with saved.hooks:
                logits = model(ids)
        else:
            logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        del logits
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    for i in range(args.warmup_steps):
        step(i, measure=(i == args.warmup_steps - 1))
    if args.warmup_steps == 0:
        step(0, measure=True)  # one untimed step measures the activations
    dist.barrier(group=book)
    times = []
    for i in range(args.steps):
        start = time.perf_counter()
        step(args.warmup_steps + i)
        times.append(time.perf_counter() - start)
    peak = status_bytes("VmHWM") - base
    times = slowest(times)
    peaks = per_rank(peak)
    activations = per_rank(saved.total())
    after_wrap = per_rank(after_wrap)
    if args.rank == 0:
        emit({"bench": "torch_fsdp", "config": args.config,
              "strategy": "DDP" if args.config.startswith("ddp-") else args.config,
              "backend": backend, "world": args.world, "parameters": parameters,
              "unit_numels": unit_numels, "dim": args.dim, "layers": args.layers,
              "heads": args.heads, "vocab": args.vocab, "seq": args.seq,
              "batch_size": args.batch_size, "steps": args.steps,
              "warmup_steps": args.warmup_steps, "step_s": statistics.median(times),
              "steps_s": times, "peak_bytes": max(peaks), "peak_bytes_per_rank": peaks,
              "activation_bytes": max(activations), "after_wrap_bytes": max(after_wrap),
              "peak_reset": peak_reset, "wrap_s": wrap_s, "rank0_losses": losses,
              "hybrid_shard_size": args.hybrid_shard_size
              if args.config == "HYBRID_SHARD" else None})
    sys.stdout.flush()
    sys.stderr.flush()
    # Exits here, before the model, DDP's reducer and the groups are released: a rank that
    # ran DDP over Gloo at 4 processes sometimes hung in those destructors (in C++, after
    # main's frame was gone) once the other ranks had exited. Every collective is done.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
