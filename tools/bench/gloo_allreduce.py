#!/usr/bin/python3
"""Gloo's side of `tessera-bench allreduce`: one rank of torch.distributed (backend gloo).

tessera-bench starts WORLD of these, each with --rank; they meet over a TCP store on
127.0.0.1:--port (rank 0 listens). Per size the timing is that of Tessera's side
(worker/jobs/allreduce_bench_job.h): a zeroed float32 tensor; --warmup untimed dist.all_reduce
(sum) calls, whose mean time (max over the ranks) gives the timed iterations (--iters, or as
many as fit in --seconds, 5 to 10000); each timed iteration is dist.barrier() then
dist.all_reduce timed with perf_counter; the per-iteration times are max-reduced over the ranks
and rank 0 prints one JSON line per size:
  {"bench":"allreduce","system":"gloo","bytes":B,"ranks":W,"iters":K,"median_s":...,...}
Run with Debian's /usr/bin/python3 (python3-torch). Exit status 3 when torch cannot be imported.
"""

import argparse
import json
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sizes", required=True, help="bytes, comma-separated")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print("gloo_allreduce.py: cannot import torch (%s); install Debian's PyTorch with "
              "`apt-get install python3-torch`" % error, file=sys.stderr)
        return 3
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.world)
    for item in args.sizes.split(","):
        nbytes = int(item)
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32)
        start = time.perf_counter()
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        warm = torch.tensor([(time.perf_counter() - start) / args.warmup if args.warmup else 0.0],
                            dtype=torch.float64)
        dist.all_reduce(warm, op=dist.ReduceOp.MAX)
        iters = args.iters
        if iters == 0:
            iters = int(args.seconds / warm.item()) if warm.item() > 0 else 10000
            iters = max(5, min(10000, iters))
        times = torch.zeros(iters, dtype=torch.float64)
        for i in range(iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times[i] = time.perf_counter() - start
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if args.rank == 0:
            values = times.tolist()
            print(json.dumps({"bench": "allreduce", "system": "gloo", "bytes": nbytes,
                              "ranks": args.world, "iters": iters,
                              "median_s": statistics.median(values), "min_s": min(values),
                              "mean_s": sum(values) / len(values)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
