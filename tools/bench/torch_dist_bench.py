#!/usr/bin/python3
"""One rank of `tessera-bench torch`: torch.distributed on backends gloo and tessera, side by side.

tessera-bench starts --world of these (each with --rank) per run; they meet through a file
store in --store-dir (no port is chosen). Every rank joins a default gloo group (for the
bench's own bookkeeping: the max over ranks) and, for what is measured, one new group per
backend in --backends: gloo and tessera live in the same processes, so the two are measured
alternately on the same machine state, with the same code and the same timing.

--mode collectives: per op (all_reduce, all_gather, broadcast) and size (bytes of the float32
tensor each rank passes; all_gather's output is world x that), for each backend in turn (the
order flips from one (op, size) to the next): --warmup untimed calls, each after a barrier,
whose median time (barrier and op, max over the ranks) sets the timed iterations (--iters, or
as many as fit in --seconds, 5 to 10000); each timed iteration is a barrier of that backend's
group and then the op, timed with perf_counter; an iteration's time is the max over the
ranks, and rank 0 prints per (op, size, backend) one line
  {"bench":"torch_collective","op":...,"bytes":B,"world":W,"backend":...,"iters":K,
   "median_s":...,"min_s":...,"mean_s":...}

--mode train: per model (mlp: 784-1024-1024-10; cnn: two 3x3 convolutions with max-pooling
and two linear layers on 1x28x28 input), SGD (lr 0.01) with softmax cross-entropy on a pool of
8 synthetic batches per rank made before the clock starts; each step is zero_grad, forward,
loss, backward, optimizer.step and loss.item(). With --world > 1 the model is wrapped once per
backend in DistributedDataParallel over that backend's group (same initial weights), and the
--repeats runs alternate the backends (the first backend flips per repeat); a run is
--warmup-steps untimed steps, a barrier, then --steps timed steps; its samples/s is the samples
of all ranks over the slowest rank's time, and its CPU time per step (this process's, every
thread's; the busiest rank's) tells computing from waiting. The single-process reference is the
same loop with no process group and no DDP: with --single, rank 0 runs it alone after each
repeat's DDP runs while the other ranks sleep in a barrier (so it sees the same machine state);
with --world 1, in a process of its own. Rank 0 prints per (model, backend)
  {"bench":"torch_train","model":...,"world":W,"backend":...|"none","samples_per_second":
   median,"runs_samples_per_second":[...],"ms_per_step":...,"cpu_ms_per_step":...,...}

Rank 0 also prints first {"bench":"torch_info",...}: torch's version, threads, and
the tessera group's ring channel. Run with Debian's /usr/bin/python3; tessera-bench puts the
built package `tessera` on PYTHONPATH. Exit status 3 when torch or tessera.torch cannot be
imported (the message on stderr says which).
"""

import argparse
import datetime
import json
import statistics
import sys
import time

OPS = ("all_reduce", "all_gather", "broadcast")
MODELS = ("mlp", "cnn")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["collectives", "train"], required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--store-dir", default="", help="directory of the file store (world > 1)")
    parser.add_argument("--backends", default="gloo,tessera", help="comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="process groups' timeout")
    # collectives
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default="4096", help="bytes per rank, comma-separated")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=0, help="0: as many as fit in --seconds")
    parser.add_argument("--seconds", type=float, default=0.25)
    # train
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--single", action="store_true",
                        help="world > 1: rank 0 also measures the single-process reference, "
                             "alone, after each repeat's DDP runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.backends = [b for b in args.backends.split(",") if b]
    args.ops = [o for o in args.ops.split(",") if o]
    args.models = [m for m in args.models.split(",") if m]
    for op in args.ops:
        if op not in OPS:
            parser.error("--ops: %r is not one of %s" % (op, ", ".join(OPS)))
    for model in args.models:
        if model not in MODELS:
            parser.error("--models: %r is not one of %s" % (model, ", ".join(MODELS)))
    return args


def emit(record):
    print(json.dumps(record), flush=True)


class Groups:
    """The default gloo group (bookkeeping) and one measured group per backend."""

    def __init__(self, args, dist):
        self.dist = dist
        timeout = datetime.timedelta(seconds=args.timeout_s)
        dist.init_process_group("gloo", init_method="file://%s/store" % args.store_dir,
                                rank=args.rank, world_size=args.world, timeout=timeout)
        self.by_backend = {}
        for backend in args.backends:
            self.by_backend[backend] = dist.new_group(backend=backend, timeout=timeout)

    def slowest(self, values):
        """Per element, the max over the ranks (through the default group)."""
        import torch

        t = torch.tensor(values, dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()


def info(args, torch, groups=None):
    record = {"bench": "torch_info", "torch_version": torch.__version__,
              "threads": torch.get_num_threads(), "world": args.world, "mode": args.mode}
    if groups is not None and "tessera" in groups.by_backend:
        import tessera.torch

        record["tessera_package"] = tessera.torch.__file__
        record["tessera_channel"] = getattr(groups.by_backend["tessera"], "channel", "")
    return record


# ---------------------------------------------------------------------------------------------
# Collectives

def make_op(op, nbytes, world, group, dist, torch):
    """A closure that runs `op` once on `group` with tensors of `nbytes` per rank."""
    count = nbytes // 4
    tensor = torch.zeros(count, dtype=torch.float32)  # sums of zeros stay zeros
    if op == "all_reduce":
        return lambda: dist.all_reduce(tensor, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(tensor, src=0, group=group)
    outputs = [torch.empty(count, dtype=torch.float32) for _ in range(world)]
    return lambda: dist.all_gather(outputs, tensor, group=group)


def time_collective(args, groups, group, run):
    dist = groups.dist
    warm = [0.0] * args.warmup
    for i in range(args.warmup):
        start = time.perf_counter()
        dist.barrier(group=group)
        run()
        warm[i] = time.perf_counter() - start
    # The median: a group's first call may set up connections or buffers.
    warm = statistics.median(groups.slowest(warm))
    iters = args.iters
    if iters == 0:
        iters = max(5, min(10000, int(args.seconds / warm))) if warm > 0 else 10000
    times = [0.0] * iters
    for i in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        run()
        times[i] = time.perf_counter() - start
    return groups.slowest(times)


def run_collectives(args, dist, torch):
    groups = Groups(args, dist)
    if args.rank == 0:
        emit(info(args, torch, groups))
    turn = 0
    for op in args.ops:
        for item in args.sizes.split(","):
            nbytes = int(item)
            order = args.backends if turn % 2 == 0 else list(reversed(args.backends))
            turn += 1
            for backend in order:
                group = groups.by_backend[backend]
                run = make_op(op, nbytes, args.world, group, dist, torch)
                times = time_collective(args, groups, group, run)
                del run
                if args.rank == 0:
                    emit({"bench": "torch_collective", "op": op, "bytes": nbytes,
                          "world": args.world, "backend": backend, "iters": len(times),
                          "median_s": statistics.median(times), "min_s": min(times),
                          "mean_s": sum(times) / len(times)})
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Training

def make_model(name, torch):
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 32 x 14 x 14
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 64 x 7 x 7
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


class Trainer:
    """One model (DDP over `group` when given), its optimizer and its batches."""

    def __init__(self, args, name, torch, group=None):
        import torch.nn.functional as F

        self.F = F
        torch.manual_seed(args.seed)  # the same initial weights on every rank and backend
        model = make_model(name, torch)
        self.parameters = sum(p.numel() for p in model.parameters())
        if group is not None:
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        generator = torch.Generator().manual_seed(args.seed + 1 + args.rank)  # own batches
        self.batches = [(torch.randn(args.batch_size, 1, 28, 28, generator=generator),
                         torch.randint(0, 10, (args.batch_size,), generator=generator))
                        for _ in range(8)]
        self.step_index = 0

    def step(self):
        features, labels = self.batches[self.step_index % len(self.batches)]
        self.step_index += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.F.cross_entropy(self.model(features), labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def timed_run(args, trainer, barrier):
    """(wall seconds, CPU seconds of this process, all its threads) of --steps steps."""
    for _ in range(args.warmup_steps):
        trainer.step()
    barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        trainer.step()
    return time.perf_counter() - start, time.process_time() - cpu_start


def report_train(args, model, backend, parameters, runs, world):
    """runs: (wall seconds of the slowest rank, CPU seconds of the busiest rank) per run."""
    seconds = [wall for wall, _ in runs]
    rates = [world * args.batch_size * args.steps / s for s in seconds]
    emit({"bench": "torch_train", "model": model, "world": world, "backend": backend,
          "batch_size": args.batch_size, "steps": args.steps, "repeats": len(rates),
          "samples_per_second": statistics.median(rates), "runs_samples_per_second": rates,
          "ms_per_step": 1000.0 * statistics.median(seconds) / args.steps,
          "cpu_ms_per_step": 1000.0 * statistics.median(cpu for _, cpu in runs) / args.steps,
          "parameters": parameters})


def run_train(args, dist, torch):
    if args.world == 1:
        if args.rank == 0:
            emit(info(args, torch))
        for name in args.models:
            trainer = Trainer(args, name, torch)
            runs = [timed_run(args, trainer, lambda: None) for _ in range(args.repeats)]
            report_train(args, name, "none", trainer.parameters, runs, 1)
        return
    groups = Groups(args, dist)
    if args.rank == 0:
        emit(info(args, torch, groups))
    for name in args.models:
        trainers = {b: Trainer(args, name, torch, groups.by_backend[b]) for b in args.backends}
        runs = {b: [] for b in args.backends}
        single = Trainer(args, name, torch) if args.single and args.rank == 0 else None
        single_runs = []
        for repeat in range(args.repeats):
            order = args.backends if repeat % 2 == 0 else list(reversed(args.backends))
            for backend in order:
                group = groups.by_backend[backend]
                run = timed_run(args, trainers[backend], lambda: dist.barrier(group=group))
                runs[backend].append(tuple(groups.slowest(list(run))))
            if args.single:
                # The single-process reference between the same runs: rank 0 alone trains
                # without DDP while the others block in the barrier (their threads sleep).
                if single is not None:
                    single_runs.append(timed_run(args, single, lambda: None))
                dist.barrier()
        if args.rank == 0:
            for backend in args.backends:
                report_train(args, name, backend, trainers[backend].parameters, runs[backend],
                             args.world)
            if single is not None:
                report_train(args, name, "none", single.parameters, single_runs, 1)
        del trainers, single
    dist.destroy_process_group()


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print("torch_dist_bench.py: cannot import torch.distributed (%s); install Debian's "
              "PyTorch with `apt-get install python3-torch`" % error, file=sys.stderr)
        return 3
    if "tessera" in args.backends:
        try:
            import tessera.torch  # noqa: F401  (registers the backend)
        except ImportError as error:
            print("torch_dist_bench.py: cannot import tessera.torch (%s); sys.path: %s"
                  % (error, sys.path), file=sys.stderr)
            return 3
    torch.set_num_threads(args.threads)
    if args.mode == "collectives":
        run_collectives(args, dist, torch)
    else:
        run_train(args, dist, torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
