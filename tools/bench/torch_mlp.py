#!/usr/bin/python3
"""PyTorch's side of `tessera-bench train`: training throughput of an MLP on the CPU.

Trains nn.Sequential(Linear, ReLU, ..., Linear) with softmax cross-entropy, the architecture
of Tessera's `mlp` model (worker/nn/mlp.h), on random batches generated before the clock starts,
and prints one JSON line:

  {"samples_per_second": ..., "ms_per_step": ..., "steps": ..., "threads": ..., ...}

Only the step loop after the warm-up steps is timed: zero_grad, forward, loss, backward,
optimizer.step, and a read of the loss every step (as Tessera's trainer returns the loss every
step). Run it with Debian's /usr/bin/python3 and python3-torch; tessera-bench sets
OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE (spinning OpenMP workers would
take the cores OpenBLAS's threads need), and LD_LIBRARY_PATH so that libblas.so.3 is OpenBLAS
(see shared/notes/peers.md), and passes --threads for torch.set_num_threads.

With --world N > 1 this is rank --rank of N processes (tessera-bench starts them): a gloo
process group over a TCP store on 127.0.0.1:--port and the model wrapped in
torch.nn.parallel.DistributedDataParallel (gradients averaged by all-reduce in buckets during
backward); each rank has its own pool of batches, the ranks start the clock together after a
barrier, and rank 0 reports the samples of all ranks over the slowest rank's time.

Exit status 3 with a message on stderr when torch cannot be imported.
"""

import argparse
import json
import os
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", default="1024,1024", help="comma-separated hidden widths")
    parser.add_argument("--input-dim", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--lr", type=float, default=-1.0, help="< 0: sgd 0.01, adam 0.001")
    parser.add_argument("--steps", type=int, default=200, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pool", type=int, default=8, help="distinct pre-generated batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world", type=int, default=1, help="> 1: DistributedDataParallel")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=0, help="rank 0's TCP store (--world > 1)")
    return parser.parse_args()


def blas_library():
    """The BLAS and OpenBLAS shared objects this process has mapped, and OpenBLAS's core name."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if "blas" in name:
                paths.add(path)
    corename = ""
    for path in sorted(paths):
        if "openblas" in os.path.basename(path):
            try:
                import ctypes

                lib = ctypes.CDLL(path)
                lib.openblas_get_corename.restype = ctypes.c_char_p
                corename = lib.openblas_get_corename().decode()
            except (OSError, AttributeError):
                pass
    return sorted(paths), corename


def main():
    args = parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as error:
        print("torch_mlp.py: cannot import torch (%s); install Debian's PyTorch with "
              "`apt-get install python3-torch libopenblas0-pthread`" % error, file=sys.stderr)
        return 3
    hidden = [int(h) for h in args.hidden.split(",") if h]
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    layers = []
    width = args.input_dim
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, args.classes))
    model = torch.nn.Sequential(*layers)
    parameters = sum(p.numel() for p in model.parameters())
    if args.world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=args.rank, world_size=args.world)
        model = torch.nn.parallel.DistributedDataParallel(model)
        torch.manual_seed(args.seed + 1 + args.rank)  # each rank its own batches
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr if args.lr >= 0 else 0.01)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr if args.lr >= 0 else 0.001)

    batches = [(torch.randn(args.batch_size, args.input_dim),
                torch.randint(0, args.classes, (args.batch_size,)))
               for _ in range(max(1, args.pool))]

    def step(i):
        features, labels = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    for i in range(args.warmup_steps):
        step(i)
    loss = float("nan")
    if args.world > 1:
        dist.barrier()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup_steps + i)
    seconds = time.perf_counter() - start
    if args.world > 1:
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = slowest.item()
        dist.destroy_process_group()
        if args.rank != 0:
            return 0

    blas, corename = blas_library()
    print(json.dumps({
        "samples_per_second":
            args.world * args.batch_size * args.steps / seconds if seconds > 0 else 0.0,
        "world": args.world,
        "ms_per_step": 1000.0 * seconds / args.steps if args.steps > 0 else 0.0,
        "seconds": seconds,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "batch_size": args.batch_size,
        "optimizer": args.optimizer,
        "parameters": parameters,
        "final_loss": loss,
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "blas_libraries": blas,
        "openblas_core": corename,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
