"""Ways to start a tessera process group: env://, tcp://, file://, a TCPStore passed as store=,
and plain processes (python3 -c, not multiprocessing) configured by environment variables."""

import datetime
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch
import torch.distributed as dist

import torch_testing

TIMEOUT = datetime.timedelta(seconds=60)


def _free_port():
    """A port the OS just gave out (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _use_group(rank, world):
    """A few operations that prove the group works; the results."""
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    outs = [None] * world
    dist.all_gather_object(outs, ("rank", rank))
    backend = dist.get_backend()
    dist.barrier()
    dist.destroy_process_group()
    return t.tolist(), outs, backend


def _init_with(rank, world, init_method):
    import tessera.torch  # noqa: F401
    dist.init_process_group("tessera", init_method=init_method, rank=rank, world_size=world,
                            timeout=TIMEOUT)
    return _use_group(rank, world)


def _init_env(rank, world):
    import tessera.torch  # noqa: F401
    # MASTER_ADDR and MASTER_PORT come from run_ranks's env; rank and world size from here.
    dist.init_process_group("tessera", init_method="env://", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    return _use_group(rank, world)


def _init_tcp_store(rank, world):
    """Rank 0 serves a TCPStore on a port the OS picks and publishes it in a file."""
    import tessera.torch  # noqa: F401
    port_file = os.path.join(os.environ["TESSERA_TEST_DIR"], "port")
    if rank == 0:
        # Not waiting for the others: they learn the port only after this returns.
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=TIMEOUT,
                              wait_for_workers=False)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(store.port))
        os.rename(port_file + ".tmp", port_file)
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if time.monotonic() > deadline:
                raise TimeoutError("rank 0 never published its TCPStore's port")
            time.sleep(0.05)
        with open(port_file) as f:
            port = int(f.read())
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=TIMEOUT)
    dist.init_process_group("tessera", store=store, rank=rank, world_size=world,
                            timeout=TIMEOUT)
    return _use_group(rank, world)


_PLAIN_RANK = textwrap.dedent("""
    import torch, torch.distributed as dist
    import tessera.torch
    dist.init_process_group("tessera")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    obj = [None] * world
    dist.all_gather_object(obj, rank)
    print("RESULT", rank, world, t.tolist(), obj, flush=True)
    dist.destroy_process_group()
""")


class InitMethodsTest(unittest.TestCase):
    def _check(self, results, world):
        for rank, (total, objs, backend) in enumerate(results):
            self.assertEqual(total, [float(world * (world + 1) // 2)] * 3, f"rank {rank}")
            self.assertEqual(objs, [("rank", q) for q in range(world)], f"rank {rank}")
            self.assertEqual(backend, "tessera", f"rank {rank}")

    def test_env(self):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        self._check(torch_testing.run_ranks(_init_env, 3, init=False, env=env), 3)

    def test_tcp(self):
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self._check(torch_testing.run_ranks(_init_with, 2, init=False, args=(init_method,)), 2)

    def test_file(self):
        with tempfile.TemporaryDirectory() as directory:
            init_method = f"file://{directory}/store"
            self._check(torch_testing.run_ranks(_init_with, 3, init=False,
                                                args=(init_method,)), 3)

    def test_tcp_store_on_an_os_assigned_port(self):
        self._check(torch_testing.run_ranks(_init_tcp_store, 3, init=False), 3)

    def test_plain_processes(self):
        world = 3
        port = _free_port()
        processes = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            processes.append(subprocess.Popen([sys.executable, "-c", _PLAIN_RANK], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))
        outputs = []
        try:
            for p in processes:
                out, err = p.communicate(timeout=120)
                outputs.append((p.returncode, out, err))
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
        expected = [float(world * (world + 1) // 2)] * 4
        for rank, (code, out, err) in enumerate(outputs):
            self.assertEqual(code, 0, f"rank {rank} exited with {code}:\n{err}")
            self.assertIn(f"RESULT {rank} {world} {expected} {list(range(world))}", out,
                          f"rank {rank}:\n{out}\n{err}")


if __name__ == "__main__":
    torch_testing.main()
