"""Zero bubble's backward in two halves on torch 1.13: I computes the inputs' gradient and W the
weights', and neither recomputes what the other did (torch 2.6's stage_backward_input and
stage_backward_weight, without the autograd APIs 1.13 lacks: GradientEdge, autograd.grad from
a node).

Words (the autograd graph of one micro-batch on one stage):
  roots        the tensors the backward starts from (the stage's outputs, or the last stage's
               loss) and their seeds (the gradients received, or the loss's scale).
  input side   the nodes from which an input's grad accumulator is reachable: what I runs.
  weight node  for a parameter, a first input-side node met walking from the parameter's grad
               accumulator toward the roots, where its gradient meets the input's (a Linear's
               AddmmBackward; torch's "intermediate"). A root that does not depend on the
               inputs is a weight node of the parameters that reach it (stage 0: every
               parameter's, as stage 0's input takes no gradient).
  anchor       a tensor of the forward whose grad_fn is a weight node, or reaches one through
               cheap nodes (_CHEAP: views, adds; a Linear on a 3-d input is a View over the
               Addmm). 1.13's autograd starts only from tensors: W starts from the anchors,
               with the gradient I saw flowing into them (a pre-hook on the anchor's node).
  group        parameters that share anchors. W runs one autograd.backward per group, from its
               anchors to its parameters only: the engine then computes, at each weight node,
               the weight's part alone (an Addmm's mat2 and bias, not mat1), and runs no node
               of the input side below it.

A parameter whose weight nodes have no anchor, whose anchors lie on one path (one reachable
from another: their gradients would add twice) or have more than one output taking a gradient
is "whole": W differentiates the roots with respect to it, recomputing the input side as before
(correct, only slower). Candidate anchors are the outputs of the stage's modules that own
parameters (nn.Linear, nn.Embedding, ...; Candidates): a Linear's output is its weight node's.

Memory: I keeps the graph (retain_graph) and W frees it, as torch's; besides, the anchors are
held from F to W (one activation per weight node whose output no backward saves, e.g. a
Linear followed by a ReLU, which saves its own output).
"""

import collections

import torch

__all__ = ["Candidates", "WeightWork", "backward_input"]

# Nodes whose backward only moves, reshapes or adds up its gradient: an anchor may sit this
# many of them above its weight node (W runs them again, at no real cost): a Linear on a 3-d
# input (View over Addmm), a bias added after the matmul (Add). Custom autograd Functions
# join them with a class attribute tessera_cheap_backward = True (no arithmetic to speak of,
# no communication: tensor_parallel.py's sums and gathers, whose backward is the identity or
# a slice).
_CHEAP = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "TBackward",
          "TransposeBackward", "PermuteBackward", "SqueezeBackward", "UnsqueezeBackward",
          "AsStridedBackward", "AddBackward", "SubBackward")
_MAX_CHEAP_HOPS = 4


def _cheap(node):
    return (node.name().startswith(_CHEAP)
            or getattr(getattr(node, "_forward_cls", None), "tessera_cheap_backward", False))


def _accumulator(tensor):
    """A leaf's AccumulateGrad node (1.13 makes it lazily and hands it out only as a view's
    next function; the graph holds it, so this is the node the graph uses)."""
    return tensor.view_as(tensor).grad_fn.next_functions[0][0]


class Candidates:
    """Collects candidate anchors during one micro-batch's forward: the output tensors of the
    modules of `module` that own parameters, by grad_fn. Use as a context manager around the
    forward; the hooks are on the modules only inside it."""

    def __init__(self, module):
        self._modules = [m for m in module.modules()
                         if any(True for _ in m.parameters(recurse=False))]
        self.by_node = {}
        self._handles = []

    def _record(self, module, inputs, output):
        for value in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                self.by_node.setdefault(value.grad_fn, value)

    def __enter__(self):
        self._handles = [m.register_forward_hook(self._record) for m in self._modules]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False


class WeightWork:
    """What W runs for one micro-batch: per group, (anchors, their gradients, parameters); and
    the whole parameters with the roots they are differentiated from. Holds the graph."""

    def __init__(self, groups, whole_params, roots, seeds):
        self.groups = groups
        self.whole_params = whole_params
        self.roots = roots if whole_params else []
        self.seeds = seeds if whole_params else []

    def run(self):
        """Accumulates the weights' gradients into .grad (autograd.backward's accumulation,
        as a full backward's), then drops the graph."""
        for anchors, grads, params in self.groups:
            torch.autograd.backward(anchors, grad_tensors=grads, inputs=params,
                                    retain_graph=True)
        if self.whole_params:
            torch.autograd.backward(self.roots, grad_tensors=self.seeds,
                                    inputs=self.whole_params, retain_graph=True)
        self.groups, self.whole_params, self.roots, self.seeds = [], [], [], []


def _consumers(root_nodes):
    """node -> the nodes taking its output, one entry per edge, over the graph below the
    roots."""
    consumers = collections.defaultdict(list)
    seen = set(root_nodes)
    queue = collections.deque(root_nodes)
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            consumers[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return consumers, seen


def _above(starts, consumers, stop=None):
    """The nodes reachable from `starts` toward the roots; with `stop`, a walk that does not go
    past nodes in it, returning (nodes walked, nodes of `stop` met)."""
    walked, met = set(starts), set()
    queue = collections.deque(starts)
    while queue:
        for node in consumers.get(queue.popleft(), ()):
            if node in walked:
                continue
            if stop is not None and node in stop:
                met.add(node)
                continue
            walked.add(node)
            queue.append(node)
    return walked, met


def _anchor_node(node, candidates, consumers):
    """The node of the candidate that anchors weight node `node`: itself, or the top of a
    short chain of cheap nodes each taking the one output of the one below; or None."""
    for _ in range(_MAX_CHEAP_HOPS + 1):
        if node in candidates:
            return node
        above = consumers.get(node, ())
        if len(above) != 1 or not _cheap(above[0]):
            return None
        node = above[0]
    return None


def _reaches(start, targets):
    """Whether a node of `targets` is reachable from node `start` (toward the leaves)."""
    seen, stack = {start}, [start]
    while stack:
        for child, _ in stack.pop().next_functions:
            if child is None or child in seen:
                continue
            if child in targets:
                return True
            seen.add(child)
            stack.append(child)
    return False


def _groups(anchors_of):
    """Parameters sharing an anchor, merged: [{"params": [...], "anchors": {nodes}}]."""
    groups, owner = [], {}  # owner: anchor node -> its group
    for param, anchors in anchors_of:
        group = {"params": [param], "anchors": set(anchors)}
        joined = {id(owner[a]): owner[a] for a in anchors if a in owner}
        for other in joined.values():
            group["params"] += other["params"]
            group["anchors"] |= other["anchors"]
        groups = [g for g in groups if id(g) not in joined] + [group]
        for anchor in group["anchors"]:
            owner[anchor] = group
    return groups


def backward_input(roots, seeds, inputs, params, candidates):
    """I: the gradients of `inputs` (None for those that take none or that the roots do not
    reach), computed once, and the WeightWork that W runs later. `roots` all require grad;
    `candidates`: a Candidates' by_node of the micro-batch's forward."""
    root_nodes = [t.grad_fn for t in roots if t.grad_fn is not None]
    consumers, graph = _consumers(root_nodes)
    input_nodes = {id(t): _accumulator(t) for t in inputs if t.requires_grad}
    wanted = [t for t in inputs if input_nodes.get(id(t)) in graph]
    input_side, _ = _above([input_nodes[id(t)] for t in wanted], consumers)
    if not wanted:
        # No input takes a gradient (stage 0): I has nothing to do and W is the whole backward,
        # run once. (Walking each parameter's way to the roots would cost nodes x parameters.)
        whole = [p for p in params if _accumulator(p) in graph]
        return [None] * len(inputs), WeightWork([], whole, roots, seeds)
    candidates = dict(candidates)
    for root in roots:
        if root.grad_fn is not None:
            candidates.setdefault(root.grad_fn, root)
    seed_of = {t.grad_fn: s for t, s in zip(roots, seeds) if t.grad_fn is not None}
    # Roots that are leaves, or outputs of one node: rare; W then differentiates the roots.
    splittable = len(root_nodes) == len(roots) == len(seed_of)

    anchors_of, whole = [], []
    for param in params:
        node = _accumulator(param)
        if node not in graph:
            continue  # the roots do not depend on it: no gradient, as in a full backward
        walked, weight_nodes = _above([node], consumers, stop=input_side)
        direct = {n for n in walked if n in seed_of}  # roots independent of the inputs
        anchors = {_anchor_node(n, candidates, consumers) for n in weight_nodes}
        # A root feeding another root takes more than its seed: whole.
        if (not splittable or None in anchors or any(consumers.get(n) for n in direct)):
            whole.append(param)
        else:
            anchors_of.append((param, anchors | direct))
    groups = []
    for group in _groups(anchors_of):
        anchors = group["anchors"]
        if len(anchors) > 1 and any(_reaches(a, anchors - {a}) for a in anchors):
            whole += group["params"]  # anchors on one path: their gradients would add twice
        else:
            groups.append(group)

    # I, with pre-hooks catching the gradients that flow into each anchor on the input side.
    captured = {}
    handles = []
    for group in groups:
        for anchor in group["anchors"]:
            if anchor in input_side:
                handles.append(anchor.register_prehook(
                    lambda grads, anchor=anchor: captured.__setitem__(anchor, grads)))
    try:
        grads = {}
        if wanted:
            computed = torch.autograd.grad(roots, wanted, grad_outputs=seeds,
                                           retain_graph=True, allow_unused=True)
            grads = {id(t): g for t, g in zip(wanted, computed)}
    finally:
        for handle in handles:
            handle.remove()

    work_groups = []
    for group in groups:
        tensors, tensor_grads, split = [], [], True
        for anchor in group["anchors"]:
            tensor = candidates[anchor]
            if anchor not in input_side:
                grad = seed_of[anchor]  # a root independent of the inputs: I did not run it
            else:
                flowing = captured.get(anchor, ())
                # Only the anchor's own output may take a gradient: W seeds it alone.
                if any(g is not None for i, g in enumerate(flowing) if i != tensor.output_nr):
                    split = False
                    break
                grad = flowing[tensor.output_nr] if tensor.output_nr < len(flowing) else None
            if grad is not None:
                tensors.append(tensor)
                tensor_grads.append(grad)
        if not split:
            whole += group["params"]
        elif tensors:
            work_groups.append((tensors, tensor_grads, group["params"]))
    return [grads.get(id(t)) for t in inputs], WeightWork(work_groups, whole, roots, seeds)
