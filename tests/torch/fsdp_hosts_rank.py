"""One rank of tests/torch_hosts_test.cc: HYBRID_SHARD across hosts emulated with network
namespaces (issue 44).

    fsdp_hosts_rank.py --rank R --world-size 4 --store PATH --result PATH [--timeout-s 60]
        [--tcp-store-host HOST]

Joins the tessera default group through a file store at PATH (a directory both hosts see: only
/dev/shm is private to a host), or with --tcp-store-host through torch's TCPStore at HOST, on a
port rank 0 gets from the OS and writes to PATH for the others; makes the hybrid groups by
hostname (hybrid_groups() without a shard size: each emulated host has a name of its own) and a
Gloo group of the world, and trains
fsdp_test's transformer (transformer_auto_wrap_policy) with HYBRID_SHARD and
_HYBRID_SHARD_ZERO2 against DDP over Gloo: same seed, 20 steps of SGD with momentum and weight
decay. Writes a JSON object to --result: this rank's hostname, the world ranks of its shard and
replicate groups (as the groups' own all-gathers tell them) and, per strategy, the largest
error of a parameter relative to its tensor's scale. Any failure is an exception: a non-zero
exit with its traceback on stderr.
"""

import argparse
import datetime
import json
import os
import socket
import time

import torch
import torch.distributed as dist

import fsdp_test
import tessera.torch  # noqa: F401  (registers the backend)


def _members(group):
    """The world ranks of `group`'s members, in group rank order, by an all-gather over it."""
    mine = torch.tensor([float(dist.get_rank())])
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return [int(t.item()) for t in gathered]


def _write_atomically(path, text):
    """Written whole under another name, then renamed: a reader never sees half a file."""
    partial = path + ".partial"
    with open(partial, "w") as f:
        f.write(text)
    os.rename(partial, path)


def _tcp_store(host, port_file, rank, world_size, timeout):
    """torch's TCPStore at `host`: rank 0 serves it on a port the OS picks and writes the port
    to `port_file`, which the other ranks wait for (within `timeout`)."""
    if rank == 0:
        store = dist.TCPStore(host, 0, world_size, True, timeout, wait_for_workers=False)
        _write_atomically(port_file, str(store.port))
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while not os.path.exists(port_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 wrote no TCPStore port to {port_file} "
                               f"within {timeout.total_seconds()} s")
        time.sleep(0.05)
    with open(port_file) as f:
        port = int(f.read())
    return dist.TCPStore(host, port, world_size, False, timeout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--store", required=True, help="the file store's path")
    parser.add_argument("--result", required=True, help="where to write the JSON result")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="every group's timeout (a peer that stops is an error then)")
    parser.add_argument("--tcp-store-host", default="",
                        help="meet through torch's TCPStore there (--store: its port's file)")
    args = parser.parse_args()

    from tessera.torch import hybrid_groups
    from tessera.torch.fsdp import ShardingStrategy

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    if args.tcp_store_host:
        store = _tcp_store(args.tcp_store_host, args.store, args.rank, args.world_size, timeout)
        dist.init_process_group("tessera", store=store, rank=args.rank,
                                world_size=args.world_size, timeout=timeout)
    else:
        dist.init_process_group("tessera", init_method=f"file://{args.store}", rank=args.rank,
                                world_size=args.world_size, timeout=timeout)
    # DDP's group: Gloo over eth0 (GLOO_SOCKET_IFNAME, set by the test).
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    shard, replicate = hybrid_groups()
    result = {"rank": args.rank, "hostname": socket.gethostname(),
              "shard group": _members(shard), "replicate group": _members(replicate)}
    for strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        kwargs = dict(sharding_strategy=ShardingStrategy[strategy],
                      process_group=(shard, replicate))
        result[f"transformer {strategy}"] = fsdp_test._compare(args.rank, "transformer",
                                                               kwargs, gloo)[0]
    dist.barrier()
    dist.destroy_process_group()
    _write_atomically(args.result, json.dumps(result))
    print(f"rank {args.rank} on {result['hostname']}: {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
