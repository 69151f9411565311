"""tessera.torch.fsdp's use_orig_params and param_init_fn (issue 44), as later torch releases
define them:

  use_orig_params=True  the optimizer sees the original parameters (each rank a view of its
                        slice of them), so parameter groups per parameter work (here: weight
                        decay on weights only); training equals DDP on Gloo with the same
                        groups, and the full optimizer state dict equals the flat one's;
  param_init_fn         a model built on the meta device is materialized unit by unit (each
                        module with meta tensors, nested units left alone), with the user's
                        function or else reset_parameters().
"""

import unittest

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_testing
from fsdp_test import (STEPS, TOLERANCE, _Mlp, _Transformer, _loss, _make, _policy,
                       _relative_error)


def _groups(named):
    """Weight decay on the weights, none on biases, layer norms and embeddings."""
    decay, rest = [], []
    for name, p in named:
        (decay if name.endswith("weight") and "norm" not in name and "embedding" not in name
         else rest).append(p)
    return [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]


def _train(module, rank, steps=STEPS):
    optimizer = torch.optim.SGD(_groups(module.named_parameters()), lr=0.05, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=step % 2 == 0)  # both ways of zeroing
        _loss("transformer", module, rank, step).backward()
        optimizer.step()
    return optimizer


def _orig_params(rank, world_size):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    gloo = dist.new_group(backend="gloo")
    ddp = nn.parallel.DistributedDataParallel(_make("transformer"), process_group=gloo)
    _train(ddp, rank)
    expected = {k[len("module."):]: v for k, v in ddp.state_dict().items()}
    results = {}
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
        fsdp = FSDP(_make("transformer"), auto_wrap_policy=_policy("transformer"),
                    sharding_strategy=ShardingStrategy[strategy], use_orig_params=True)
        names = sorted(n.replace("_fsdp_wrapped_module.", "") for n, _ in fsdp.named_parameters())
        optimizer = _train(fsdp, rank)
        results[strategy] = {"error": _relative_error(fsdp.state_dict(), expected),
                             "names": names,
                             "full osd": FSDP.full_optim_state_dict(fsdp, optimizer)}
    # The flat parameters' optimizer (one group) against the original ones' (same values).
    flat = FSDP(_make("transformer"), auto_wrap_policy=_policy("transformer"))
    orig = FSDP(_make("transformer"), auto_wrap_policy=_policy("transformer"),
                use_orig_params=True)
    osds = []
    for model in (flat, orig):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(3):
            optimizer.zero_grad()
            _loss("transformer", model, rank, step).backward()
            optimizer.step()
        osds.append(FSDP.full_optim_state_dict(model, optimizer, rank0_only=False))
    # ... and the orig one's state loads back into a fresh use_orig_params model's optimizer.
    fresh = FSDP(_make("transformer"), auto_wrap_policy=_policy("transformer"),
                 use_orig_params=True)
    reloaded = torch.optim.SGD(fresh.parameters(), lr=0.05, momentum=0.9)
    reloaded.load_state_dict(FSDP.shard_full_optim_state_dict(osds[1], fresh))
    results["reloaded osd"] = FSDP.full_optim_state_dict(fresh, reloaded, rank0_only=False)
    results["osds"] = osds
    results["plain names"] = sorted(n for n, _ in _make("transformer").named_parameters())
    return results


def _same_state(a, b):
    if a.keys() != b.keys():
        return False
    for name, entry in a["state"].items():
        other = b["state"][name]
        for key, value in entry.items():
            if torch.is_tensor(value) and not torch.equal(value, other[key]):
                return False
    return True


def _deterministic(m):
    """Values that depend only on the tensor's shape (the same in any order of calls)."""
    with torch.no_grad():
        for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
            t.copy_(torch.linspace(-0.5, 0.5, t.numel()).reshape(t.shape) / (t.shape[-1] ** 0.5))


def _meta(rank, world_size):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    torch.manual_seed(0)
    reference = _Transformer()
    reference.apply(_deterministic)

    def init(m):  # torch 1.13's to_empty recurses: FSDP keeps nested units out of its reach
        m.to_empty(device="cpu")
        m.apply(_deterministic)

    results = {}
    meta = _on_meta()
    results["built on meta"] = all(p.is_meta for p in meta.parameters())
    fsdp = FSDP(meta, auto_wrap_policy=_policy("transformer"), param_init_fn=init)
    tokens = torch.randint(16, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference_output = reference(tokens)
        results["param_init_fn error"] = float((fsdp(tokens) - reference_output).abs().max())
    try:
        FSDP(_on_meta(), auto_wrap_policy=_policy("transformer"))
    except ValueError as error:
        results["no reset_parameters"] = str(error)
    # Without param_init_fn, every module's reset_parameters() (an MLP's Linear layers).
    fsdp = FSDP(_Mlp().to("meta"), auto_wrap_policy=_policy("mlp"))
    results["reset finite"] = all(bool(torch.isfinite(p).all()) for p in fsdp.parameters())
    results["reset loss finite"] = bool(torch.isfinite(_loss("mlp", fsdp, rank, 0)))
    return results


def _on_meta():
    """The transformer with its tensors on the meta device (torch 1.13 has no device context
    manager), its output layer tied to its embedding again."""
    model = _Transformer().to("meta")
    model.output.weight = model.embedding.weight
    return model


class FsdpOrigParamsTest(unittest.TestCase):
    results = {}

    @classmethod
    def of(cls, world_size):
        if world_size not in cls.results:
            cls.results[world_size] = torch_testing.run_ranks(_orig_params, world_size)[0]
        return cls.results[world_size]

    def test_per_parameter_groups_train_as_ddp(self):
        for world_size in (2, 3):
            results = self.of(world_size)
            for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
                with self.subTest(world_size=world_size, strategy=strategy):
                    self.assertLessEqual(results[strategy]["error"], TOLERANCE)
                    self.assertEqual(results[strategy]["names"], results["plain names"])

    def test_full_optimizer_state_equals_the_flat_ones(self):
        for world_size in (2, 3):
            flat, orig = self.of(world_size)["osds"]
            self.assertEqual(sorted(flat["state"]), sorted(orig["state"]))
            self.assertTrue(_same_state(flat, orig), world_size)
            self.assertTrue(_same_state(orig, self.of(world_size)["reloaded osd"]), world_size)


class FsdpParamInitFnTest(unittest.TestCase):
    def test_meta_models_are_materialized_unit_by_unit(self):
        for rank_results in torch_testing.run_ranks(_meta, 2):
            self.assertTrue(rank_results["built on meta"])
            self.assertEqual(rank_results["param_init_fn error"], 0.0)
            self.assertIn("'attention' (MultiheadAttention) of unit 'blocks.0' is on the meta "
                          "device and has no reset_parameters() to materialize it: give "
                          "param_init_fn", rank_results["no reset_parameters"])
            self.assertTrue(rank_results["reset finite"])
            self.assertTrue(rank_results["reset loss finite"])


if __name__ == "__main__":
    torch_testing.main()
