"""PyTorch's DDP tutorial, "Initialize DDP with torch.distributed.run/torchrun", on the tessera
backend: the same demo_basic as ddp_tutorial.py, but torchrun starts the ranks and hands each
its place in the environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which
init_process_group reads (init_method="env://", the default).

    tessera-launch --make-key-file /tmp/job.key     # once: the ranks' shared job key
    TESSERA_AUTH_KEY_FILE=/tmp/job.key /usr/bin/python3 -m torch.distributed.run --standalone \\
        --nproc_per_node 2 --redirects 2 --tee 1 examples/torch/ddp_torchrun.py

(`--redirects 2 --tee 1`: Debian's torchrun of torch 1.13 on Python 3.11 fails with its default
redirect flags. `--standalone` runs its rendezvous on port 29400; to run two jobs at once give
each its own, or `--rdzv_backend c10d --rdzv_endpoint localhost:0` for any free one.)
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import tessera.torch  # noqa: F401  (registers the "tessera" backend)


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def toy_dataset(samples=64):
    """The same small regression problem on every rank (a fixed seed)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 10, generator=g)
    y = x[:, :5] * 2.0 - x[:, 5:] + 0.1 * torch.randn(samples, 5, generator=g)
    return TensorDataset(x, y)


def demo_basic(epochs=3):
    dist.init_process_group("tessera")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])  # the rank on this host (a GPU's index, with GPUs)
    print(f"Start running basic DDP example on rank {rank} (local rank {local_rank} of "
          f"{os.environ['LOCAL_WORLD_SIZE']}, world size {world_size}).")

    # create model and wrap it in DDP (on CPU: no device_ids)
    torch.manual_seed(rank)  # each rank starts elsewhere: DDP broadcasts rank 0's parameters
    model = ToyModel()
    ddp_model = DDP(model)

    dataset = toy_dataset()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # rank, world size: the group's
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.05)

    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)  # summed loss, samples
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(inputs), labels)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(inputs), len(inputs)])
        dist.all_reduce(total)  # the epoch's mean loss over every rank's samples
        losses.append((total[0] / total[1]).item())

    # Every rank must hold rank 0's parameters: compare with a broadcast of them.
    flat = torch.cat([p.detach().reshape(-1) for p in ddp_model.parameters()])
    rank0 = flat.clone()
    dist.broadcast(rank0, src=0)
    same = torch.equal(flat, rank0)
    agree = torch.tensor([int(same)])
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)

    if rank == 0:
        print(f"ddp_torchrun: {world_size} ranks trained ToyModel on {len(dataset)} samples "
              f"({len(sampler)} per rank per epoch); mean loss by epoch: "
              + " -> ".join(f"{loss:.4f}" for loss in losses))
        print(f"ddp_torchrun: parameters identical on every rank: {bool(agree.item())}")
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")
    if not agree.item() or not losses[-1] < losses[0]:
        sys.exit(f"rank {rank}: the ranks' parameters differ or the loss did not fall")


if __name__ == "__main__":
    torch.set_num_threads(1)
    demo_basic()
