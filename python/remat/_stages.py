"""A chain's stages as the C++ core takes them, from an ``nn.Sequential`` or a list: shared by
``profile`` (_api.py) and ``Checkpointable`` (_checkpointable.py), which imports _api."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Tuple

from torch import nn


def _stage_specs(module: Any, takes_context: bool = False) -> Tuple[list, "OrderedDict[str, Any]"]:
    """(name, callable, takes_context) for each stage, and the stages by name."""
    if isinstance(module, nn.Sequential):
        if type(module).forward is not nn.Sequential.forward:
            raise TypeError(
                f"{type(module).__name__} is an nn.Sequential with a forward of its own, which remat "
                "would not run (it runs the children one after the other): give the chain as "
                "an nn.Sequential or a list of its stages")
        items = list(module.named_children())
    elif isinstance(module, nn.ModuleList):
        items = list(module.named_children())
    elif isinstance(module, nn.Module):
        raise TypeError(
            f"a {type(module).__name__} is one module, not a chain: give an nn.Sequential, a list of "
            "modules, or a list of (name, module) pairs")
    else:
        try:
            items = list(module)
        except TypeError:
            raise TypeError(f"a chain is an nn.Sequential or a list of stages, not a {type(module).__name__}") from None
        named = []
        for i, item in enumerate(items):
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                named.append(item)
            else:
                named.append((str(i), item))
        items = named
    if not items:
        raise ValueError("the chain has no stages")
    stages: "OrderedDict[str, Any]" = OrderedDict()
    for name, stage in items:
        if not callable(stage):
            raise TypeError(f"stage {name!r} is a {type(stage).__name__}, which is not callable")
        if name in stages:
            raise ValueError(f"two stages are named {name!r}")
        stages[name] = stage
    specs = [(name, stage, takes_context) for name, stage in stages.items()]
    return specs, stages
