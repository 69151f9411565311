"""Auto-wrap policies of tessera's FSDP, with the names and signatures of
torch.distributed.fsdp.wrap (which does not import with Debian's torch 1.13 on Python 3.11).

A policy is called as policy(module, recurse, nonwrapped_numel): with recurse=True it says
whether to look into module's children for units; with recurse=False whether module itself
(with nonwrapped_numel parameters not yet in a unit below it) becomes a unit. The arguments go
positionally, so torch 1.13's own policies (third parameter `unwrapped_params`) work too.
"""

import torch.nn as nn

__all__ = ["size_based_auto_wrap_policy", "transformer_auto_wrap_policy",
           "lambda_auto_wrap_policy", "ModuleWrapPolicy"]


def size_based_auto_wrap_policy(module, recurse, nonwrapped_numel, min_num_params=int(1e8),
                                force_leaf_modules=None, exclude_wrap_modules=None):
    """A unit for every module holding at least min_num_params parameters not already in a
    unit below it; never looks into force_leaf_modules, never wraps exclude_wrap_modules."""
    if force_leaf_modules is None:
        force_leaf_modules = size_based_auto_wrap_policy.FORCE_LEAF_MODULES
    if exclude_wrap_modules is None:
        exclude_wrap_modules = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
    is_large = nonwrapped_numel >= min_num_params
    if recurse:
        return is_large and not isinstance(module, tuple(force_leaf_modules))
    return is_large and not isinstance(module, tuple(exclude_wrap_modules))


# torch's defaults: containers have no forward of their own, and MultiheadAttention reads its
# parameters outside its children's forward.
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}


def transformer_auto_wrap_policy(module, recurse, nonwrapped_numel, transformer_layer_cls):
    """A unit for every instance of the classes in transformer_layer_cls (a set of classes)."""
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


def lambda_auto_wrap_policy(module, recurse, nonwrapped_numel, lambda_fn):
    """A unit for every module for which lambda_fn(module) is true."""
    if recurse:
        return True
    return bool(lambda_fn(module))


class ModuleWrapPolicy:
    """A unit for every instance of the given module classes (later torch releases' policy
    object); callable like the policy functions."""

    def __init__(self, module_classes):
        self._module_classes = tuple(module_classes)

    def __call__(self, module, recurse, nonwrapped_numel):
        if recurse:
            return True
        return isinstance(module, self._module_classes)
