"""tessera.torch.fsdp's failures in words (issue 44, item 5): a rank that skips a unit's forward
or backward that the others run is named at the next collective, and one that stops running
them within the collective timeout, never a hang; NaN and Inf in the gradients follow
TESSERA_ON_NONFINITE (error, skip or off, as tessera-worker's --on-nonfinite).
"""

import os
import time
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_testing

WIDTH = 16


class _Stack(nn.Module):
    """Four equal blocks (same-sized units: their gathers would pair silently), of which
    `skip` (a block index) is not run."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(4))
        self.head = nn.Linear(WIDTH, 1)
        self.skip = None

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if i != self.skip:
                x = block(x)
        return self.head(x)


def _model(**kwargs):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    from tessera.torch.fsdp.wrap import ModuleWrapPolicy
    torch.manual_seed(0)
    return FSDP(_Stack(), auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}), **kwargs)


def _loss(model, rank, step, poison=False):
    g = torch.Generator().manual_seed(100 * rank + step)
    x, y = torch.randn(4, WIDTH, generator=g), torch.randn(4, 1, generator=g)
    if poison:
        x[0, 3] = float("nan")
    return F.mse_loss(model(x), y)


def _skip_forward(rank, world_size):
    """Rank 1 leaves out block 2 in the third step."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model.module.skip = 2 if rank == 1 and step == 2 else None
        optimizer.zero_grad()
        _loss(model, rank, step).backward()
        optimizer.step()


def _skip_backward(rank, world_size):
    """Rank 1 runs the second step's forward but not its backward."""
    model = _model()
    for step in range(3):
        loss = _loss(model, rank, step)
        if not (rank == 1 and step == 1):
            loss.backward()


def _stop(rank, world_size):
    """Rank 1 stops running collectives after one step; rank 0 goes on."""
    model = _model()
    steps = 1 if rank == 1 else 3
    for step in range(steps):
        _loss(model, rank, step).backward()
    if rank == 1:
        time.sleep(12)  # alive, silent: only rank 0's timeout (5 s) ends its wait


def _nonfinite(rank, world_size, policy):
    os.environ["TESSERA_ON_NONFINITE"] = policy
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = after = None
    for step in range(3):
        optimizer.zero_grad()
        _loss(model, rank, step, poison=rank == 0 and step == 1).backward()
        if step == 1:
            before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        if step == 1:
            after = [p.detach().clone() for p in model.parameters()]
    unchanged = all(torch.equal(a, b) for a, b in zip(before, after))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {"skipped": model.nonfinite_skipped_steps, "unchanged": unchanged, "finite": finite}


class FsdpFailuresTest(unittest.TestCase):
    def _failure(self, fn, *args, timeout_s=60):
        failure = torch_testing.run_ranks(fn, 2, args=args, timeout_s=timeout_s,
                                          return_errors=True)
        self.assertIsInstance(failure, torch_testing.RankFailure)
        return failure.errors

    def test_a_skipped_forward_is_named_on_every_rank(self):
        errors = self._failure(_skip_forward)
        self.assertIn("rank 0 ran unit 'blocks.2' forward all-gather (iteration 2) where rank 1 "
                      "ran unit 'blocks.3' forward all-gather (iteration 2)", errors[0])
        self.assertIn("rank 1 ran unit 'blocks.3' forward all-gather (iteration 2) where rank 0 "
                      "ran unit 'blocks.2' forward all-gather (iteration 2)", errors[1])
        for rank in (0, 1):
            self.assertIn("a rank skipped a unit", errors[rank])

    def test_a_skipped_backward_is_named_on_every_rank(self):
        errors = self._failure(_skip_backward)
        for rank, other in ((0, 1), (1, 0)):
            self.assertIn(f"where rank {other} ran unit", errors[rank])
        self.assertIn("rank 0 ran unit 'blocks.3' backward all-gather (iteration 1) where rank 1 "
                      "ran unit '<root>' forward all-gather (iteration 1)", errors[0])

    def test_a_rank_that_stops_is_named_within_the_timeout(self):
        started = time.monotonic()
        errors = self._failure(_stop, timeout_s=5)
        self.assertLess(time.monotonic() - started, 60)
        self.assertIn("tessera FSDP: rank 0: unit '<root>' forward all-gather (iteration 1)",
                      errors[0])
        self.assertIn("Timed out", errors[0])
        self.assertIn("no frame from worker 1", errors[0].split("Timed out", 1)[1])

    def test_nonfinite_gradients_stop_every_rank_by_default(self):
        errors = self._failure(_nonfinite, "error")
        for rank in (0, 1):
            self.assertIn("FloatingPointError", errors[rank])
            self.assertIn("TESSERA_ON_NONFINITE=skip drops such steps instead", errors[rank])
        text = errors[0] + errors[1]
        # The units are checked in the order they were reduced: the root (the head, whose
        # gradient backward makes first) first. The NaN is everywhere.
        self.assertRegex(text, r"the reduced gradient of 'head\.weight' \(element \d+ "
                               r"of 16\) in its shard is NaN")

    def test_nonfinite_gradients_skip_the_step_on_every_rank(self):
        results = torch_testing.run_ranks(_nonfinite, 2, args=("skip",))
        for rank in (0, 1):
            self.assertEqual(results[rank], {"skipped": 1, "unchanged": True, "finite": True})

    def test_nonfinite_off_checks_nothing(self):
        results = torch_testing.run_ranks(_nonfinite, 2, args=("off",))
        for rank in (0, 1):
            self.assertEqual(results[rank]["skipped"], 0)
            self.assertFalse(results[rank]["finite"])

    def test_a_bad_mmap_threshold_is_refused(self):
        from tessera.torch.fsdp import runtime
        os.environ["TESSERA_FSDP_MMAP_THRESHOLD"] = "lots"
        tuned, runtime._MALLOC_TUNED = runtime._MALLOC_TUNED, False
        try:
            with self.assertRaisesRegex(ValueError, "TESSERA_FSDP_MMAP_THRESHOLD='lots': a "
                                                    "number of bytes"):
                runtime.tune_malloc()
        finally:
            del os.environ["TESSERA_FSDP_MMAP_THRESHOLD"]
            runtime._MALLOC_TUNED = tuned

    def test_a_bad_policy_is_refused(self):
        from tessera.torch.fsdp import runtime
        os.environ["TESSERA_ON_NONFINITE"] = "ignore"
        try:
            with self.assertRaisesRegex(ValueError, "TESSERA_ON_NONFINITE='ignore': expected "
                                                    "error, skip or off"):
                runtime.nonfinite_policy()
        finally:
            del os.environ["TESSERA_ON_NONFINITE"]


if __name__ == "__main__":
    torch_testing.main()
