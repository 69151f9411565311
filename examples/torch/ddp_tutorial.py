"""PyTorch's "Getting Started with Distributed Data Parallel" tutorial on the tessera backend.

The programs are the tutorial's (https://pytorch.org/tutorials/intermediate/ddp_tutorial.html),
demo_basic and demo_checkpoint, started with torch.multiprocessing.spawn, with four changes:

  * `import tessera.torch` (which registers the backend) and init_process_group("tessera"); the
    ranks share the job key that import makes in this parent process (it exports
    TESSERA_AUTH_KEY_FILE, which the spawned ranks inherit), so nothing else changes;
  * CPU tensors and models: no .to(rank), no device_ids, map_location="cpu";
  * demo_basic trains for a few epochs over a small dataset through a DistributedSampler (each
    rank sees its own share of the samples), and both demos check that every rank ends with
    the same parameters.

    /usr/bin/python3 examples/torch/ddp_tutorial.py [--world-size 2] [--backend gloo]
        [--save-params PATH]

--backend gloo runs the same programs on Gloo (tests/torch/tutorial_test compares the two);
--save-params writes demo_basic's trained parameters (torch.save of the state dict, rank 0).

(tools/install_python.sh makes `import tessera.torch` work for /usr/bin/python3.) The port
for the rendezvous is MASTER_PORT when set, else a free one this program picks.
ddp_torchrun.py is the same demo_basic started by torchrun instead.
"""

import argparse
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import tessera.torch  # registers the "tessera" backend


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")  # the parent sets a free one (main below)
    # initialize the process group
    dist.init_process_group(os.environ.get("DDP_TUTORIAL_BACKEND", "tessera"), rank=rank,
                            world_size=world_size)


def cleanup():
    dist.destroy_process_group()


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


# The tensors this process gave to its checks' collectives, held until it exits. Torch 1.13's
# Gloo releases a finished collective's tensors on its worker thread, which must take the GIL
# to free a tensor Python made; when that is the last reference while the main thread, holding
# the GIL, waits in ProcessGroupGloo's destructor for the same thread, neither moves
# (pytorch/pytorch#56297): the Gloo run of this program hung at exit 4 times in 10 on a busy
# machine. Held here, the worker's release frees nothing. (DDP's own buckets are not Python's.)
_given_to_collectives = []


def same_on_every_rank(model):
    """Whether every rank holds exactly the parameters this rank holds (an all_gather)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    _given_to_collectives.extend([flat] + gathered)
    dist.all_gather(gathered, flat)
    return all(torch.equal(flat, other) for other in gathered)


def demo_basic(rank, world_size, save_params=None, epochs=3):
    print(f"Running basic DDP example on rank {rank}.", flush=True)
    setup(rank, world_size)

    # create model and wrap it in DDP (on CPU: no device_ids)
    torch.manual_seed(rank)  # each rank starts elsewhere: DDP broadcasts rank 0's parameters
    model = ToyModel()
    ddp_model = DDP(model)

    dataset = toy_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.05)

    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        total = torch.zeros(2)  # summed loss, samples
        for inputs, labels in loader:
            optimizer.zero_grad()
            outputs = ddp_model(inputs)
            loss = loss_fn(outputs, labels)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(inputs), len(inputs)])
        _given_to_collectives.append(total)
        dist.all_reduce(total)  # the epoch's mean loss over every rank's samples
        losses.append((total[0] / total[1]).item())

    same = same_on_every_rank(ddp_model)
    if rank == 0 and save_params:
        torch.save(model.state_dict(), save_params)
    if rank == 0:
        print(f"demo_basic: {world_size} ranks trained ToyModel on {len(dataset)} samples "
              f"({len(sampler)} per rank per epoch); mean loss by epoch: "
              + " -> ".join(f"{loss:.4f}" for loss in losses))
        print(f"demo_basic: parameters identical on every rank: {same}")
    cleanup()
    if not same or not losses[-1] < losses[0]:
        sys.exit(f"demo_basic on rank {rank}: ranks differ ({not same}) or the loss did not fall")


def demo_checkpoint(rank, world_size, checkpoint_dir):
    print(f"Running DDP checkpoint example on rank {rank}.", flush=True)
    setup(rank, world_size)

    model = ToyModel()
    ddp_model = DDP(model)

    CHECKPOINT_PATH = os.path.join(checkpoint_dir, "model.checkpoint")
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly (on CPU: everything to the CPU)
    map_location = "cpu"
    ddp_model.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location))
    loaded = same_on_every_rank(ddp_model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    torch.manual_seed(100 + rank)  # each rank's own batch
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)

    loss_fn(outputs, labels).backward()
    optimizer.step()
    trained = same_on_every_rank(ddp_model)

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.

    if rank == 0:
        os.remove(CHECKPOINT_PATH)
        print(f"demo_checkpoint: rank 0 saved the model, {world_size} ranks loaded it after a "
              f"barrier; identical after loading: {loaded}, after a step: {trained}")
    cleanup()
    if not (loaded and trained):
        sys.exit(f"demo_checkpoint on rank {rank}: ranks differ")


def run_demo(demo_fn, world_size, *args):
    mp.spawn(demo_fn,
             args=(world_size,) + args,
             nprocs=world_size,
             join=True)


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", choices=["tessera", "gloo"], default="tessera")
    parser.add_argument("--save-params", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # The spawned ranks inherit the environment: the job key (TESSERA_AUTH_KEY_FILE, which
    # `import tessera.torch` made above unless one was given), the backend, and MASTER_PORT as
    # given, else a free port for each demo (each is a process group of its own).
    os.environ["DDP_TUTORIAL_BACKEND"] = args.backend
    given_port = os.environ.get("MASTER_PORT")
    os.environ["MASTER_PORT"] = given_port or str(free_port())
    run_demo(demo_basic, args.world_size, args.save_params)
    os.environ["MASTER_PORT"] = given_port or str(free_port())
    with tempfile.TemporaryDirectory() as checkpoint_dir:
        run_demo(demo_checkpoint, args.world_size, checkpoint_dir)
    print(f"ddp_tutorial: both demos passed on the {args.backend} backend with "
          f"{args.world_size} ranks")


if __name__ == "__main__":
    main()
