"""tessera.torch.fsdp.FullyShardedDataParallel (issue 44) trains as DistributedDataParallel does:
in the same rank processes, FSDP over the tessera backend (the default group) and DDP over a
Gloo group train the same seeded model on the same per-rank data, and every parameter after
STEPS steps of SGD (momentum, weight decay) agrees within 1e-6 relative to its tensor's scale.

One group of rank processes per world size runs every variant and returns the errors; the test
cases assert on them (starting a process that imports torch costs about a second of the two
cores).
"""

import functools
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_testing

STEPS = 20
BATCH = 4
IN, HIDDEN, OUT = 8, 32, 4
VOCAB, DIM, SEQ = 16, 16, 6
TOLERANCE = 1e-6


class _Mlp(nn.Module):
    def __init__(self, out=OUT):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                                    nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                    nn.Linear(HIDDEN, out))

    def forward(self, x):
        return self.layers(x)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(DIM, 2, batch_first=True)
        self.norm1 = nn.LayerNorm(DIM)
        self.feed_forward = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.ReLU(),
                                          nn.Linear(2 * DIM, DIM))
        self.norm2 = nn.LayerNorm(DIM)

    def forward(self, x):
        x = self.norm1(x + self.attention(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.feed_forward(x))


class _Transformer(nn.Module):
    """Two blocks between an embedding and an output layer tied to it."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(_Block(), _Block())
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.output.weight = self.embedding.weight

    def forward(self, tokens):
        return self.output(self.blocks(self.embedding(tokens)))


def _make(model):
    torch.manual_seed(0)
    return _Mlp() if model == "mlp" else _Transformer()


def _policy(model):
    from tessera.torch.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy
    if model == "mlp":
        # Linear(32, 32) (1056 parameters) become units, the rest stays in the root.
        return functools.partial(size_based_auto_wrap_policy, min_num_params=500)
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={_Block})


def _loss(model_name, module, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    if model_name == "mlp":
        x, y = torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)
        return F.mse_loss(module(x), y)
    tokens = torch.randint(VOCAB, (BATCH, SEQ), generator=g)
    targets = torch.randint(VOCAB, (BATCH, SEQ), generator=g)
    return F.cross_entropy(module(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def _train(model_name, module, rank, steps=STEPS, accumulate=1, clip=None):
    """Trains and returns the norms clip_grad_norm_ gave (if clip: (max_norm, norm_type))."""
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    norms = []
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(accumulate - 1):
            with module.no_sync():
                _loss(model_name, module, rank, 100 * step + micro).backward()
        _loss(model_name, module, rank, 100 * step + accumulate).backward()
        if clip is not None:
            if isinstance(module, FSDP):
                norms.append(float(module.clip_grad_norm_(*clip)))
            else:
                norms.append(float(nn.utils.clip_grad_norm_(module.parameters(), *clip)))
        optimizer.step()
    return norms


def _relative_error(fsdp_state, ddp_state):
    worst = 0.0
    for key, expected in ddp_state.items():
        got = fsdp_state[key]
        scale = max(float(expected.abs().max()), 1e-12)
        worst = max(worst, float((got - expected).abs().max()) / scale)
    return worst


def _compare(rank, model_name, fsdp_kwargs, ddp_group, train_kwargs=None):
    """(relative error of the parameters, relative error of the clip norms) of FSDP against
    DDP after the same training."""
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    train_kwargs = train_kwargs or {}
    fsdp = FSDP(_make(model_name), auto_wrap_policy=_policy(model_name), **fsdp_kwargs)
    fsdp_norms = _train(model_name, fsdp, rank, **train_kwargs)
    ddp = nn.parallel.DistributedDataParallel(_make(model_name), process_group=ddp_group)
    ddp_norms = _train(model_name, ddp, rank, **train_kwargs)
    ddp_state = {k[len("module."):]: v for k, v in ddp.state_dict().items()}
    norm_error = max([abs(a - b) / b for a, b in zip(fsdp_norms, ddp_norms)] or [0.0])
    return _relative_error(fsdp.state_dict(), ddp_state), norm_error


def _storage_numel(tensor):
    return tensor.storage().size()


def _residency(rank, strategy):
    """Whether the non-root units' full parameters are freed after forward and everyone's
    after backward, as the strategy says; and that the optimizer sees shards only."""
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    fsdp = FSDP(_make("mlp"), auto_wrap_policy=_policy("mlp"),
                sharding_strategy=ShardingStrategy[strategy])
    children = [u for u in fsdp.modules() if isinstance(u, FSDP) and u is not fsdp]
    loss = _loss("mlp", fsdp, rank, 0)
    after_forward = [_storage_numel(u._full) > 0 for u in children]
    loss.backward()
    after_backward = [_storage_numel(u._full) > 0 for u in fsdp.modules() if isinstance(u, FSDP)]
    world = dist.get_world_size()
    total = sum(p.numel() for p in _make("mlp").parameters())
    shards = sum(p.numel() for p in fsdp.parameters())
    expected_shards = total if strategy == "NO_SHARD" else total // world
    return {"children": len(children), "kept after forward": all(after_forward),
            "freed after forward": not any(after_forward),
            "kept after backward": all(after_backward),
            "freed after backward": not any(after_backward),
            "shards": expected_shards <= shards <= expected_shards + 3 * world}


def _equality(rank, world_size):
    from tessera.torch.fsdp import ShardingStrategy
    gloo = dist.new_group(backend="gloo")
    results = {strategy: _residency(rank, strategy)
               for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")}
    for model_name in ("mlp", "transformer"):
        for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
            kwargs = dict(sharding_strategy=ShardingStrategy[strategy])
            results[f"{model_name} {strategy}"] = _compare(rank, model_name, kwargs, gloo)[0]
    # Prefetching (the gathers issued ahead on the comm thread) changes no value.
    from tessera.torch import _C
    from tessera.torch.fsdp import BackwardPrefetch
    waits_before = _C.fsdp_metrics()["prefetch_waits"]
    post = BackwardPrefetch.BACKWARD_POST
    for name, kwargs in (("forward and post", dict(forward_prefetch=True, backward_prefetch=post)),
                         ("none", dict(backward_prefetch=None))):
        for strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
            kwargs = dict(kwargs, sharding_strategy=ShardingStrategy[strategy])
            results[f"transformer prefetch {name} {strategy}"] = _compare(
                rank, "transformer", kwargs, gloo, dict(steps=5))[0]
    metrics = _C.fsdp_metrics()
    results["metrics"] = {
        "gathered after backward": metrics["held"]["gathered"],
        "full gradients after backward": metrics["held"]["full_gradient"],
        "peak gathered": metrics["peak"]["gathered"],
        "gathers": metrics["collective_count"]["all_gather"],
        "reduce-scatters": metrics["collective_count"]["reduce_scatter"],
        "prefetch waits counted": metrics["prefetch_waits"] >= waits_before}
    for strategy in ("FULL_SHARD", "NO_SHARD"):
        kwargs = dict(sharding_strategy=ShardingStrategy[strategy])
        results[f"no_sync {strategy}"] = _compare(rank, "mlp", kwargs, gloo,
                                                  dict(steps=4, accumulate=3))[0]
    # FSDP over Gloo itself (its fallbacks for the gathers and reduce-scatters).
    results["gloo FULL_SHARD"] = _compare(rank, "transformer", dict(process_group=gloo),
                                          gloo, dict(steps=5))[0]
    for norm_type in (2.0, float("inf")):
        results[f"clip {norm_type}"] = _compare(rank, "mlp", {}, gloo,
                                                dict(steps=5, clip=(0.05, norm_type)))
    return results


def _state_dict(rank, world_size):
    """Saves the full state dict of a trained FSDP transformer (rank 0 only) and loads it into
    the plain model (on rank 0) and into a fresh FSDP model (on every rank)."""
    from tessera.torch.fsdp import (FullStateDictConfig, FullyShardedDataParallel as FSDP,
                                    StateDictType)
    fsdp = FSDP(_make("transformer"), auto_wrap_policy=_policy("transformer"))
    _train("transformer", fsdp, rank, steps=3)
    config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, config):
        saved = fsdp.state_dict()
    tokens = torch.randint(VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = fsdp(tokens)
    result = {"keys": sorted(saved)}
    plain_keys = sorted(_make("transformer").state_dict())
    if rank == 0:
        plain = _Transformer()
        plain.load_state_dict(saved)
        with torch.no_grad():
            result["plain error"] = float((plain(tokens) - expected).abs().max())
        result["plain keys"] = plain_keys
    everyone = fsdp.state_dict()  # the default: every rank gets the whole
    fresh = FSDP(_Transformer(), auto_wrap_policy=_policy("transformer"))
    fresh.load_state_dict(everyone)
    with torch.no_grad():
        result["reloaded error"] = float((fresh(tokens) - expected).abs().max())
    return result


def _different_models(rank, world_size):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    torch.manual_seed(0)
    FSDP(_Mlp(out=OUT + rank), auto_wrap_policy=_policy("mlp"))


class _Ranks:
    """The equality results of each world size, computed once for all test cases."""
    results = {}

    @classmethod
    def of(cls, world_size):
        if world_size not in cls.results:
            cls.results[world_size] = torch_testing.run_ranks(_equality, world_size)[0]
        return cls.results[world_size]


class FsdpEqualsDdpTest(unittest.TestCase):
    def _check(self, world_size, prefix):
        results = _Ranks.of(world_size)
        chosen = {k: v for k, v in results.items()
                  if k.startswith(prefix) and not isinstance(v, dict)}
        self.assertTrue(chosen)
        for name, error in chosen.items():
            with self.subTest(name):
                errors = error if isinstance(error, tuple) else (error,)
                for e in errors:
                    self.assertLessEqual(e, TOLERANCE, f"{name} at world size {world_size}")

    def test_mlp_world_2(self):
        self._check(2, "mlp")

    def test_mlp_world_3(self):
        self._check(3, "mlp")

    def test_transformer_world_2(self):
        self._check(2, "transformer")

    def test_transformer_world_3(self):
        self._check(3, "transformer")

    def test_mlp_world_4(self):
        self._check(4, "mlp")

    def test_transformer_world_4(self):
        self._check(4, "transformer")

    def test_prefetching_changes_no_value(self):
        for world_size in (2, 3, 4):
            self._check(world_size, "transformer prefetch")

    def test_metrics_account_for_gathers_and_frees(self):
        for world_size in (2, 3):
            metrics = _Ranks.of(world_size)["metrics"]
            self.assertEqual(metrics["gathered after backward"], 0, world_size)
            self.assertEqual(metrics["full gradients after backward"], 0, world_size)
            self.assertGreater(metrics["peak gathered"], 0)
            self.assertGreater(metrics["gathers"], 0)
            self.assertGreater(metrics["reduce-scatters"], 0)
            self.assertTrue(metrics["prefetch waits counted"])

    def test_no_sync(self):
        self._check(2, "no_sync")
        self._check(3, "no_sync")

    def test_clip_grad_norm(self):
        self._check(2, "clip")
        self._check(3, "clip")

    def test_full_parameters_freed_as_the_strategy_says(self):
        for world_size in (2, 3):
            results = _Ranks.of(world_size)
            for strategy, freed in (("FULL_SHARD", "freed"), ("SHARD_GRAD_OP", "kept"),
                                    ("NO_SHARD", "kept")):
                r = results[strategy]
                self.assertEqual(r["children"], 2)
                self.assertTrue(r[f"{freed} after forward"], (world_size, strategy))
                self.assertTrue(r["kept after backward" if strategy == "NO_SHARD"
                                  else "freed after backward"], (world_size, strategy))
                self.assertTrue(r["shards"], (world_size, strategy))

    def test_over_gloo(self):
        self._check(2, "gloo")
        self._check(3, "gloo")


class FsdpStateDictTest(unittest.TestCase):
    def test_full_state_dict_loads_into_plain_module(self):
        rank0, rank1 = torch_testing.run_ranks(_state_dict, 2)
        self.assertEqual(rank0["keys"], rank0["plain keys"])
        self.assertEqual(rank1["keys"], [])  # rank0_only
        self.assertLessEqual(rank0["plain error"], 1e-6)
        self.assertLessEqual(rank0["reloaded error"], 1e-6)
        self.assertLessEqual(rank1["reloaded error"], 1e-6)


class FsdpErrorsTest(unittest.TestCase):
    def test_different_models_fail_on_every_rank(self):
        failure = torch_testing.run_ranks(_different_models, 2, return_errors=True)
        self.assertIsInstance(failure, torch_testing.RankFailure)
        for rank in (0, 1):
            error = failure.errors[rank]
            self.assertIn("ValueError", error)
            self.assertIn("unit '<root>'", error)
            self.assertIn("parameter 'layers.6.weight'", error)
            self.assertIn("[4, 32]", error)
            self.assertIn("[5, 32]", error)

    def test_unsupported_arguments_raise(self):
        from tessera.torch.fsdp import CPUOffload, FullyShardedDataParallel as FSDP
        cases = {
            "cpu_offload": dict(cpu_offload=CPUOffload(offload_params=True)),
        }
        for name, kwargs in cases.items():
            with self.subTest(name), self.assertRaisesRegex(NotImplementedError,
                                                            f"{name}.*issue 44"):
                FSDP(nn.Linear(2, 2), **kwargs)
        with self.assertRaisesRegex(ValueError, "only CPU"):
            FSDP(nn.Linear(2, 2), device_id=torch.device("cuda", 0))
        with self.assertRaisesRegex(NotImplementedError, "sharded_optim_state_dict"):
            FSDP.sharded_optim_state_dict(nn.Linear(2, 2), None)


if __name__ == "__main__":
    torch_testing.main()
