"""tessera.torch.tensor_parallel and init_device_mesh (issue 46, item 3) train as one process does.

A seeded model of embeddings and MLP blocks (Linear colwise, GELU or ReLU, Linear rowwise) is
parallelized over T = 2 and 4 ranks, and so is one with LayerNorms in sequence parallelism
(the activations split on the sequence dim between the blocks); each rank also trains the same
seeded model alone on the same data (a copy taken before parallelize_module), and after STEPS
steps of SGD with momentum every parameter, gathered back from its shards, and every step's
loss agree within 1e-5 relative to the tensor's scale. On a (dp, tp) = (2, 2) mesh each dp
replica trains on half of the global batch, its gradients averaged over the dp group: the same
against one process on the global batch; and so with DDP (the sequence-parallel model) or FSDP
(both; torch's 2-D parallelism) on the dp dim instead. The meshes' groups are checked by
all-gathering the members' ranks, and bad inputs by their messages.
"""

import copy
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_testing

STEPS = 5
BATCH, SEQ = 4, 8
VOCAB, DIM, HIDDEN, CLASSES = 16, 8, 32, 12
TOLERANCE = 1e-5


class _Block(nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.activation = activation
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(self.activation(self.fc1(x)))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=3)
        self.position = nn.Embedding(SEQ, DIM)
        self.blocks = nn.Sequential(_Block(nn.GELU()), _Block(nn.ReLU()))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.position(torch.arange(tokens.size(1)))
        return self.head(self.blocks(x))


class _SpBlock(nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.activation = activation
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(self.activation(self.fc1(self.norm(x))))


class _SpModel(nn.Module):
    """For sequence parallelism: between the layers the activations are split on the sequence
    dim, the norms run on each rank's positions."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(_SpBlock(nn.GELU()), _SpBlock(nn.ReLU()))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)
        for m in self.modules():  # norms that are not ones and zeros
            if isinstance(m, nn.LayerNorm):
                nn.init.normal_(m.weight, 1.0, 0.2)
                nn.init.normal_(m.bias, 0.0, 0.2)

    def forward(self, tokens):
        return self.head(self.norm(self.blocks(self.embedding(tokens))))


def _plan(kind):
    from tessera.torch.tensor_parallel import (
        ColwiseParallel, Replicate, RowwiseParallel, SequenceParallel, Shard)
    if kind == "sp":
        return {"embedding": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "blocks.*.norm": SequenceParallel(),
                "blocks.*.fc1": ColwiseParallel(input_layouts=Shard(1)),
                "blocks.*.fc2": RowwiseParallel(output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    return {"embedding": RowwiseParallel(input_layouts=Replicate()),
            "position": ColwiseParallel(output_layouts=Replicate()),
            "blocks.*.fc1": ColwiseParallel(),
            "blocks.*.fc2": RowwiseParallel(),
            "head": ColwiseParallel(output_layouts=Replicate())}


# Which dim of each parameter the plans shard (None: replicated).
_SHARD_DIMS = {"embedding.weight": 0, "position.weight": 1, "head.weight": 0, "head.bias": 0,
               "norm.weight": None, "norm.bias": None}
for _i in range(2):
    _SHARD_DIMS.update({f"blocks.{_i}.fc1.weight": 0, f"blocks.{_i}.fc1.bias": 0,
                        f"blocks.{_i}.fc2.weight": 1, f"blocks.{_i}.fc2.bias": None,
                        f"blocks.{_i}.norm.weight": None, f"blocks.{_i}.norm.bias": None})


def _batch(step):
    generator = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(0, CLASSES, (BATCH, SEQ), generator=generator)
    return tokens, labels


def _loss(model, tokens, labels):
    return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())


def _gather(param, dim, group):
    if dim is None:
        return param.detach()
    parts = [torch.empty_like(param) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, param.detach().contiguous(), group=group)
    return torch.cat(parts, dim)


def _relative(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _train_and_compare(kind, tp_mesh, dp_mesh=None, wrap=None):
    """Trains the TP model (each replica along dp_mesh on its share of every batch, the
    gradients averaged over dp_mesh by hand, or by "ddp" or "fsdp" as `wrap` says) and the same
    model alone on the whole batch; returns the relative error of each parameter and loss,
    and the numbers of parameters."""
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    from tessera.torch.tensor_parallel import parallelize_module
    torch.manual_seed(0)
    model = _SpModel() if kind == "sp" else _Model()
    reference = copy.deepcopy(model)
    parallelize_module(model, tp_mesh, _plan(kind))
    dp_rank, dp_size = (dp_mesh.get_local_rank(), dp_mesh.size()) if dp_mesh else (0, 1)
    if wrap == "fsdp":
        # 2-D parallelism as in torch's tutorial: TP within, FSDP across (its flat shards are
        # cut from the TP shards).
        model = FSDP(model, device_mesh=dp_mesh)
    elif wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model, process_group=dp_mesh.get_group())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    rows = BATCH // dp_size
    errors = {}
    for step in range(STEPS):
        tokens, labels = _batch(step)
        optimizer.zero_grad()
        local = slice(dp_rank * rows, (dp_rank + 1) * rows)
        loss = _loss(model, tokens[local], labels[local])
        loss.backward()
        loss = loss.detach()
        if dp_mesh is not None:
            if wrap is None:
                for p in model.parameters():
                    dist.all_reduce(p.grad, group=dp_mesh.get_group())
                    p.grad /= dp_size
            dist.all_reduce(loss, group=dp_mesh.get_group())
            loss /= dp_size
        optimizer.step()
        reference_optimizer.zero_grad()
        expected = _loss(reference, tokens, labels)
        expected.backward()
        reference_optimizer.step()
        errors[f"loss step {step}"] = _relative(loss, expected.detach())
    tp_group = tp_mesh.get_group()
    full = dict(reference.named_parameters())
    # FSDP's state dict holds each of this rank's TP shards whole.
    local = (model.state_dict() if wrap == "fsdp" else dict(model.module.named_parameters())
             if wrap == "ddp" else dict(model.named_parameters()))
    for name, param in local.items():
        errors[name] = _relative(_gather(param, _SHARD_DIMS[name], tp_group), full[name].detach())
    errors["local parameters"] = sum(p.numel() for p in local.values())
    errors["full parameters"] = sum(p.numel() for p in reference.parameters())
    errors["replicated parameters"] = sum(p.numel() for n, p in reference.named_parameters()
                                          if _SHARD_DIMS[n] is None)
    return errors


def _tp_only(rank, world_size):
    from tessera.torch import init_device_mesh
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    return {kind: _train_and_compare(kind, mesh["tp"]) for kind in ("tp", "sp")}


def _message(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the test asserts on type and text)
        return f"{type(e).__name__}: {e}"
    return "no error"


def _bad_inputs(rank, world_size):
    """Each bad input's error text, at world size 2."""
    from tessera.torch import init_device_mesh
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    from tessera.torch.tensor_parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    group = mesh.get_group()
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 4), nn.Conv1d(2, 2, 1))
    row = parallelize_module(nn.Linear(4, 2), mesh, RowwiseParallel())
    # src_data_rank: the shards are cut from the group's rank 0's values (the default) or from
    # each rank's own (None); each rank's module is seeded differently.
    torch.manual_seed(10)
    rank_0s = nn.Linear(4, 4).weight.detach().clone()
    torch.manual_seed(10 + rank)
    own = nn.Linear(4, 4)
    own_weight = own.weight.detach().clone()
    from_rank_0 = parallelize_module(copy.deepcopy(own), mesh, ColwiseParallel())
    from_own = parallelize_module(own, mesh, ColwiseParallel(), src_data_rank=None)
    return {
        "from rank 0": torch.equal(_gather(from_rank_0.weight, 0, group), rank_0s),
        "from its own": torch.equal(from_own.weight, own_weight[2 * rank:2 * rank + 2]),
        "input not the rank's slice": _message(lambda: row(torch.ones(3, 4))),
        "colwise indivisible": _message(
            lambda: parallelize_module(model, mesh, {"0": ColwiseParallel()})),
        "rowwise indivisible": _message(
            lambda: parallelize_module(model, group, {"1": RowwiseParallel()})),
        "embedding indivisible": _message(
            lambda: parallelize_module(nn.Embedding(7, 4), mesh, RowwiseParallel())),
        "unsupported module": _message(
            lambda: parallelize_module(model, mesh, {"2": ColwiseParallel()})),
        "unknown submodule": _message(
            lambda: parallelize_module(model, mesh, {"blocks.*.fc1": ColwiseParallel()})),
        "use_local_output": _message(lambda: ColwiseParallel(use_local_output=False)),
        "twice": _message(lambda: [parallelize_module(model[0:1], mesh, {"0": s}) for s in
                                   (RowwiseParallel(), RowwiseParallel())]),
        "after FSDP": _message(lambda: parallelize_module(
            FSDP(nn.Sequential(nn.Linear(4, 4))), mesh, {"_fsdp_wrapped_module.0":
                                                         ColwiseParallel()})),
        "mesh of the wrong size": _message(lambda: init_device_mesh("cpu", (3,))),
        "mesh on cuda": _message(lambda: init_device_mesh("cuda", (2,))),
        "names of the wrong length": _message(
            lambda: init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp",))),
        "unknown dim name in slice": _message(lambda: mesh["dp"]),
        "unknown dim name in get_group": _message(lambda: mesh.get_group("dp")),
    }


def _mesh_2d(rank, world_size):
    """The (dp, tp) = (2, 2) mesh's groups and ranks, a 2-D mesh refused by
    parallelize_module, and DP x TP training against one process."""
    from tessera.torch import DeviceMesh, init_device_mesh
    from tessera.torch.tensor_parallel import ColwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    results = {"ndim": mesh.ndim, "size": mesh.size(), "size(0)": mesh.size(0),
               "rank": mesh.get_rank(), "mesh": mesh.mesh.tolist(),
               "coordinate": mesh.get_coordinate(),
               "groups": len(mesh.get_all_groups()),
               "whole slice is the mesh": mesh["dp", "tp"] is mesh,
               "is a DeviceMesh": isinstance(mesh["tp"], DeviceMesh)}
    for name in ("dp", "tp"):
        group = mesh.get_group(name)
        members = [None] * dist.get_world_size(group)
        dist.all_gather_object(members, rank, group=group)
        results[f"{name} members"] = members
        results[f"{name} local rank"] = mesh.get_local_rank(name)
        results[f"{name} rank in group"] = dist.get_rank(group)
        results[f"{name} sub-mesh"] = mesh[name].mesh.tolist()
        results[f"{name} sub-mesh group is the dim's"] = mesh[name].get_group() is group
    # A mesh of another layout: dim "b" runs down the rows of [[0, 2], [1, 3]].
    custom = DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("a", "b"))
    results["custom coordinate"] = custom.get_coordinate()
    for name in ("a", "b"):
        members = [None] * custom.size(name)
        dist.all_gather_object(members, rank, group=custom.get_group(name))
        results[f"custom {name} members"] = members
    results["get_group() of a 2-D mesh"] = _message(lambda: mesh.get_group())
    results["2-D mesh to parallelize_module"] = _message(
        lambda: parallelize_module(nn.Linear(4, 4), mesh, ColwiseParallel()))
    results["training"] = _train_and_compare("tp", mesh["tp"], mesh["dp"])
    results["ddp sp training"] = _train_and_compare("sp", mesh["tp"], mesh["dp"], "ddp")
    for kind in ("tp", "sp"):
        results[f"fsdp {kind} training"] = _train_and_compare(kind, mesh["tp"], mesh["dp"],
                                                              "fsdp")
    return results


class TensorParallelTest(unittest.TestCase):
    def _check_training(self, errors, world_size):
        worst = max(e for name, e in errors.items() if not name.endswith(" parameters"))
        print(f"T={world_size}: worst relative error against one process: {worst:.3g}")
        for name, error in errors.items():
            if name.endswith(" parameters"):
                continue
            with self.subTest(name=name):
                self.assertLessEqual(error, TOLERANCE, name)
        # Every parameter but the replicated ones (fc2's biases, norms) is split T ways.
        replicated = errors["replicated parameters"]
        self.assertGreater(replicated, 0)
        self.assertEqual(errors["local parameters"],
                         (errors["full parameters"] - replicated) // world_size + replicated)

    def test_tp2_equals_one_process(self):
        for errors in torch_testing.run_ranks(_tp_only, 2):
            self._check_training(errors["tp"], 2)
            self._check_training(errors["sp"], 2)

    @torch_testing.not_under_sanitizer
    def test_tp4_equals_one_process(self):
        for errors in torch_testing.run_ranks(_tp_only, 4):
            self._check_training(errors["tp"], 4)
            self._check_training(errors["sp"], 4)

    def test_2d_mesh_groups_and_dp_ddp_fsdp_times_tp(self):
        for rank, r in enumerate(torch_testing.run_ranks(_mesh_2d, 4)):
            with self.subTest(rank=rank):
                dp, tp = rank // 2, rank % 2
                self.assertEqual((r["ndim"], r["size"], r["size(0)"], r["rank"], r["groups"]),
                                 (2, 4, 2, rank, 2))
                self.assertEqual(r["mesh"], [[0, 1], [2, 3]])
                self.assertEqual(r["coordinate"], [dp, tp])
                # Row-major: the tp dim's groups are consecutive ranks.
                self.assertEqual(r["tp members"], [2 * dp, 2 * dp + 1])
                self.assertEqual(r["dp members"], [tp, tp + 2])
                self.assertEqual((r["dp local rank"], r["tp local rank"]), (dp, tp))
                self.assertEqual((r["dp rank in group"], r["tp rank in group"]), (dp, tp))
                self.assertEqual(r["tp sub-mesh"], [2 * dp, 2 * dp + 1])
                self.assertEqual(r["dp sub-mesh"], [tp, tp + 2])
                self.assertTrue(r["dp sub-mesh group is the dim's"])
                self.assertTrue(r["tp sub-mesh group is the dim's"])
                self.assertTrue(r["whole slice is the mesh"])
                self.assertEqual(r["custom coordinate"], [rank % 2, rank // 2])
                self.assertEqual(r["custom a members"], [2 * (rank // 2), 2 * (rank // 2) + 1])
                self.assertEqual(r["custom b members"], [rank % 2, rank % 2 + 2])
                self.assertTrue(r["is a DeviceMesh"])
                self.assertIn("RuntimeError", r["get_group() of a 2-D mesh"])
                self.assertIn("name the dim with mesh_dim=", r["get_group() of a 2-D mesh"])
                self.assertIn("takes a 1-D DeviceMesh", r["2-D mesh to parallelize_module"])
                self.assertIn("mesh['tp']", r["2-D mesh to parallelize_module"])
                self._check_training(r["training"], 2)
                self._check_training(r["ddp sp training"], 2)
                self._check_training(r["fsdp tp training"], 2)
                self._check_training(r["fsdp sp training"], 2)

    def test_bad_inputs_are_named_and_src_data_rank(self):
        expected = {
            "colwise indivisible": ("ValueError", "ColwiseParallel on '0' (Linear): "
                                    "out_features 5 is not divisible by the tensor-parallel "
                                    "group size 2"),
            "rowwise indivisible": ("ValueError", "RowwiseParallel on '1' (Linear): "
                                    "in_features 5 is not divisible by the tensor-parallel "
                                    "group size 2"),
            "embedding indivisible": ("ValueError", "RowwiseParallel on '<root>' (Embedding): "
                                      "num_embeddings 7 is not divisible"),
            "unsupported module": ("NotImplementedError", "ColwiseParallel on '2': Conv1d is "
                                   "not supported"),
            "unknown submodule": ("ValueError", "parallelize_plan['blocks.*.fc1'] names no "
                                  "submodule of Sequential"),
            "use_local_output": ("NotImplementedError", "use_local_output=False"),
            "twice": ("ValueError", "'0' is already parallelized (RowwiseParallel("),
            "input not the rank's slice": ("ValueError", "RowwiseParallel on '<root>': rank "
                                           "RANK: the input of shape (3, 4) is not this "
                                           "rank's slice of the last dim (expected 2 = "
                                           "in_features 4 / 2)"),
            "after FSDP": ("ValueError", "'_fsdp_wrapped_module.0' is already inside a "
                           "FullyShardedDataParallel unit: apply parallelize_module first"),
            "mesh of the wrong size": ("ValueError", "mesh_shape (3,) holds 3 ranks but the "
                                       "world size is 2"),
            "mesh on cuda": ("ValueError", "device_type 'cuda' is not supported"),
            "names of the wrong length": ("ValueError", "mesh_dim_names ('dp',) has 1 names "
                                          "for mesh_shape (2, 1) of 2 dims"),
            "unknown dim name in slice": ("KeyError", "mesh dim 'dp' does not exist; "
                                          "mesh_dim_names=('tp',)"),
            "unknown dim name in get_group": ("KeyError", "mesh dim 'dp' does not exist"),
        }
        for rank, r in enumerate(torch_testing.run_ranks(_bad_inputs, 2)):
            self.assertTrue(r.pop("from rank 0"))
            self.assertTrue(r.pop("from its own"))
            for case, (kind, text) in expected.items():
                text = text.replace("RANK", str(rank))
                with self.subTest(rank=rank, case=case):
                    self.assertTrue(r[case].startswith(kind + ":"), r[case])
                    self.assertIn(text, r[case])


if __name__ == "__main__":
    torch_testing.main()
