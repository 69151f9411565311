#!/usr/bin/python3
"""One rank of `tessera-bench groups`: what dist.new_group() costs on one backend.

tessera-bench starts --world of these (each with --rank) per backend, one backend after the
other: unlike torch_dist_bench.py, a process holds groups of one backend only, so the
listening sockets, threads and memory it owns are that backend's alone. The ranks meet through
a file store in --store-dir (no port is chosen); the default group is of --backend.

1. Resources: after init_process_group and one all_reduce of the default group (its
   connections and threads are then up), each rank counts its listening TCP sockets (the
   LISTEN inodes of /proc/net/tcp{,6} among its /proc/self/fd), its threads (/proc/self/task)
   and its resident memory (VmRSS). Then --groups times: a barrier of the default group, then
   dist.new_group(all ranks) timed with perf_counter. Each new group is used by one all_reduce
   (8 floats), and the counts are taken again. A new_group's time is the max over the ranks;
   the added sockets, threads and KiB are the max over the ranks of (after - before).
2. Concurrency (--concurrent-iters > 0): the first two of those groups all-reduce
   --concurrent-bytes of float32, --concurrent-iters times each, from two Python threads at
   once (torch releases the GIL in the call), against the first group alone doing the same
   2 x --concurrent-iters all-reduces from one thread (after one untimed round of each). Each
   is timed from a barrier of the default group to the end of its last all-reduce, the
   slowest rank's time; --repeats pairs alternate which goes first, and the medians count.

Rank 0 prints one line:
  {"bench":"torch_groups","backend":...,"world":W,"groups":G,"new_group_ms":[per group],
   "sockets_before":...,"sockets_after":...,"threads_before":...,"threads_after":...,
   "rss_kib_before":...,"rss_kib_after":...,"added_sockets":...,"added_threads":...,
   "added_rss_kib":...,"concurrent_s":...,"single_s":...,...}
Run with Debian's /usr/bin/python3; tessera-bench puts the built package `tessera` on
PYTHONPATH. Exit status 3 when torch or tessera.torch cannot be imported.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--store-dir", required=True, help="directory of the file store")
    parser.add_argument("--backend", choices=["gloo", "tessera"], required=True)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--concurrent-bytes", type=int, default=1 << 20)
    parser.add_argument("--concurrent-iters", type=int, default=20, help="0: no concurrency")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="process groups' timeout")
    args = parser.parse_args()
    if args.concurrent_iters > 0 and args.groups < 2:
        parser.error("--concurrent-iters needs --groups of at least 2")
    return args


def listening_sockets():
    """How many listening TCP sockets this process holds (their inodes among its fds)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A":  # LISTEN
                        listening.add(fields[9])
        except OSError:
            continue  # no IPv6 in this kernel
    mine = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue  # closed since the listing
        if target.startswith("socket:[") and target[8:-1] in listening:
            mine += 1
    return mine


def threads():
    return len(os.listdir("/proc/self/task"))


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def resources():
    return {"sockets": listening_sockets(), "threads": threads(), "rss_kib": rss_kib()}


def slowest(dist, torch, values):
    """Per element, the max over the ranks (through the default group)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def timed_all_reduces(dist, torch, groups_and_tensors, iters):
    """Seconds from a barrier of the default group until every thread (one per group) has
    all-reduced its tensor `iters` times; the slowest rank's."""
    errors = []

    def run(group, tensor):
        try:
            for _ in range(iters):
                dist.all_reduce(tensor, group=group)
        except Exception as error:  # noqa: BLE001  (reported below, on the main thread)
            errors.append(error)

    dist.barrier()
    start = time.perf_counter()
    if len(groups_and_tensors) == 1:
        run(*groups_and_tensors[0])
    else:
        workers = [threading.Thread(target=run, args=pair) for pair in groups_and_tensors]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return slowest(dist, torch, [seconds])[0]


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print("torch_groups_bench.py: cannot import torch.distributed (%s); install Debian's "
              "PyTorch with `apt-get install python3-torch`" % error, file=sys.stderr)
        return 3
    if args.backend == "tessera":
        try:
            import tessera.torch  # noqa: F401  (registers the backend)
        except ImportError as error:
            print("torch_groups_bench.py: cannot import tessera.torch (%s); sys.path: %s"
                  % (error, sys.path), file=sys.stderr)
            return 3
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    dist.init_process_group(args.backend, init_method="file://%s/store" % args.store_dir,
                            rank=args.rank, world_size=args.world, timeout=timeout)
    world = list(range(args.world))
    # The default group's own op first: its connections and threads are up before counting.
    dist.all_reduce(torch.ones(8))
    before = resources()

    groups, new_group_s = [], []
    for _ in range(args.groups):
        dist.barrier()  # the ranks start each new_group together: its time is its own
        start = time.perf_counter()
        groups.append(dist.new_group(world, timeout=timeout))
        new_group_s.append(time.perf_counter() - start)
    for group in groups:
        t = torch.ones(8)
        dist.all_reduce(t, group=group)
        if t[0].item() != args.world:
            raise RuntimeError("rank %d: all_reduce on a new group gave %s" % (args.rank, t))
    after = resources()

    record = {"bench": "torch_groups", "backend": args.backend, "world": args.world,
              "groups": args.groups, "torch_version": torch.__version__}
    new_group_s = slowest(dist, torch, new_group_s)
    record["new_group_ms"] = [1000.0 * s for s in new_group_s]
    mine = [before["sockets"], after["sockets"], before["threads"], after["threads"],
            before["rss_kib"], after["rss_kib"]]
    added = [after[k] - before[k] for k in ("sockets", "threads", "rss_kib")]
    # Rank 0's absolute counts; the added ones the most any rank added.
    record.update(zip(["sockets_before", "sockets_after", "threads_before", "threads_after",
                       "rss_kib_before", "rss_kib_after"], mine))
    record.update(zip(["added_sockets", "added_threads", "added_rss_kib"],
                      [int(v) for v in slowest(dist, torch, added)]))

    if args.concurrent_iters > 0:
        count = args.concurrent_bytes // 4
        tensors = [torch.zeros(count, dtype=torch.float32) for _ in range(2)]  # zeros stay zeros
        # Untimed, once of each shape: the first use of this size (buffers, channels) and the
        # first time two groups run at once (the backend may start a thread for it).
        timed_all_reduces(dist, torch, list(zip(groups[:2], tensors)), 1)
        timed_all_reduces(dist, torch, [(groups[0], tensors[0])], 1)
        concurrent, single = [], []
        for repeat in range(args.repeats):
            runs = [("concurrent", lambda: timed_all_reduces(
                        dist, torch, list(zip(groups[:2], tensors)), args.concurrent_iters)),
                    ("single", lambda: timed_all_reduces(
                        dist, torch, [(groups[0], tensors[0])], 2 * args.concurrent_iters))]
            if repeat % 2:
                runs.reverse()
            for name, run in runs:
                (concurrent if name == "concurrent" else single).append(run())
        record.update({"concurrent_bytes": count * 4, "concurrent_iters": args.concurrent_iters,
                       "repeats": args.repeats, "concurrent_runs_s": concurrent,
                       "single_runs_s": single, "concurrent_s": statistics.median(concurrent),
                       "single_s": statistics.median(single)})
    if args.rank == 0:
        print(json.dumps(record), flush=True)
    for group in groups:
        dist.destroy_process_group(group)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
