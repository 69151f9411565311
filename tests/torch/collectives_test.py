"""torch.distributed's collectives on the tessera backend, checked against a reference computed
in Python from every rank's inputs."""

import unittest

import torch
import torch.distributed as dist

import torch_testing


def _all_reduce_sum(rank, world_size):
    t = torch.arange(10, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    return t


class AllReduceTest(unittest.TestCase):
    def test_sum_of_float32(self):
        for world_size in (1, 2, 3):
            with self.subTest(world_size=world_size):
                results = torch_testing.run_ranks(_all_reduce_sum, world_size)
                expected = sum(torch.arange(10, dtype=torch.float32) * (r + 1)
                               for r in range(world_size))
                for rank, got in enumerate(results):
                    self.assertTrue(torch.equal(got, expected), f"rank {rank}: {got}")


if __name__ == "__main__":
    torch_testing.main()
