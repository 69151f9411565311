"""tessera.torch.pipelining's failures in words (issue 46, item 4): a stage that dies (killed,
or raising mid-step) fails every rank of the pipeline at once naming it; a stage that hangs is
named by the ranks waiting for it when the process group's timeout passes (which stage, which
micro-batch, how long); stages that disagree on a shape in a later step fail both ranks within
1 s naming the pair, the micro-batch and both shapes; schedules that cannot run are refused at
their start (a zero-bubble schedule over FSDP units too: its W would lose their gradients).

Three ranks, one stage each, Schedule1F1B with 4 micro-batches: the trap is set in stage
`victim`'s forward of micro-batch 1 of the second step. Rank 0 never talks to stage 2: it learns
of it from the failure notices (tessera/torch/pipelining/failures.py).
"""

import os
import signal
import time
import unittest

import torch
import torch.nn as nn

import torch_testing

_WORLD = 3
_M = 4
_WIDTH = 4
_TRAP_AT = _M + 2  # the forwards with gradients: step 1's micro-batch 1


class _Trap(nn.Module):
    """A Linear whose `trap` ("kill", "raise" or "hang") goes off at its _TRAP_AT-th forward
    that keeps gradients, after writing the time to TESSERA_TEST_DIR/trap."""

    def __init__(self, trap, hang_s=0.0):
        super().__init__()
        self.linear = nn.Linear(_WIDTH, _WIDTH)
        self.trap = trap
        self.hang_s = hang_s
        self.forwards = 0

    def forward(self, x):
        if torch.is_grad_enabled():
            self.forwards += 1
        if self.trap and self.forwards == _TRAP_AT:
            path = os.path.join(os.environ["TESSERA_TEST_DIR"], "trap")
            with open(path + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(path + ".tmp", path)
            if self.trap == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.trap == "raise":
                raise ValueError("the trap went off")
            elif self.trap == "hang":
                time.sleep(self.hang_s)
        return self.linear(x)


def _trained(rank, world, victim, trap, hang_s=0.0):
    """Trains three steps; a survivor returns (its error's text, seconds from the trap to the
    error). The victim lets its own error propagate."""
    from tessera.torch import pipelining

    stage = pipelining.PipelineStage(_Trap(trap if rank == victim else None, hang_s), rank,
                                     world, "cpu")
    schedule = pipelining.Schedule1F1B(stage, _M, loss_fn=nn.MSELoss())
    try:
        for _ in range(3):
            if rank == 0:
                schedule.step(torch.randn(2 * _M, _WIDTH))
            elif rank == world - 1:
                schedule.step(target=torch.randn(2 * _M, _WIDTH))
            else:
                schedule.step()
    except Exception as e:  # noqa: BLE001  (what the test looks at)
        if rank == victim:
            raise
        failed_at = time.time()
        with open(os.path.join(os.environ["TESSERA_TEST_DIR"], "trap")) as f:
            return f"{type(e).__name__}: {e}", failed_at - float(f.read())
    return "no error", None


def _mesh_hang(rank, world, hang_s):
    """Two pipelines of 2 stages on a ("dp", "pp") = (2, 2) mesh; stage 1 of both hangs in
    micro-batch 1 of step 1. The pp groups are init_device_mesh's own (new_group)."""
    from tessera.torch import init_device_mesh, pipelining

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    pp = mesh.get_coordinate()[1]
    stage = pipelining.PipelineStage(_Trap("hang" if pp == 1 else None, hang_s), pp, 2, "cpu",
                                     group=mesh.get_group("pp"))
    schedule = pipelining.Schedule1F1B(stage, _M, loss_fn=nn.MSELoss())
    try:
        for _ in range(3):
            if pp == 0:
                schedule.step(torch.randn(2 * _M, _WIDTH))
            else:
                schedule.step(target=torch.randn(2 * _M, _WIDTH))
    except Exception as e:  # noqa: BLE001
        if pp == 1:
            raise
        failed_at = time.time()
        with open(os.path.join(os.environ["TESSERA_TEST_DIR"], "trap")) as f:
            return f"{type(e).__name__}: {e}", failed_at - float(f.read())
    return "no error", None


def _later_shapes(rank, world):
    """Stage 0's forward returns (2, 3) instead of (2, 4) from micro-batch 2 of step 1: both
    ranks fail; returns (error, seconds from the step's start)."""
    from tessera.torch import pipelining

    class Narrowing(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(_WIDTH, _WIDTH)
            self.forwards = 0

        def forward(self, x):
            self.forwards += torch.is_grad_enabled()
            y = self.linear(x)
            return y[:, :3] if self.forwards == _TRAP_AT + 1 else y

    part = Narrowing() if rank == 0 else nn.Linear(_WIDTH, _WIDTH)
    stage = pipelining.PipelineStage(part, rank, world, "cpu")
    schedule = pipelining.Schedule1F1B(stage, _M, loss_fn=nn.MSELoss())
    for step in range(2):
        started = time.monotonic()
        try:
            if rank == 0:
                schedule.step(torch.randn(2 * _M, _WIDTH))
            else:
                schedule.step(target=torch.randn(2 * _M, _WIDTH))
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}", time.monotonic() - started
    return "no error", None


def _message(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def _refusals(rank, world):
    """Schedules and pipelines that cannot run, refused before any message."""
    from tessera.torch import pipelining
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP

    stage = pipelining.PipelineStage(nn.Linear(_WIDTH, _WIDTH), rank, world, "cpu")
    two_children = nn.Sequential(nn.Linear(_WIDTH, _WIDTH), nn.ReLU())
    pipe = pipelining.pipeline(two_children, (torch.randn(2, _WIDTH),),
                               split_spec={"1": pipelining.SplitPoint.BEGINNING})
    return {
        "1f1b": _message(lambda: pipelining.Schedule1F1B(stage, 2, loss_fn=nn.MSELoss())),
        "zb-h1": _message(lambda: pipelining.ScheduleZBH1(stage, 2, loss_fn=nn.MSELoss())),
        "interleaved": _message(lambda: pipelining.ScheduleInterleaved1F1B(
            [pipelining.PipelineStage(nn.Linear(_WIDTH, _WIDTH), rank + k * world, 2 * world,
                                      "cpu") for k in range(2)], 4)),
        "stage of a 2-stage pipe": _message(lambda: pipe.build_stage(rank, "cpu")),
        "zb-h1 over fsdp": _message(lambda: pipelining.ScheduleZBH1(
            pipelining.PipelineStage(FSDP(nn.Linear(_WIDTH, _WIDTH)), rank, world, "cpu"), 4,
            loss_fn=nn.MSELoss())),
    }


class PipelineFailuresTest(unittest.TestCase):
    def _survivors(self, victim, trap, timeout_s, hang_s=0.0):
        failure = torch_testing.run_ranks(_trained, _WORLD, args=(victim, trap, hang_s),
                                          timeout_s=timeout_s, return_errors=True)
        self.assertIsInstance(failure, torch_testing.RankFailure, f"no rank failed: {failure}")
        self.assertEqual(set(failure.errors), {victim}, str(failure))
        results = dict(failure.results)
        for rank, (message, seconds) in sorted(results.items()):
            print(f"rank {rank}: {seconds:.2f} s after the trap: {message}")
            self.assertIsNotNone(seconds, f"rank {rank} finished without an error")
        return failure.errors[victim], results

    def test_a_killed_stage_is_named_by_every_rank_at_once(self):
        # A 30 s timeout: the survivors must not wait for it.
        error, results = self._survivors(2, "kill", 30)
        self.assertIn("exited with code -9", error)
        for rank, (message, seconds) in results.items():
            self.assertIn("PipelineFailure", message, f"rank {rank}")
            self.assertRegex(message, r"stage 2 \(rank 2\) is dead: its process \(pid \d+ on "
                                      r"this host\) has exited", f"rank {rank}")
            self.assertLess(seconds, 3.0, f"rank {rank}: {message}")

    def test_a_stage_raising_mid_step_is_named_by_every_rank_at_once(self):
        error, results = self._survivors(1, "raise", 30)
        self.assertIn("ValueError: the trap went off", error)
        for rank, (message, seconds) in results.items():
            self.assertIn("stage 1 (rank 1) failed in its forward of micro-batch 1: "
                          "ValueError: the trap went off", message, f"rank {rank}")
            self.assertLess(seconds, 1.0, f"rank {rank}: {message}")

    def test_a_hung_stage_is_named_when_the_timeout_passes(self):
        timeout_s = 4
        # Stage 1 sleeps in its forward past the others' deadline, then finds them gone.
        error, results = self._survivors(1, "hang", timeout_s, hang_s=timeout_s + 4)
        self.assertIn("tessera.torch.pipelining: stage 1 (rank 1) is too late: the other ranks "
                      "gave up waiting for it", error)
        waited_for = {0: "the gradient of micro-batch 0", 2: "the activation of micro-batch 1"}
        for rank, (message, seconds) in results.items():
            self.assertIn(f"stage {rank} (rank {rank}) waited {timeout_s}.", message)
            self.assertIn(f"s (the process group's timeout) for {waited_for[rank]} from stage 1 "
                          f"(rank 1), which sent nothing: its process", message)
            self.assertIn("on this host) is alive: it is stuck", message)
            # The timeout the user set, plus the grace in which the others' notices arrive.
            self.assertGreater(seconds, timeout_s - 1, f"rank {rank}: {message}")
            self.assertLess(seconds, timeout_s + 3, f"rank {rank}: {message}")

    def test_a_hung_stage_on_a_mesh_is_named_at_the_timeout_the_user_set(self):
        # init_device_mesh's groups take init_process_group's timeout (4 s), not new_group's
        # 30 minutes.
        timeout_s = 4
        failure = torch_testing.run_ranks(_mesh_hang, 4, args=(timeout_s + 4,),
                                          timeout_s=timeout_s, return_errors=True)
        self.assertIsInstance(failure, torch_testing.RankFailure, f"no rank failed: {failure}")
        self.assertEqual(set(failure.errors), {1, 3}, str(failure))
        for rank, (message, seconds) in sorted(failure.results.items()):
            print(f"rank {rank}: {seconds:.2f} s after the trap: {message}")
            self.assertIn(f"stage 0 (rank 0 of the pipeline group, world rank {rank}) waited "
                          f"{timeout_s}.", message)
            self.assertIn(f"from stage 1 (rank 1 of the pipeline group, world rank {rank + 1}),"
                          f" which sent nothing", message)
            self.assertLess(seconds, timeout_s + 3, f"rank {rank}: {message}")

    def test_shapes_that_change_in_a_later_step_fail_both_ranks_at_once(self):
        failure = torch_testing.run_ranks(_later_shapes, 2, timeout_s=30)
        for rank, (message, seconds) in enumerate(failure):
            self.assertIsNotNone(seconds, f"rank {rank}: {message}")
            for words in ("PipeliningShapeError" if rank == 0 else "PipelineFailure",
                          "stage 0 (rank 0) -> stage 1 (rank 1), micro-batch 2: stage 0's "
                          "forward returns shape (2, 3)", "stage 1 expects shape (2, 4)"):
                self.assertIn(words, message, f"rank {rank}")
            self.assertLess(seconds, 1.0, f"rank {rank}: {message}")

    def test_schedules_that_cannot_run_are_refused_at_their_start(self):
        for rank, r in enumerate(torch_testing.run_ranks(_refusals, _WORLD, timeout_s=30)):
            with self.subTest(rank=rank):
                for kind in ("1f1b", "zb-h1"):
                    self.assertIn("it needs at least as many micro-batches as ranks (2 < 3",
                                  r[kind])
                self.assertIn("ValueError: tessera.torch.pipelining: ScheduleInterleaved1F1B: ",
                              r["interleaved"])
                self.assertIn("a multiple", r["interleaved"])
                self.assertIn("ValueError: tessera.torch.pipelining: ScheduleZBH1: stage "
                              f"{rank}'s module '<root>' is a FullyShardedDataParallel unit, "
                              "which a zero-bubble schedule cannot split", r["zb-h1 over fsdp"])
                if rank < 2:
                    self.assertIn("2 stages over a group of 3 ranks: num_stages must be a "
                                  "multiple of the group's size", r["stage of a 2-stage pipe"])
                else:
                    self.assertIn("Pipe: stage 2 is not in 0 .. 1: pipeline() cut the model "
                                  "into 2 stage(s)", r["stage of a 2-stage pipe"])


if __name__ == "__main__":
    torch_testing.main()
