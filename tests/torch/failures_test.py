"""How the tessera backend fails: a rank killed mid-training, and ranks whose collectives
disagree (sizes, dtypes, the operation). Every surviving rank must raise a RuntimeError that
says what happened, within the group's timeout, instead of hanging.

Gloo (torch 1.13) in the same situations, with a 5 s timeout, for comparison: a killed peer
gives the survivors "Connection closed by peer [127.0.0.1]:PORT" or "Read error ...: Connection
reset by peer" within 0.02 s, naming an address, not a rank; mismatched sizes let the rank with
the smaller buffer return without an error (a wrong result) while the others fail with
"Connection closed by peer"; mismatched dtypes abort a rank (SIGABRT: gloo::EnforceNotMet
"op.preamble.length <= op.nbytes. 16 vs 8") and break the others' connections; mismatched ops
(SUM on some ranks, MAX on others) pass silently; all_reduce against broadcast waits out the
timeout ("Timed out waiting 5000ms for recv operation to complete").
"""

import os
import shutil
import signal
import tempfile
import time
import unittest

import torch
import torch.distributed as dist

import torch_testing

TIMEOUT_S = 8  # the group's timeout (init_process_group's `timeout`)


def _kill_mid_training(rank, world_size, victim, use_ddp):
    """Trains (DDP) or all_reduces for a few steps; at step 3 `victim` SIGKILLs itself. The
    others return (the error's text, seconds from the kill to the error)."""
    stamp = os.path.join(os.environ["TESSERA_TEST_DIR"], "killed_at")
    if use_ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(1000):
            if step == 3 and rank == victim:
                with open(stamp + ".tmp", "w") as f:
                    f.write(repr(time.time()))
                os.rename(stamp + ".tmp", stamp)
                os.kill(os.getpid(), signal.SIGKILL)
            if use_ddp:
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
            else:
                t = torch.ones(1000)
                dist.all_reduce(t)
        return ("finished", None)
    except RuntimeError as e:
        failed_at = time.time()
        with open(stamp) as f:
            killed_at = float(f.read())
        return (str(e), failed_at - killed_at)


def _disagree(rank, world_size, what):
    """Every rank calls one collective; rank 1's differs from the others' in `what`. A rank
    that raises first writes how long its collective took to TESSERA_TEST_DIR/rank-N.seconds
    (the whole run's time is mostly the ranks' start, which sanitizers slow down)."""
    odd = rank == 1
    started = time.monotonic()
    try:
        if what == "size":
            dist.all_reduce(torch.ones(10 if odd else 12))
        elif what == "dtype":
            dist.all_reduce(torch.ones(12, dtype=torch.float64 if odd else torch.float32))
        elif what == "reduce_op":
            dist.all_reduce(torch.ones(12), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
        elif what == "operation":
            if odd:
                dist.broadcast(torch.ones(12), src=0)
            else:
                dist.all_reduce(torch.ones(12))
    finally:
        with open(os.path.join(os.environ["TESSERA_TEST_DIR"], f"rank-{rank}.seconds"),
                  "w") as f:
            f.write(repr(time.monotonic() - started))
    return "no error"


class RankKilledTest(unittest.TestCase):
    def _check(self, use_ddp):
        world_size, victim = 3, 1
        started = time.monotonic()
        failure = torch_testing.run_ranks(_kill_mid_training, world_size, timeout_s=TIMEOUT_S,
                                          args=(victim, use_ddp), return_errors=True)
        elapsed = time.monotonic() - started
        self.assertIsInstance(failure, torch_testing.RankFailure, f"no rank failed: {failure}")
        self.assertEqual(set(failure.errors), {victim}, str(failure))
        self.assertIn("exited with code -9", failure.errors[victim])
        for rank in range(world_size):
            if rank == victim:
                continue
            message, seconds = failure.results[rank]
            print(f"rank {rank} ({'DDP' if use_ddp else 'all_reduce'}): {seconds:.2f} s after "
                  f"the kill: {message}")
            self.assertIsNotNone(seconds, f"rank {rank} finished without an error")
            self.assertLess(seconds, TIMEOUT_S + 2, f"rank {rank}: {message}")
            # Names the dead rank (as "rank 1" or "worker 1").
            self.assertRegex(message, rf"(rank|worker)[ =]{victim}\b", f"rank {rank}")
        print(f"whole run: {elapsed:.1f} s")

    def test_all_reduce_survivors_name_the_dead_rank(self):
        self._check(use_ddp=False)

    def test_ddp_survivors_name_the_dead_rank(self):
        self._check(use_ddp=True)


class DisagreementTest(unittest.TestCase):
    def _check(self, what, *patterns):
        directory = tempfile.mkdtemp(prefix="tessera-disagree-")
        try:
            failure = torch_testing.run_ranks(_disagree, 3, timeout_s=TIMEOUT_S, args=(what,),
                                              env={"TESSERA_TEST_DIR": directory},
                                              return_errors=True)
            self.assertIsInstance(failure, torch_testing.RankFailure,
                                  f"no rank failed: {failure}")
            self.assertEqual(set(failure.errors), {0, 1, 2}, str(failure))
            for rank, message in sorted(failure.errors.items()):
                with open(os.path.join(directory, f"rank-{rank}.seconds")) as f:
                    seconds = float(f.read())
                print(f"rank {rank} ({what}, failed after {seconds:.2f} s): {message}")
                self.assertTrue(message.startswith("RuntimeError: "), f"rank {rank}: {message}")
                self.assertNotIn("did not finish", message)
                for pattern in patterns:
                    self.assertRegex(message, pattern, f"rank {rank}")
                # Well before the timeout: the disagreement is seen, not waited out.
                self.assertLess(seconds, TIMEOUT_S / 2, f"rank {rank}: {message}")
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def test_sizes(self):
        self._check("size", r"\b10\b", r"\b12\b")

    def test_dtypes(self):
        self._check("dtype", r"float64", r"float32")

    def test_reduce_ops(self):
        self._check("reduce_op", r"(?i)max", r"(?i)sum")

    def test_operations(self):
        self._check("operation", r"(?i)broadcast", r"(?i)all_?reduce")


if __name__ == "__main__":
    torch_testing.main()
