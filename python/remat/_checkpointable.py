"""rotor's API on remat's C++ runtime: ``Checkpointable`` and ``checkpoint_sequential``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import _C
from ._api import (Budget, Chain, Solution, _as_list, _profile_arguments, _solver_arguments, _whole,
                   format_bytes, parse_budget)

StageList = Union[nn.Sequential, Sequence[nn.Module], Sequence[Tuple[str, Callable]]]


def _stage_specs(module: Any, takes_context: bool = False) -> Tuple[list, "OrderedDict[str, Any]"]:
    """(name, callable, takes_context) for each stage, and the stages by name."""
    if isinstance(module, nn.Sequential):
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


class Checkpointable(nn.Module):
    """A chain of modules trained in at most ``budget`` bytes of activation memory, by
    recomputing what the optimal schedule does not keep. Gradients, BatchNorm statistics and
    dropout masks equal plain training's.

    ``module`` is an ``nn.Sequential``, a list of modules, or a list of (name, module) pairs;
    each stage is called with the previous stage's outputs (a tensor, or a tuple of tensors
    passed as positional arguments). ``sample`` (a tensor or tuple) is measured now if given,
    else the first input of a training step is. ``budget`` is bytes, ``"700MiB"`` or ``"50%"``
    of the store-all peak; without one, a CUDA chain gets the free memory of its GPU and a CPU
    chain the store-all peak (nothing recomputed).

    The budget covers the chain. A loss computed from its output (say, cross-entropy over a
    language model's logits) allocates memory of its own: give it as ``loss`` (called with the
    chain's outputs, returning a scalar) and it is measured and counted in the budget too.
    The step is taken to keep the chain's output until it ends (``out = model(x)``, the loss,
    ``loss.backward()``), as most training loops do, and the output is counted so. If the step
    lets it go once the loss has its value (``loss_fn(model(x)).backward()``), say so with
    ``output_held=False``: the budget then gains up to the output's size (a language model's
    logits), and a step that keeps the output after all may exceed it by as much.

    In eval mode or under ``torch.no_grad()`` the modules run plainly.

    Example::

        model = remat.Checkpointable(nn.Sequential(...), budget="50%")
        model(x).sum().backward()
    """

    def __init__(self, module: StageList, sample: Any = None, budget: Optional[Budget] = None, *,
                 context: Any = None, loss: Optional[Callable] = None, output_held: bool = True,
                 repeat: int = 5, progress: bool = True):
        super().__init__()
        specs, stages = _stage_specs(module, takes_context=context is not None)
        # The modules are registered here (parameters(), state_dict(), .to(), DDP): an
        # nn.Sequential as `module` (its keys are then "module.<its keys>"), a list's modules as
        # a ModuleList.
        if isinstance(module, nn.Sequential):
            self.module = module
        else:
            self.module = nn.ModuleList([s for s in stages.values() if isinstance(s, nn.Module)])
        self._callables = stages  # every stage, modules and plain callables, in order
        self._impl = _C.Checkpointable(specs)
        self._takes_context = context is not None
        self._repeat = _whole("repeat", repeat, 1, 2**31 - 1)
        self._loss = loss
        self._output_held = output_held
        self._progress = progress
        if budget is not None:
            parse_budget(budget, 1)  # a bad budget now, not at the first step
        self.budget = budget
        if sample is not None:
            self.measure(sample, context=context, loss=loss)
            if budget is not None:
                self.compute_sequence(budget)

    # ---- measure and solve -------------------------------------------------------------

    def measure(self, sample: Any, *, context: Any = None, loss: Optional[Callable] = None,
                output_held: Optional[bool] = None) -> Chain:
        """Profiles the chain on ``sample`` (its shapes, dtypes and device are those of the
        training inputs; a larger input is refused later). ``loss`` and ``output_held``
        (default: the constructor's) are measured with it. Under ``torch.autocast``, measure
        under the autocast of training: the activations' sizes depend on it."""
        if loss is None:
            loss = self._loss
        if output_held is None:
            output_held = self._output_held
        chain = self._impl.measure(_as_list(sample), _as_list(context, "context"),
                                   *_profile_arguments(self._repeat, 1, True, "", loss, output_held,
                                                       self._progress))
        return Chain(chain)

    @property
    def chain(self) -> Chain:
        """The measured (or given) chain."""
        if not self._impl.has_chain():
            raise RuntimeError("no chain yet: call measure(sample), or run a training step")
        return Chain(self._impl.chain)

    def set_chain(self, chain: Chain) -> None:
        """Uses a chain measured earlier (``remat.Chain.load``)."""
        self._impl.set_chain(chain._chain)

    def store_all_peak(self) -> int:
        """Store-all's peak, the runtime's reserve included: what ``"100%"`` means."""
        return self._impl.store_all_peak()

    def min_budget(self, algorithm: str = "optimal") -> int:
        """The least budget ``compute_sequence`` accepts."""
        return self._impl.min_budget(algorithm)

    def compute_sequence(self, budget: Optional[Budget] = None, algorithm: str = "optimal", *,
                         slots: int = 0, segments: int = 0) -> Solution:
        """Solves for ``budget`` (default: the one given to the constructor). Returns the
        solution; an infeasible budget is not an exception here (``ok`` is False, and the
        least budget is given), but training then raises ValueError naming it."""
        if budget is None:
            budget = self.budget if self.budget is not None else self._default_budget()
        budget_bytes = parse_budget(budget, self.store_all_peak())
        self.budget = budget
        slots, segments, _ = _solver_arguments(slots, segments, 0)
        solution = self._impl.compute_sequence(budget_bytes, algorithm, slots, segments)
        return Solution(solution, self.chain)

    @property
    def solution(self) -> Solution:
        return Solution(self._impl.solution, self.chain)

    def _default_budget(self) -> int:
        device = torch.device(self._impl.device)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        return self.store_all_peak()

    # ---- run ---------------------------------------------------------------------------

    def _plain(self, inputs: List[torch.Tensor], context: List[torch.Tensor]) -> Any:
        x: Any = tuple(inputs)
        for stage in self._callables.values():
            args = tuple(x) + (tuple(context) if self._takes_context else ())
            x = stage(*args)
            if isinstance(x, torch.Tensor):
                x = (x,)
        return x[0] if len(x) == 1 else tuple(x)

    def forward(self, *inputs: torch.Tensor, context: Any = None) -> Any:
        context_list = _as_list(context, "context")
        if not self.training or not torch.is_grad_enabled():
            return self._plain(list(inputs), context_list)
        if not self._impl.has_chain():
            self.measure(tuple(inputs), context=context, loss=self._loss)
        if not self._impl.has_sequence():
            solution = self.compute_sequence(self.budget)
            if not solution.ok:
                raise ValueError(f"remat: no schedule fits the budget for this chain: {solution._needs()}")
        outputs = self._impl.forward(_as_list(inputs, "input"), context_list)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def extra_repr(self) -> str:
        if not self._impl.has_chain():
            return "not measured yet"
        if not self._impl.has_sequence():
            return f"{len(self._callables)} stages, no sequence yet"
        s = self._impl.solution
        return (f"{len(self._callables)} stages, budget {format_bytes(s.budget_bytes)}: predicted peak "
                f"{format_bytes(s.peak_bytes)}, {s.makespan_ms:.2f} ms")


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad) for t in inputs)


def checkpoint_sequential(functions: StageList, budget: Budget, input: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input)`` with a
    budget in bytes (``700 * 2**20``, ``"700MiB"`` or ``"50%"`` of the store-all peak) in place
    of the segment count. The chain is measured on the first input of each shape and solved
    once; the schedule is optimal for the budget, and BatchNorm statistics are updated once
    per step, as in plain training. Extra keyword arguments of torch's function
    (``use_reentrant``, ``preserve_rng_state``) are accepted and ignored: remat always restores
    the random state when it recomputes."""
    unknown = set(kwargs) - {"use_reentrant", "preserve_rng_state"}
    if unknown:
        raise TypeError(f"checkpoint_sequential() got unexpected keyword arguments {sorted(unknown)}")
    inputs = _as_list(input, "input")
    if isinstance(functions, nn.Sequential):
        holder, modules = functions, functions
    else:
        modules = list(functions)
        if not modules or not all(isinstance(f, nn.Module) for f in modules):
            raise TypeError("checkpoint_sequential takes an nn.Sequential or a list of modules")
        holder = modules[0]
    # The Checkpointable lives on the chain itself (a reference cycle the garbage collector
    # frees with it): one per chain and per input signature and budget, the latest only.
    key = (tuple(id(m) for m in modules), _signature(inputs), str(budget))
    cached = holder.__dict__.get("_remat_checkpoint_sequential")
    if cached is None or cached[0] != key:
        chk = Checkpointable(functions if isinstance(functions, nn.Sequential) else modules,
                             tuple(inputs), budget)
        cached = (key, chk)
        object.__setattr__(holder, "_remat_checkpoint_sequential", cached)
    chk = cached[1]
    chk.training = holder.training
    return chk(*inputs)
