"""pipeline(): a model cut into stages at named split points (torch.distributed.pipelining's
pipeline and SplitPoint, 2.6).

torch traces the model (torch.export) and cuts its graph; torch 1.13 has no such tracer, so
here a model is cut by its modules: an nn.Sequential, cut between its children, or inside a
child that is itself an nn.Sequential (split points "4" and "4.1"). Each stage's module runs
its part of the children in order and keeps their original names (its state_dict keys are the
model's), sharing their parameters with the model. Anything else is refused, naming the split
point and why.

    pipe = pipeline(model, mb_args=(x_microbatch,), split_spec={"2": SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, device="cpu")
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
"""

import enum

import torch

from tessera.torch.pipelining.stage import PipelineStage

__all__ = ["SplitPoint", "Pipe", "pipeline"]


class SplitPoint(enum.Enum):
    """Where a split point cuts: before the named module runs, or after."""

    BEGINNING = 1
    END = 2


def _plain_sequential(module):
    """An nn.Sequential whose forward is nn.Sequential's: running its children in order is
    running it."""
    return (isinstance(module, torch.nn.Sequential)
            and type(module).forward is torch.nn.Sequential.forward)


def _refuse(name, point, why):
    where = f"split point {name!r} ({point})" if name is not None else "pipeline()"
    raise ValueError(f"tessera.torch.pipelining: pipeline(): {where}: {why}")


class _StageModule(torch.nn.Module):
    """A stage's run of the model's modules, under their names in the model."""

    def __init__(self, units):
        super().__init__()
        self._order = []  # the names, in the order they run
        self._run = []    # the modules (a plain list: registered once, above)
        for name, module in units:
            parent, _, leaf = name.rpartition(".")
            if parent:
                if parent not in self._modules:
                    self.add_module(parent, torch.nn.Module())
                self._modules[parent].add_module(leaf, module)
            else:
                self.add_module(name, module)
            self._order.append(name)
            self._run.append(module)

    def forward(self, x):
        for module in self._run:
            x = module(x)
        return x


class Pipe:
    """The model's stages: num_stages, get_stage_module(i), build_stage(i, device, group)."""

    def __init__(self, stage_units, inputs, outputs):
        self._modules = [_StageModule(units) for units in stage_units]
        self._inputs = inputs    # per stage: a meta tensor of one micro-batch's input
        self._outputs = outputs  # per stage: a meta tensor of its output
        self.num_stages = len(self._modules)

    def _check(self, stage_index):
        if not isinstance(stage_index, int) or not 0 <= stage_index < self.num_stages:
            raise ValueError(f"tessera.torch.pipelining: Pipe: stage {stage_index!r} is not in "
                             f"0 .. {self.num_stages - 1}: pipeline() cut the model into "
                             f"{self.num_stages} stage(s), one more than its split points")

    def get_stage_module(self, stage_idx):
        """Stage `stage_idx`'s module (its parameters are the model's)."""
        self._check(stage_idx)
        return self._modules[stage_idx]

    def build_stage(self, stage_index, device, group=None):
        """The PipelineStage of `stage_index` on this rank, its module moved to `device`, with
        the micro-batch shapes found from mb_args."""
        self._check(stage_index)
        module = self._modules[stage_index].to(device)
        return PipelineStage(module, stage_index, self.num_stages, device,
                             input_args=self._inputs[stage_index],
                             output_args=self._outputs[stage_index], group=group)

    def __repr__(self):
        return f"Pipe({self.num_stages} stages: {[m._order for m in self._modules]})"


def _units(module, split_spec):
    """The model's modules in the order they run, as (name, module): its children, each child
    named by a split point's grandchild replaced by its own children."""
    if not _plain_sequential(module):
        name, point = next(iter(split_spec.items()), (None, None))
        why = (f"{type(module).__name__}.forward is its own" if
               isinstance(module, torch.nn.Sequential) else
               f"the model is a {type(module).__name__}, not an nn.Sequential")
        _refuse(name, point, f"{why}: tessera.torch.pipelining cuts an nn.Sequential between "
                             f"its children (or a child nn.Sequential's); torch 1.13 has no "
                             f"tracer to cut other forwards")
    expand = set()
    for name, point in split_spec.items():
        if not isinstance(name, str):
            _refuse(name, point, "split points are named by a string (the module's name)")
        if not isinstance(point, SplitPoint):
            _refuse(name, point, f"{point!r} is not a SplitPoint")
        parts = name.split(".")
        child = module._modules.get(parts[0])
        if child is None:
            _refuse(name, point, f"the model has no child {parts[0]!r} (its children: "
                                 f"{list(module._modules)})")
        if len(parts) > 2:
            _refuse(name, point, "only the model's children and grandchildren can be split "
                                 "points")
        if len(parts) == 2:
            if not _plain_sequential(child):
                _refuse(name, point, f"child {parts[0]!r} is a {type(child).__name__}, not an "
                                     f"nn.Sequential, so it cannot be cut inside")
            if parts[1] not in child._modules:
                _refuse(name, point, f"child {parts[0]!r} has no child {parts[1]!r} (its "
                                     f"children: {list(child._modules)})")
            expand.add(parts[0])
    units = []
    for name, child in module._modules.items():
        if name in expand:
            units += [(f"{name}.{inner}", m) for inner, m in child._modules.items()]
        else:
            units.append((name, child))
    return units


def pipeline(module, mb_args, mb_kwargs=None, split_spec=None, split_policy=None):
    """`module` cut at `split_spec`'s points ({name: SplitPoint}); mb_args is one
    micro-batch's input, run once (without gradients) to learn each stage's shapes."""
    if split_policy is not None:
        raise NotImplementedError("tessera.torch.pipelining: pipeline(): split_policy is not "
                                  "supported; name the split points in split_spec")
    if mb_kwargs:
        raise ValueError(f"tessera.torch.pipelining: pipeline(): an nn.Sequential takes no "
                         f"keyword arguments, got mb_kwargs {sorted(mb_kwargs)}")
    mb_args = mb_args if isinstance(mb_args, tuple) else (mb_args,)
    if len(mb_args) != 1 or not isinstance(mb_args[0], torch.Tensor):
        raise ValueError("tessera.torch.pipelining: pipeline(): an nn.Sequential takes one "
                         "tensor: mb_args must be (tensor,)")
    split_spec = dict(split_spec or {})
    units = _units(module, split_spec)
    position = {name: i for i, (name, _) in enumerate(units)}
    cuts = {}
    for name, point in split_spec.items():
        if name in position:
            first = last = position[name]
        else:  # an expanded child: its first and last units
            inside = [i for unit, i in position.items() if unit.startswith(name + ".")]
            first, last = min(inside), max(inside)
        cut = first if point == SplitPoint.BEGINNING else last + 1
        if cut == 0 or cut == len(units):
            _refuse(name, point, f"it cuts at the {'start' if cut == 0 else 'end'} of the "
                                 f"model, which would leave a stage empty")
        if cut in cuts:
            _refuse(name, point, f"it cuts where split point {cuts[cut]!r} already does, "
                                 f"which would leave a stage empty")
        cuts[cut] = name
    bounds = [0] + sorted(cuts) + [len(units)]
    stage_units = [units[a:b] for a, b in zip(bounds, bounds[1:])]
    # Each stage's input and output for one micro-batch, as meta tensors.
    inputs, outputs = [], []
    x = mb_args[0]
    with torch.no_grad():
        for i, stage in enumerate(stage_units):
            inputs.append(torch.empty(x.shape, dtype=x.dtype, device="meta"))
            for name, unit in stage:
                try:
                    x = unit(x)
                except Exception as e:
                    raise RuntimeError(f"tessera.torch.pipelining: pipeline(): module {name!r} "
                                       f"(stage {i}) failed on mb_args: {type(e).__name__}: "
                                       f"{e}") from e
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"tessera.torch.pipelining: pipeline(): stage {i} ends with "
                                 f"module {stage[-1][0]!r}, which returns a "
                                 f"{type(x).__name__}, not a tensor")
            outputs.append(torch.empty(x.shape, dtype=x.dtype, device="meta"))
    return Pipe(stage_units, inputs, outputs)
