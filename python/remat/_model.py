"""``remat.Checkpointable`` over any module: the model as it comes, captured and split into a
chain by remat itself (``_graph``), then measured, solved and run by the same C++ runtime as a
chain of stages. docs/python.md, "Any model"."""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import nn
from torch.utils import _pytree as pytree

from . import _C
from ._api import Budget, Chain, check_budget, format_bytes
from ._arguments import (_MAX_STAGES, Link, _host_memory_option, _link_tuple, _measuring,
                         _profile_arguments, _whole, counted)
from ._checkpointable import Checkpointable, _use_wrapped_keys
from ._graph import CapturedGraph, CaptureError

_DEFAULT_MAX_STAGES = 300


class ModelCheckpointable(Checkpointable):
    """A model that is not written as a chain, trained in at most ``budget`` bytes: its forward
    captured for the sample's signature (``torch.export``, non-strict), split into a chain by
    remat, measured, and run under the optimal schedule. Made by ``remat.Checkpointable(model,
    sample, budget)`` for any ``nn.Module`` that is not an ``nn.Sequential`` or a list.

    ``sample`` is what the model is called with: a tensor, a tuple of positional arguments, or
    a dict of keyword arguments (a Hugging Face batch). The model is called as before,
    ``out = wrapped(**batch)``, and returns what it returns (its ``ModelOutput``, its loss).
    Its parameters, buffers and ``state_dict()`` keys are the model's own. A call whose
    signature differs from the sample's (shapes, dtypes, keyword names, non-tensor values) is
    captured, measured and solved anew; the last 4 signatures are kept. In eval mode or without
    autograd the model runs plainly.
    """

    def __init__(self, module: nn.Module, sample: Any = None, budget: Optional[Budget] = None, *,
                 loss: Optional[Callable] = None, output_held: bool = True,
                 repeat: Optional[int] = None, measure_steps: Optional[float] = None,
                 progress: bool = True, max_stages: int = _DEFAULT_MAX_STAGES,
                 offload: bool = False, link: Optional[Link] = None,
                 host_memory: Optional[Union[int, str]] = None, **rotor: Any):
        nn.Module.__init__(self)
        unknown = set(rotor) - {"custom_input", "mem_limit", "mem_slots", "verbosity",
                                "preserve_rng_state", "loss_tmp_memory_usage", "context"}
        if unknown:
            raise TypeError(f"Checkpointable() got unexpected keyword arguments {sorted(unknown)}")
        if rotor.get("context") is not None:
            raise ValueError("context= is for chains of stages; a model takes its inputs as it "
                             "does without remat (sample= as a dict of keyword arguments)")
        sample = rotor.get("custom_input") if sample is None else sample
        budget = rotor.get("mem_limit") if budget is None else budget
        if rotor.get("verbosity") is not None:
            progress = _whole("verbosity", rotor["verbosity"], 0) > 0
        self._extra_loss_bytes = _whole("loss_tmp_memory_usage",
                                        rotor.get("loss_tmp_memory_usage", 0), 0)
        self.module = module
        _use_wrapped_keys(self)
        self._max_stages = _whole("max_stages", max_stages, 1, _MAX_STAGES)
        self._repeat, self._max_steps = _measuring(repeat, measure_steps)
        self._loss = loss
        self._output_held = output_held
        self._progress = progress
        self._takes_context = False
        self._stages_from_module = False
        self._solve_options = {"algorithm": "optimal", "slots": 0, "segments": 0, "threads": 0,
                               "offload": bool(offload),
                               "host_memory": _host_memory_option(host_memory, offload)}
        self._link = _link_tuple(link)
        if self._link is not None:
            _C.check_link(self._link)
        if rotor.get("mem_slots") is not None:
            self._solve_options["slots"] = _whole("mem_slots", rotor["mem_slots"], 0)
        if budget is not None:
            check_budget(budget)  # a bad budget now, not at the first step
        self.budget = budget
        # By input signature: (captured graph, C++ runtime), the latest last.
        self._captures: "OrderedDict[tuple, Tuple[CapturedGraph, Any]]" = OrderedDict()
        self._impl = None
        self._captured = None
        self._mirror_signature()
        if sample is not None:
            args, kwargs = _call_arguments(sample)
            self.measure_call(args, kwargs)
            if budget is not None:
                self.compute_sequence(budget, **self._solve_options)

    def _mirror_signature(self) -> None:
        """``forward``'s signature as the model's: tools that read it (Hugging Face's Trainer
        keeps the dataset's columns the forward names) see the model's arguments."""
        try:
            signature = inspect.signature(self.module.forward)
        except (TypeError, ValueError):
            return

        def forward(*args: Any, **kwargs: Any) -> Any:
            return ModelCheckpointable.forward(self, *args, **kwargs)

        forward.__signature__ = signature
        forward.__doc__ = ModelCheckpointable.forward.__doc__
        object.__setattr__(self, "forward", forward)

    # Copies (deepcopy, pickle, torch.save) capture for themselves: the captures and their C++
    # runtimes are not copied, nor the forward bound to this object.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_captures", "_impl", "_captured", "forward"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_max_steps", 0.0)  # saved before measuring was bounded: counts
        state.setdefault("_link", None)  # saved before offloading
        nn.Module.__setstate__(self, state)
        self._captures = OrderedDict()
        self._impl = None
        self._captured = None
        self._mirror_signature()

    # ---- the model's own keys --------------------------------------------------------------

    # state_dict() and load_state_dict() have the model's own keys (no "module." prefix), also
    # where this is a submodule: _use_wrapped_keys, set in __init__.

    # ---- capture, measure, solve -----------------------------------------------------------

    @property
    def captured(self) -> Optional[CapturedGraph]:
        """The capture of the latest signature: its graph, nodes and split; None before one."""
        return self._captured

    def measure_call(self, args: tuple, kwargs: dict) -> Chain:
        """Captures the model for this call's signature (if new), then measures its chain on
        these arguments; the schedule is solved again at the next step."""
        args, kwargs = _without_cache(self.module, args, kwargs)
        key = _signature(self.module, args, kwargs)
        self._select(key, args, kwargs)
        flat = self._flat_inputs(args, kwargs)
        chain = self._impl.measure(flat, [], *_profile_arguments(
            self._repeat, 1, True, type(self.module).__name__, self._loss_of_outputs(),
            self._output_held, self._progress, max_steps=self._max_steps))
        return Chain(self._with_link(chain))

    def measure(self, sample: Any = None, **kwargs: Any) -> Chain:
        """Measures the model on ``sample`` (a tensor, a tuple of positional arguments or a dict
        of keyword arguments), capturing it first if its signature is new."""
        if kwargs:
            raise TypeError(f"measure() of a model takes only a sample, not {sorted(kwargs)}")
        if sample is None:
            raise TypeError("measure() needs a sample: what the model is called with")
        args, call_kwargs = _call_arguments(sample)
        return self.measure_call(args, call_kwargs)

    def _select(self, key: tuple, args: tuple, kwargs: dict) -> None:
        """Makes the capture of `key` current, capturing the model for it if new."""
        if key in self._captures:
            self._captures.move_to_end(key)
        else:
            captured = CapturedGraph(self.module, args, kwargs, self._max_stages)
            impl = _C.Checkpointable([(name, stage, False) for name, stage in captured.stages()])
            impl.set_outside_bytes(self._extra_loss_bytes)
            self._captures[key] = (captured, impl)
            while len(self._captures) > 4:
                self._captures.popitem(last=False)
        self._captured, self._impl = self._captures[key]

    def _flat_inputs(self, args: tuple, kwargs: dict) -> list:
        captured = self._captured
        leaves, _ = pytree.tree_flatten((args, _in_order(kwargs, captured.in_spec)))
        return [leaf for leaf, name in zip(leaves, captured.user_inputs) if name is not None]

    def _loss_of_outputs(self) -> Optional[Callable]:
        """The constructor's ``loss``, called with the model's outputs as it returns them;
        without one, the model's own loss where its output has one (a Hugging Face model given
        labels): the step's backward starts there, so the chain gives the output's other
        members (the logits) no gradient."""
        captured, loss = self._captured, self._loss
        if loss is None:
            example = [captured.all_nodes[v].meta.get("val") for v in captured.members[-1]]
            if _own_loss(_outputs(captured, example)) is None:
                return None
            loss = _own_loss
        return lambda *members: loss(_outputs(captured, members))

    def _runtimes(self) -> list:
        return [impl for _, impl in self._captures.values()]

    def _check_stages(self) -> None:  # the stages come from the capture, not from children
        if self._impl is None:
            raise RuntimeError("nothing measured yet: give a sample, or run a training step")

    def _default_budget(self) -> int:
        return Checkpointable._default_budget(self)

    # ---- run ---------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward, under the schedule (plainly in eval mode or without autograd)."""
        if not self.training or not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        args, kwargs = _without_cache(self.module, args, kwargs)
        key = _signature(self.module, args, kwargs)
        if key not in self._captures:
            self.measure_call(args, kwargs)
        else:
            self._select(key, args, kwargs)
        self._captured.check_owners()
        if not self._impl.has_sequence():
            solution = self.compute_sequence(**self._solve_options)
            if not solution.ok:
                raise ValueError(f"remat: no schedule fits the budget for this model: {solution._needs()}")
        members = self._impl.forward(self._flat_inputs(args, kwargs), [])
        return _outputs(self._captured, members)

    def extra_repr(self) -> str:
        if self._impl is None or not self._impl.has_chain():
            return "not measured yet"
        stages = counted(len(self._captured.stage_nodes), "stage")
        if not self._impl.has_sequence():
            return f"{stages}, no sequence yet"
        s = self._impl.solution
        return (f"{stages}, budget {format_bytes(s.budget_bytes)}: predicted peak "
                f"{format_bytes(s.peak_bytes)}, {s.makespan_ms:.2f} ms")


def _call_arguments(sample: Any) -> Tuple[tuple, dict]:
    """A sample as the model's (args, kwargs): a tensor, a tuple of positional arguments, or a
    dict (or Mapping, a Hugging Face BatchEncoding) of keyword arguments."""
    if isinstance(sample, torch.Tensor):
        return (sample,), {}
    if isinstance(sample, (tuple, list)):
        return tuple(sample), {}
    if hasattr(sample, "keys") and hasattr(sample, "__getitem__"):
        return (), {str(k): sample[k] for k in sample.keys()}
    raise TypeError(f"sample must be a tensor, a tuple of positional arguments or a dict of "
                    f"keyword arguments, not {type(sample).__name__}")


def _without_cache(model: nn.Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """A Hugging Face model trains without its key-value cache (as its own gradient
    checkpointing does): use_cache=False where the forward takes it and the call did not say."""
    if "use_cache" in kwargs:
        return args, kwargs
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return args, kwargs
    if "use_cache" in parameters and getattr(getattr(model, "config", None), "use_cache", False):
        kwargs = dict(kwargs, use_cache=False)
    return args, kwargs


def _signature(model: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """What a capture depends on: each input's structure, each tensor's shape, dtype, device
    and requires_grad, each other value, and the training flags of the model's modules."""
    leaves, spec = pytree.tree_flatten((args, dict(sorted(kwargs.items()))))
    described = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            described.append(("tensor", tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad))
        else:
            described.append(("value", repr(leaf)))
    modes = tuple(m.training for m in model.modules())
    return (str(spec), tuple(described), modes)


def _in_order(kwargs: dict, in_spec: Any) -> dict:
    """The keyword arguments in the order of the capture's (a dict's keys are its spec)."""
    try:
        child = in_spec.child(1) if hasattr(in_spec, "child") else in_spec.children_specs[1]
        keys = child.context
    except (AttributeError, IndexError):
        return kwargs
    if keys is None or set(keys) != set(kwargs):
        return kwargs
    return {k: kwargs[k] for k in keys}


def _own_loss(out: Any) -> Optional[torch.Tensor]:
    """The model's own loss in its output: the "loss" of a ``ModelOutput`` or a dict, where it
    is one floating-point value; else None."""
    if not isinstance(out, Mapping):
        return None
    value = out.get("loss")
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return value
    return None


def _outputs(captured: CapturedGraph, members: Any) -> Any:
    """The model's return value from the last stage's members."""
    members = list(members) if isinstance(members, (list, tuple)) else [members]
    position = {captured.all_nodes[v].name: j for j, v in enumerate(captured.members[-1])}
    flat = [members[position[name]] for name in captured.user_outputs]
    return pytree.tree_unflatten(flat, captured.out_spec)


Checkpointable._model_class = ModelCheckpointable  # Checkpointable(model, ...) makes one
__all__ = ["ModelCheckpointable", "CaptureError"]
