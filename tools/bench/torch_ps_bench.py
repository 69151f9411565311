"""The Python side of `tessera-bench ps` (tools/bench/ps_bench.h): starts a fleet of one
server (tessera-launch --servers 1 --workers 0), then on it, as one worker:

  1. push+pull of a --bytes model through tessera.torch.ParameterServerOptimizer (ps-async,
     SGD with lr 0): step() times, as tessera-worker --mode bench-ps times PsEngine steps;
  2. the 784-1024-1024-10 MLP at --batch-size, SGD: --mlp-steps steps trained alone with
     torch.optim.SGD, then the same model and batches with ParameterServerOptimizer in
     ps-sync (a new job on the same fleet); median step times.

Prints {"bench":"ps_python",...} and {"bench":"ps_mlp",...} lines on stdout.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

import torch

import tessera.torch


def start_fleet(launcher, key_dir):
    # The fleet and this process share a job key, as a user's script and fleet would.
    key_file = os.path.join(key_dir, "job.key")
    subprocess.run([launcher, "--make-key-file", key_file], check=True, stdout=subprocess.DEVNULL)
    os.environ["TESSERA_AUTH_KEY_FILE"] = key_file
    process = subprocess.Popen([launcher, "--servers", "1", "--workers", "0", "--log-level",
                                "warning", "--auth-key-file", key_file], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "coordinator address tcp://" in line:
            address = line.split("tcp://")[1].split()[0]
        if line.startswith("[launch] server 0 pid="):
            return process, address
    process.kill()
    raise RuntimeError("the fleet did not start:\n" + "".join(lines))


def timed_steps(step, warmup, iters, seconds):
    for _ in range(warmup):
        step()
    if iters == 0:
        start = time.perf_counter()
        step()
        once = time.perf_counter() - start
        iters = max(5, min(10000, int(seconds / once))) if once > 0 else 10000
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def push_pull(args, address):
    weight = torch.nn.Parameter(torch.zeros(args.bytes // 4))
    opt = tessera.torch.ParameterServerOptimizer(
        [("bench", weight)], "sgd", lr=0.0, mode="ps-async", coordinator=address, rank=0,
        world_size=1, chunk_elements=args.chunk_elements)
    weight.grad.fill_(1.0)
    times = timed_steps(opt.step, args.warmup, args.iters, args.seconds)
    opt.close()
    return {"bench": "ps_python", "bytes": args.bytes, "iters": len(times),
            "median_s": statistics.median(times), "min_s": min(times),
            "mean_s": sum(times) / len(times)}


def mlp(args, address):
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10))

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(args.batch_size, 784, generator=g),
                torch.randint(0, 10, (args.batch_size,), generator=g)) for _ in range(8)]

    def run(net, opt):
        index = [0]

        def step():
            x, y = batches[index[0] % len(batches)]
            index[0] += 1
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return statistics.median(timed_steps(step, 5, args.mlp_steps, 0))

    net = model()
    alone = run(net, torch.optim.SGD(net.parameters(), lr=0.01))
    net = model()
    opt = tessera.torch.ParameterServerOptimizer(net, "sgd", lr=0.01, mode="ps-sync",
                                                 coordinator=address, rank=0, world_size=1,
                                                 chunk_elements=args.chunk_elements)
    ps_sync = run(net, opt)
    opt.close()
    return {"bench": "ps_mlp", "batch_size": args.batch_size, "steps": args.mlp_steps,
            "threads": torch.get_num_threads(), "alone_s": alone, "ps_sync_s": ps_sync}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launcher", required=True, help="tessera-launch")
    parser.add_argument("--bytes", type=int, default=16 << 20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--chunk-elements", type=int, default=1 << 16)
    parser.add_argument("--mlp-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    key_dir = tempfile.mkdtemp(prefix="torch-ps-bench-")
    fleet, address = start_fleet(args.launcher, key_dir)
    try:
        print(json.dumps(push_pull(args, address)), flush=True)
        print(json.dumps(mlp(args, address)), flush=True)
    finally:
        fleet.send_signal(signal.SIGINT)
        try:
            fleet.wait(timeout=30)
        except subprocess.TimeoutExpired:
            fleet.kill()
        shutil.rmtree(key_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
