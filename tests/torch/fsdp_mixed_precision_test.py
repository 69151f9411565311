"""MixedPrecision of tessera.torch.fsdp (issue 44): float32 shards, full parameters in
param_dtype for forward and backward, gradients reduced in reduce_dtype, buffers in
buffer_dtype.

The same seeded model on the same per-rank data is trained by FSDP in float32 and by FSDP with
mixed precision (world size 2, FULL_SHARD, 20 steps of SGD with momentum and weight decay);
every parameter must stay within TOLERANCE of the float32 run, relative to its tensor's scale.
Why TOLERANCE = 5e-2: bfloat16 keeps 8 significant bits (a relative rounding of 2^-9, about
2e-3, on every parameter, activation and gradient of forward and backward); through the four
layers of the MLP and the two attention blocks of the transformer each step's gradient is off
by about 1e-2 relative, and SGD with momentum 0.9 integrates those errors over the 20 updates
(the shards and the optimizer stay in float32, so no update is lost to rounding). Measured
here (world size 2): bfloat16 MLP 2.1e-2, transformer 3.1e-2, the one-layer elementwise model
1.5e-3, whether gradients are reduced in float32 or bfloat16; float16 (11 significant bits)
2.4e-4. Each must also be above 0 (forward really ran in lower precision).

float16 on the CPU: torch 1.13 has no float16 kernels for addmm (nn.Linear, attention) or
LayerNorm on the CPU ("not implemented for 'Half'"), so float16 is tested on a model of the
operations that have them (embedding, elementwise), and nn.Linear in float16 raises torch's
own error.
"""

import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

import fsdp_test
import torch_testing

WORLD_SIZE = 2
TOLERANCE = 5e-2


class _Elementwise(nn.Module):
    """Embedding, then a learned per-feature scale and shift: operations torch 1.13 has in
    float16 on the CPU (not tanh or addmm)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(fsdp_test.VOCAB, fsdp_test.DIM)
        self.scale = nn.Parameter(torch.ones(fsdp_test.DIM))
        self.shift = nn.Parameter(torch.zeros(fsdp_test.DIM))

    def forward(self, tokens):
        return self.embedding(tokens) * self.scale + self.shift


def _make(model_name):
    if model_name == "elementwise":
        torch.manual_seed(0)
        return _Elementwise()
    return fsdp_test._make(model_name)


def _loss(model_name, module, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    if model_name == "mlp":
        x = torch.randn(fsdp_test.BATCH, fsdp_test.IN, generator=g)
        y = torch.randn(fsdp_test.BATCH, fsdp_test.OUT, generator=g)
        return F.mse_loss(module(x).float(), y)
    tokens = torch.randint(fsdp_test.VOCAB, (fsdp_test.BATCH, fsdp_test.SEQ), generator=g)
    if model_name == "elementwise":
        target = torch.randn(fsdp_test.BATCH, fsdp_test.SEQ, fsdp_test.DIM, generator=g)
        return F.mse_loss(module(tokens).float(), target)
    targets = torch.randint(fsdp_test.VOCAB, (fsdp_test.BATCH, fsdp_test.SEQ), generator=g)
    logits = module(tokens).float().reshape(-1, fsdp_test.VOCAB)
    return F.cross_entropy(logits, targets.reshape(-1))


def _train(model_name, mixed_precision, rank):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP
    policy = None if model_name == "elementwise" else fsdp_test._policy(model_name)
    fsdp = FSDP(_make(model_name), auto_wrap_policy=policy, mixed_precision=mixed_precision)
    optimizer = torch.optim.SGD(fsdp.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    for step in range(fsdp_test.STEPS):
        optimizer.zero_grad()
        _loss(model_name, fsdp, rank, step).backward()
        if step == 0:
            dtypes = ({str(p.dtype) for p in fsdp.parameters()},
                      {str(p.grad.dtype) for p in fsdp.parameters()})
        optimizer.step()
    return fsdp.state_dict(), dtypes


def _mixed_precision(rank, world_size):
    from tessera.torch.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
    results = {}
    cases = [("mlp", torch.bfloat16), ("transformer", torch.bfloat16),
             ("elementwise", torch.bfloat16), ("elementwise", torch.float16)]
    for model_name, dtype in cases:
        expected, _ = _train(model_name, None, rank)
        for reduce_dtype in (torch.float32, dtype):
            got, dtypes = _train(model_name, MixedPrecision(param_dtype=dtype,
                                                            reduce_dtype=reduce_dtype), rank)
            name = f"{model_name} {dtype} reduced in {reduce_dtype}"
            results[name] = fsdp_test._relative_error(got, expected)
            results[f"dtypes {name}"] = dtypes
    # What forward sees, and the buffers: cast for forward, the model's dtype in the state
    # dict.
    seen = []
    linear = nn.Linear(2, 2)
    linear.register_forward_hook(lambda m, i, o: seen.append((m.weight.dtype, i[0].dtype)))
    norm = nn.BatchNorm1d(2)
    fsdp = FSDP(nn.Sequential(linear, norm),
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16,
                                               buffer_dtype=torch.bfloat16))
    fsdp(torch.randn(3, 2)).float().sum().backward()
    results["forward dtypes"] = [str(d) for d in seen[0]]
    results["buffer dtype"] = str(norm.running_mean.dtype)
    results["state dict buffer dtype"] = str(fsdp.state_dict()["1.running_mean"].dtype)
    # float16 nn.Linear on the CPU: torch's own error.
    half = FSDP(nn.Linear(2, 2), mixed_precision=MixedPrecision(param_dtype=torch.float16))
    try:
        half(torch.randn(3, 2))
        results["float16 linear"] = "ran"
    except RuntimeError as e:
        results["float16 linear"] = str(e)
    return results


class MixedPrecisionTest(unittest.TestCase):
    results = None

    @classmethod
    def setUpClass(cls):
        cls.results = torch_testing.run_ranks(_mixed_precision, WORLD_SIZE, timeout_s=120)

    def test_within_tolerance_of_float32(self):
        for rank, r in enumerate(self.results):
            for name, error in r.items():
                if isinstance(error, float):
                    print(f"rank {rank} {name}: relative error {error:.3g}")
                    with self.subTest(name=name, rank=rank):
                        self.assertLessEqual(error, TOLERANCE, name)
                        self.assertGreater(error, 0.0, f"{name}: not in lower precision")

    def test_shards_and_gradients_stay_float32(self):
        for r in self.results:
            for name, dtypes in r.items():
                if name.startswith("dtypes"):
                    self.assertEqual(dtypes, ({"torch.float32"}, {"torch.float32"}), name)

    def test_forward_and_buffers_in_lower_precision(self):
        for r in self.results:
            self.assertEqual(r["forward dtypes"], ["torch.bfloat16", "torch.bfloat16"])
            self.assertEqual(r["buffer dtype"], "torch.bfloat16")
            self.assertEqual(r["state dict buffer dtype"], "torch.float32")

    def test_float16_linear_raises_torchs_error_on_cpu(self):
        for r in self.results:
            self.assertIn("not implemented for 'Half'", r["float16 linear"])


if __name__ == "__main__":
    torch_testing.main()
