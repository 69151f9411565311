"""ZB-H1's split backward (tessera.torch.pipelining.split_backward): I computes the inputs'
gradient and W the weights', and W runs no node of the input side again.

Every backward node the test can see notes when it ran and what it computed: a custom autograd
Function on the activations (an input-gradient node) and a post-hook on each Linear's Addmm,
which tells whether it computed its input's gradient (mat1) or its weight's (mat2). On a stage
whose input takes a gradient, each of them must run once per micro-batch, input-gradient work
inside that micro-batch's I and weight work inside its W, and the training must still equal one
process. In one process, backward_input + WeightWork equal a full backward for graphs that
split, and for those that do not (whole parameters).
"""

import time
import unittest

import torch
import torch.nn as nn

import torch_testing

_WIDTH = 6
_BATCH = 16
_M = 4
_STEPS = 2
_EVENTS = []  # (kind, module name, time.perf_counter()) in this process


class _Noted(torch.autograd.Function):
    """Identity whose backward notes that it ran: a node of the input side."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _EVENTS.append(("input", ctx.name, time.perf_counter()))
        return grad, None


class _Note(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name

    def forward(self, x):
        return _Noted.apply(x, self.name)


class _WatchedLinear(nn.Linear):
    """A Linear whose Addmm notes what each run of its backward computed."""

    def __init__(self, name):
        super().__init__(_WIDTH, _WIDTH)
        self.name = name

    def forward(self, x):
        y = super().forward(x)
        if y.grad_fn is not None:
            node = y.grad_fn
            while node.name().startswith("View"):  # a 3-d input: View over the Addmm
                node = node.next_functions[0][0]
            assert node.name().startswith("Addmm"), node.name()
            node.register_hook(self._ran)
        return y

    def _ran(self, grad_inputs, grad_outputs):
        now = time.perf_counter()
        _, mat1, mat2 = grad_inputs  # Addmm's (bias, mat1, mat2)
        if mat1 is not None:
            _EVENTS.append(("input", self.name, now))
        if mat2 is not None:
            _EVENTS.append(("weight", self.name, now))


def _model(stages):
    """Per stage: Linear, note, ReLU, Linear, note; the same on every rank."""
    torch.manual_seed(0)
    modules = []
    for s in range(stages):
        modules += [_WatchedLinear(f"{s}.a"), _Note(f"{s}.a'"), nn.ReLU(),
                    _WatchedLinear(f"{s}.b"), _Note(f"{s}.b'")]
    return nn.Sequential(*modules)


def _batches(three_d):
    torch.manual_seed(1)
    shape = (_BATCH, 2, _WIDTH) if three_d else (_BATCH, _WIDTH)
    return [(torch.randn(shape), torch.randn(shape)) for _ in range(_STEPS)]


def _optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _reference(stages, three_d):
    model = _model(stages)
    optimizer = _optimizer(model.parameters())
    for x, y in _batches(three_d):
        optimizer.zero_grad()
        nn.MSELoss()(model(x), y).backward()
        optimizer.step()
    return model


def _where(timeline, t):
    """The compute action (op, micro-batch) of the timeline during which time t fell."""
    for op, _, m, start, end in timeline:
        if start <= t <= end:
            return op, m
    return None


def _split_work(rank, world, three_d):
    """Trains ZB-H1 and returns this rank's failures: work outside its half, work done twice,
    held micro-batches, parameters unlike one process's."""
    from tessera.torch import _C
    from tessera.torch import pipelining

    full = _model(world)
    part = full[5 * rank:5 * rank + 5]
    stage = pipelining.PipelineStage(part, rank, world, "cpu")
    schedule = pipelining.ScheduleZBH1(stage, _M, loss_fn=nn.MSELoss())
    optimizer = _optimizer(part.parameters())
    expected_peak = _C.pipeline_schedule("zb-h1", world, _M, 1)["peak_held"][rank]
    what = f"rank {rank} ({'3-d' if three_d else '2-d'})"
    failures = []
    for step, (x, y) in enumerate(_batches(three_d)):
        _EVENTS.clear()
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()
        timeline = schedule.timeline
        counts = {}
        for kind, name, t in _EVENTS:
            counts[(kind, name)] = counts.get((kind, name), 0) + 1
            ran_in = _where(timeline, t)
            # Stage 0's input takes no gradient: its whole backward is weight work, in W.
            expected_op = "W" if kind == "weight" or rank == 0 else "I"
            if ran_in is None or ran_in[0] != expected_op:
                failures.append(f"{what} step {step}: {kind} work of {name} ran in "
                                f"{ran_in}, not in a {expected_op}")
        for name, kinds in (("a", ("input", "weight")), ("a'", ("input",)),
                            ("b", ("input", "weight")), ("b'", ("input",))):
            for kind in kinds:
                if rank == 0 and name == "a" and kind == "input":
                    continue  # the stage's first Linear: its input takes no gradient
                n = counts.get((kind, f"{rank}.{name}"), 0)
                if n != _M:
                    failures.append(f"{what} step {step}: {kind} work of {rank}.{name} ran "
                                    f"{n} times for {_M} micro-batches")
        if schedule.peak_held != expected_peak:
            failures.append(f"{what} step {step}: held {schedule.peak_held} micro-batches, "
                            f"the schedule's bound is {expected_peak}")
        if stage._weight_pending or stage._candidates:
            failures.append(f"{what} step {step}: W left {len(stage._weight_pending)} graphs "
                            f"and {len(stage._candidates)} anchor sets behind")
    reference = _reference(world, three_d)[5 * rank:5 * rank + 5]
    for (name, p), q in zip(part.named_parameters(), reference.parameters()):
        error = float((p.detach() - q.detach()).abs().max())
        if error > 1e-5 * float(q.detach().abs().max()):
            failures.append(f"{what}: {name} differs from one process's by {error}")
    return failures


def _tensor_parallel_split(rank, world):
    """A column- then row-parallel pair (tessera.torch.tensor_parallel) splits whole: W starts
    from anchors above the rows' all-reduce, whose backward is the identity, so it runs no
    collective; the gradients equal a full backward's."""
    from tessera.torch import init_device_mesh
    from tessera.torch.pipelining import split_backward
    from tessera.torch.tensor_parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))

    def model():
        torch.manual_seed(5)
        module = nn.Sequential(nn.Linear(_WIDTH, 8), nn.ReLU(), nn.Linear(8, _WIDTH))
        return parallelize_module(module, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    x = torch.randn(3, _WIDTH, generator=torch.Generator().manual_seed(6))
    seed = torch.randn(3, _WIDTH, generator=torch.Generator().manual_seed(7))
    split, reference = model(), model()
    xs = x.clone().requires_grad_()
    with split_backward.Candidates(split) as candidates:
        output = split(xs)
    (dx,), work = split_backward.backward_input([output], [seed], [xs],
                                                list(split.parameters()), candidates.by_node)
    whole = len(work.whole_params)
    work.run()
    xr = x.clone().requires_grad_()
    reference(xr).backward(seed)
    failures = [] if whole == 0 else [f"rank {rank}: {whole} parameters differentiated whole"]
    if not torch.allclose(dx, xr.grad, rtol=1e-5, atol=1e-6):
        failures.append(f"rank {rank}: the input's gradient differs")
    for (name, p), q in zip(split.named_parameters(), reference.parameters()):
        if not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6):
            failures.append(f"rank {rank}: {name}'s gradient differs")
    return failures


class ZeroBubbleTest(unittest.TestCase):
    def test_tensor_parallel_layers_split(self):
        results = torch_testing.run_ranks(_tensor_parallel_split, 2)
        self.assertEqual([f for r in results for f in r], [])

    def test_w_runs_no_input_gradient_node(self):
        for three_d in (False, True):
            results = torch_testing.run_ranks(_split_work, 2, args=(three_d,))
            self.assertEqual([f for r in results for f in r], [])


# -- in one process: backward_input and WeightWork against a full backward --------------------

class _Scale(nn.Module):
    """tanh(x * scale) + x: the weight node (Mul) has no anchor (a Tanh, which computes, lies
    between it and the module's output): `scale` is differentiated whole."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, _WIDTH))

    def forward(self, x):
        return torch.tanh(x * self.scale) + x


class _Residual(nn.Module):
    """x * scale + x: the Add above the weight node (Mul) is cheap: it splits."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, _WIDTH))

    def forward(self, x):
        return x * self.scale + x


class _Twice(nn.Module):
    """The same Linear on one path twice: its two anchors lie on one path, so its weights are
    differentiated whole (split, their gradients would add twice)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(_WIDTH, _WIDTH)

    def forward(self, x):
        return self.linear(torch.tanh(self.linear(x)))


class _Offset(nn.Module):
    """A second output made of a parameter alone (a root independent of the input)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(_WIDTH, _WIDTH)
        self.offset = nn.Parameter(torch.ones(_WIDTH))

    def forward(self, x):
        return self.linear(x), self.offset * 3


def _modules():
    torch.manual_seed(2)
    return {
        "mlp": nn.Sequential(nn.Linear(_WIDTH, 8), nn.ReLU(), nn.Linear(8, _WIDTH)),
        "scale": nn.Sequential(nn.Linear(_WIDTH, _WIDTH), _Scale(), nn.Tanh()),
        "twice": _Twice(),
        "offset": _Offset(),
        "layernorm": nn.Sequential(nn.Linear(_WIDTH, _WIDTH), nn.LayerNorm(_WIDTH)),
        "residual": nn.Sequential(nn.Linear(_WIDTH, _WIDTH), _Residual()),
    }


def _split_grads(module, x, input_grad, seeds_of):
    """The input's and parameters' gradients through backward_input + WeightWork.run."""
    from tessera.torch.pipelining import split_backward

    x = x.detach().requires_grad_(input_grad)
    with split_backward.Candidates(module) as candidates:
        outputs = module(x)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    seeds = seeds_of(outputs)
    params = list(module.parameters())
    grads, work = split_backward.backward_input(list(outputs), seeds, [x] if input_grad else [],
                                                params, candidates.by_node)
    work.run()
    return (grads[0] if input_grad else None), [p.grad for p in params], work


class SplitBackwardTest(unittest.TestCase):
    def test_equals_a_full_backward(self):
        for name in _modules():
            for input_grad in (True, False):  # a later stage, and stage 0
                with self.subTest(module=name, input_grad=input_grad):
                    torch.manual_seed(3)
                    x = torch.randn(5, _WIDTH)

                    def seeds_of(outputs):
                        g = torch.Generator().manual_seed(4)
                        return [torch.randn(o.shape, generator=g) for o in outputs]

                    module = _modules()[name]
                    dx, dparams, work = _split_grads(module, x, input_grad, seeds_of)
                    reference = _modules()[name]
                    xr = x.detach().requires_grad_(input_grad)
                    outputs = reference(xr)
                    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                    torch.autograd.backward(outputs, seeds_of(outputs))
                    if input_grad:
                        torch.testing.assert_close(dx, xr.grad)
                    for a, b in zip(dparams, reference.parameters()):
                        torch.testing.assert_close(a, b.grad)
                    self.assertEqual(work.groups, [])  # run() drops the graph

    def test_what_is_split_and_what_is_whole(self):
        from tessera.torch.pipelining import split_backward

        def plan(module):
            x = torch.randn(3, _WIDTH, requires_grad=True)
            with split_backward.Candidates(module) as candidates:
                outputs = module(x)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            _, work = split_backward.backward_input(
                list(outputs), [torch.ones_like(o) for o in outputs], [x],
                list(module.parameters()), candidates.by_node)
            split = sorted(tuple(sorted(id(p) for p in params))
                           for _, _, params in work.groups)
            return split, sorted(id(p) for p in work.whole_params)

        modules = _modules()
        mlp = modules["mlp"]
        self.assertEqual(plan(mlp), (sorted([tuple(sorted([id(mlp[0].weight),
                                                           id(mlp[0].bias)])),
                                             tuple(sorted([id(mlp[2].weight),
                                                           id(mlp[2].bias)]))]), []))
        scale = modules["scale"]
        self.assertEqual(plan(scale)[1], [id(scale[1].scale)])
        self.assertEqual(plan(modules["residual"])[1], [])
        twice = modules["twice"]
        self.assertEqual(plan(twice), ([], sorted(id(p) for p in twice.parameters())))
        offset = modules["offset"]
        self.assertEqual(plan(offset)[1], [])  # the offset's root is its anchor, seeded


if __name__ == "__main__":
    torch_testing.main()
