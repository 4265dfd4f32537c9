"""rotor's API on remat's C++ runtime: ``Checkpointable`` and ``checkpoint_sequential``."""

from __future__ import annotations

import numbers
import warnings
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import _C
from ._api import Budget, Chain, Solution, check_budget, format_bytes, measure_link, parse_budget
from ._arguments import (Link, _as_list, _host_memory_option, _link_tuple, _measuring,
                         _profile_arguments, _solver_arguments, _whole, counted,
                         host_memory_bytes)
from ._stages import _stage_specs

StageList = Union[nn.Sequential, Sequence[nn.Module], Sequence[Tuple[str, Callable]]]


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

    ``offload=True`` lets the schedule also copy checkpoints to host memory and bring them back
    before they are read, where that beats keeping or recomputing them, over ``link``
    (``remat.Link(d2h_gbps, h2d_gbps, latency_ms)``; default: the device's, measured once by
    ``remat.measure_link``). The copies' host memory is not in the budget (the ``host_memory``
    property measures it); ``host_memory=`` (bytes or ``"16GiB"``) bounds it.

    In eval mode or under ``torch.no_grad()`` the modules run plainly.

    Example::

        model = remat.Checkpointable(nn.Sequential(...), budget="50%")
        model(x).sum().backward()
    """

    # The class that trains a model that is not a chain (remat._model sets it: it imports this
    # module, not the other way round).
    _model_class: Optional[type] = None

    def __new__(cls, module: Any = None, *args: Any, **kwargs: Any):
        if cls is Checkpointable and cls._model_class is not None and _is_model(module):
            return super().__new__(cls._model_class)
        return super().__new__(cls)

    def __init__(self, module: StageList, sample: Any = None, budget: Optional[Budget] = None, *,
                 context: Any = None, loss: Optional[Callable] = None, output_held: bool = True,
                 repeat: Optional[int] = None, measure_steps: Optional[float] = None,
                 progress: bool = True, custom_input: Any = None,
                 mem_limit: Optional[Budget] = None, mem_slots: Optional[int] = None,
                 verbosity: Optional[int] = None, preserve_rng_state: bool = True,
                 loss_tmp_memory_usage: int = 0, offload: bool = False,
                 link: Optional[Link] = None, host_memory: Optional[Union[int, str]] = None):
        super().__init__()
        # rotor's names for the same arguments, so that its users change only the import.
        sample = _one_of("sample", sample, "custom_input", custom_input)
        budget = _one_of("budget", budget, "mem_limit", mem_limit)
        if verbosity is not None:
            progress = _whole("verbosity", verbosity, 0) > 0
        del preserve_rng_state  # remat always replays the random state it recomputes with
        self._extra_loss_bytes = _whole("loss_tmp_memory_usage", loss_tmp_memory_usage, 0)
        self._takes_context = context is not None
        self._context_count = 0  # the context tensors' number, for stages run as one
        self._measured_grads: Optional[tuple] = None  # which sample tensors wanted a gradient
        # The modules are registered here (parameters(), state_dict(), .to(), DDP): an
        # nn.Sequential or nn.ModuleList as `module`, a list's modules in an nn.Sequential under
        # their stage names; state_dict() has the module's own keys ("<name>.weight", "0.weight"
        # for a plain list: _use_wrapped_keys).
        self._build(module)
        if isinstance(module, (nn.Sequential, nn.ModuleList)):
            self.module = module
            self._stages_from_module = True
        else:
            self.module = nn.Sequential()
            for name, stage in self._callables.items():
                if not isinstance(stage, nn.Module):
                    continue
                try:
                    self.module.add_module(name, stage)
                except KeyError as error:
                    raise ValueError(
                        f"stage name {name!r} cannot name a module ({error.args[0]}): the stages' "
                        "modules are registered under their names (state_dict keys "
                        "'<name>.<parameter>')") from None
            # Replacing a stage is seen through the nn.Sequential when every stage is a module.
            self._stages_from_module = len(self.module) == len(self._callables)
        _use_wrapped_keys(self)  # state_dict keys: the wrapped module's own
        self._repeat, self._max_steps = _measuring(repeat, measure_steps)
        self._loss = loss
        self._output_held = output_held
        self._progress = progress
        # How forward() solves when it must: the last compute_sequence's choices.
        self._solve_options = {"algorithm": "optimal", "slots": 0, "segments": 0, "threads": 0,
                               "offload": bool(offload),
                               "host_memory": _host_memory_option(host_memory, offload)}
        # The device's link to host memory, given here or by set_link: put on every chain
        # measured or set (a measured chain has none of its own).
        self._link = _link_tuple(link)
        if mem_slots is not None:
            self._solve_options["slots"] = _whole("mem_slots", mem_slots, 0)
        if budget is not None:
            check_budget(budget)  # a bad budget now, not at the first step
        self.budget = budget  # as given; None: the default, worked out at each solve
        if sample is not None:
            self.measure(sample, context=context, loss=loss)
            if budget is not None:
                self.compute_sequence(budget, **self._solve_options)

    def _build(self, stages: Any, groups: Optional[list] = None) -> None:
        """The C++ runtime over ``stages`` (the chain is measured again), consecutive stages run
        as one where ``groups`` (the number of stages in each) says so."""
        specs, callables = _stage_specs(stages, self._takes_context)
        self._callables = callables  # every stage, modules and plain callables, in order
        self._stage_ids = [id(c) for c in callables.values()]
        if groups is None or sum(groups) != len(specs):
            groups = [1] * len(specs)
        self._groups = groups
        fused, start = [], 0
        for size in groups:
            part = specs[start:start + size]
            start += size
            if size == 1:
                fused.append(part[0])
            else:
                fused.append(("+".join(name for name, _, _ in part),
                              _Fused([(name, stage) for name, stage, _ in part],
                                     self._context_count if self._takes_context else 0),
                              self._takes_context))
        self._impl = _C.Checkpointable(fused)
        self._impl.set_outside_bytes(self._extra_loss_bytes)

    def _fold_in_place_stages(self, sample: Sequence[torch.Tensor], context: Sequence[torch.Tensor]) -> None:
        """Runs each stage that changes its input in place within the stage before it (a lone
        ``ReLU(inplace=True)``): the input it changes is then the other stage's own temporary,
        which no schedule needs to keep. Found by one pass without autograd over a copy of
        ``sample``, after which the stages' buffers and the random state are as they were. The
        first stage's change to the chain's input is left for measuring to refuse."""
        names = list(self._callables)
        groups = list(self._groups)
        context_changed = len(context) != self._context_count
        self._context_count = len(context)  # what _build gives the stages run as one
        while True:
            changed = _first_in_place_group(list(self._callables.values()), groups, sample, context,
                                            self._takes_context)
            if changed is None or changed == 0:
                break
            start = sum(groups[:changed])
            warnings.warn(
                f"remat: stage {'+'.join(names[start:start + groups[changed]])!r} changes its input "
                f"in place, so it runs within the stage before it, "
                f"{'+'.join(names[start - groups[changed - 1]:start])!r}, as one stage of the chain",
                stacklevel=4)
            groups[changed - 1:changed + 1] = [groups[changed - 1] + groups[changed]]
        if groups != self._groups or (context_changed and max(groups) > 1):
            self._build(list(self._callables.items()), groups)

    def _check_stages(self) -> None:
        """Builds the runtime again if a stage of the module was replaced (a new head)."""
        if not self._stages_from_module:
            return
        children = list(self.module.named_children())
        if [id(m) for _, m in children] != self._stage_ids:
            self._build(children, self._groups)

    # ---- copies ------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        # The C++ runtime is not copied: a copy (deepcopy, pickle, torch.save) builds its own
        # over the copied stages, with the chain if there was one.
        state = self.__dict__.copy()
        impl = state.pop("_impl")
        state["_chain_json"] = impl.chain.to_json() if impl.has_chain() else None
        return state

    def __setstate__(self, state: dict) -> None:
        chain_json = state.pop("_chain_json", None)
        state.setdefault("_context_count", 0)  # copies saved before stages were run as one
        state.setdefault("_measured_grads", None)
        state.setdefault("_max_steps", 0.0)  # saved before measuring was bounded: counts
        state.setdefault("_link", None)  # saved before offloading
        super().__setstate__(state)
        self._build(list(self._callables.items()), state.get("_groups"))
        if chain_json is not None:
            self._impl.set_chain(_C.Chain.from_json(chain_json, "the copied chain"))

    # ---- measure and solve -------------------------------------------------------------

    def measure(self, sample: Any = None, *, context: Any = None, loss: Optional[Callable] = None,
                output_held: Optional[bool] = None, custom_input: Any = None) -> Chain:
        """Profiles the chain on ``sample`` (its shapes, dtypes and device are those of the
        training inputs; a larger input is refused later). ``loss`` and ``output_held``
        (default: the constructor's) are measured with it. Under ``torch.autocast``, measure
        under the autocast of training: the activations' sizes depend on it."""
        sample = _one_of("sample", sample, "custom_input", custom_input)
        if sample is None:
            raise TypeError("measure() needs a sample (a tensor or a tuple of tensors)")
        if context is not None and not self._takes_context:
            raise ValueError(_NO_CONTEXT)
        self._check_stages()
        if loss is None:
            loss = self._loss
        if output_held is None:
            output_held = self._output_held
        samples, contexts = _as_list(sample), _as_list(context, "context")
        self._fold_in_place_stages(samples, contexts)
        self._measured_grads = _grad_flags(samples)
        chain = self._impl.measure(samples, contexts,
                                   *_profile_arguments(self._repeat, 1, True, "", loss, output_held,
                                                       self._progress, max_steps=self._max_steps))
        return Chain(self._with_link(chain))

    @property
    def chain(self) -> Optional[Chain]:
        """The measured (or given) chain; None before the first measurement."""
        if not self._impl.has_chain():
            return None
        return Chain(self._impl.chain)

    def _measured_chain(self) -> Chain:
        if not self._impl.has_chain():
            raise RuntimeError("no chain yet: call measure(sample), or run a training step")
        return Chain(self._impl.chain)

    def set_chain(self, chain: Chain) -> None:
        """Uses a chain measured earlier (``remat.Chain.load``), with the link given to the
        constructor or ``set_link`` if any, else the chain's own."""
        self._impl.set_chain(chain._chain)
        if self._link is not None:
            self._impl.set_link(self._link)
        self._measured_grads = None  # the chain's own

    def set_link(self, link: Optional[Link]) -> None:
        """The device's link to host memory (``remat.Link(d2h_gbps, h2d_gbps, latency_ms)``),
        which schedules that offload need (``offload=True``): put on the chain now and on every
        chain measured or set later; None removes it. Drops the schedule computed before.
        ValueError for bandwidths outside 0.001 to 10**6 GB/s or a negative latency."""
        link = _link_tuple(link)
        if link is not None:
            _C.check_link(link)  # checked before anything changes
        for impl in self._runtimes():
            if impl.has_chain():
                impl.set_link(link)
        self._link = link

    def _with_link(self, chain: "_C.Chain") -> "_C.Chain":
        """The chain the runtime has just measured, with the link given (``link=``,
        ``set_link``) put on it, if any."""
        if self._link is None:
            return chain
        self._impl.set_link(self._link)
        return self._impl.chain

    def _host_memory(self, host_memory: Any, offload: bool) -> Optional[Union[int, str]]:
        """The bound on host memory a solve takes: the one given, else (``...``) the last one
        kept, where the solve offloads (none where it does not); checked."""
        if host_memory is ...:
            host_memory = self._solve_options.get("host_memory") if offload else None
        return _host_memory_option(host_memory, offload)

    def _ensure_link(self) -> None:
        """For a schedule that offloads: a link on every chain that has none, the one given, or
        else the device's, measured once (measure_link)."""
        runtimes = [impl for impl in self._runtimes() if impl is not None and impl.has_chain()]
        if all(impl.chain.link is not None for impl in runtimes):
            return
        if self._link is None:
            self._link = _link_tuple(measure_link(self._impl.device))
        for impl in runtimes:
            if impl.chain.link is None:
                impl.set_link(self._link)

    def _runtimes(self) -> list:
        """The C++ runtimes whose chains get the link (one here; a model has one per capture)."""
        return [self._impl]

    @property
    def host_memory(self) -> dict:
        """The host memory of the offloads: ``in_use_bytes`` (the copies held now; 0 between
        steps), ``peak_bytes`` (the most held at once since ``reset_host_peak()``),
        ``held_bytes`` (the blocks kept from step to step) and ``blocks`` (how many were ever
        allocated). On a GPU pinned memory; on the CPU memory the device's tracker does not
        count."""
        return dict(self._impl.host_memory)

    def reset_host_peak(self) -> None:
        self._impl.reset_host_peak()

    def free_host_memory(self) -> None:
        """Frees the host blocks no step holds (they are allocated again when needed)."""
        self._impl.free_host_memory()

    def store_all_peak(self) -> int:
        """Store-all's peak, ``reserve_bytes()`` included: what ``"100%"`` means."""
        return self._impl.store_all_peak()

    def reserve_bytes(self) -> int:
        """What comes out of every budget before the schedule is solved for the rest: the
        runtime's own tensors and ``loss_tmp_memory_usage``. Every figure of a solution
        (``budget_bytes``, ``peak_bytes``, ``min_feasible_budget_bytes``), ``min_budget()`` and
        ``store_all_peak()`` include it."""
        self._check_stages()
        return self._impl.reserve_bytes()

    def min_budget(self, algorithm: str = "optimal", *, slots: int = 0, segments: int = 0,
                   exact_storages: bool = True, offload: Optional[bool] = None,
                   host_memory: Union[int, str, None, type(...)] = ...) -> int:
        """The least budget ``compute_sequence`` accepts with these options (``offload`` and
        ``host_memory``: default, the constructor's or the last ``compute_sequence``'s)."""
        slots, segments, _ = _solver_arguments(slots, segments, 0)
        if offload is None:
            offload = self._solve_options.get("offload", False)
        return self._impl.min_budget(algorithm, slots, segments, bool(exact_storages), bool(offload),
                                     host_memory_bytes(self._host_memory(host_memory, offload)))

    def compute_sequence(self, budget: Optional[Budget] = None, algorithm: str = "optimal", *,
                         slots: int = 0, segments: int = 0, threads: int = 0,
                         exact_storages: bool = True, offload: Optional[bool] = None,
                         host_memory: Union[int, str, None, type(...)] = ...,
                         custom_mem_limit: Optional[Budget] = None,
                         mem_slots: Optional[int] = None,
                         mem_limit: Optional[Budget] = None) -> Solution:
        """Solves for ``budget`` (default: the last one given, to the constructor or to an
        earlier ``compute_sequence``, which keeps it in ``budget``; else the default budget,
        worked out at each solve). Returns the solution; an infeasible budget is not an
        exception here (``ok`` is False, and the least budget is given), but training then
        raises ValueError naming it. Training steps solve again, when they must (after ``measure``), with the same
        algorithm and options. ``custom_mem_limit`` and ``mem_slots`` are rotor's names for
        ``budget`` and ``slots``, and so is ``mem_limit``, its keyword in rotor's documented
        example. ``exact_storages=False`` leaves out the storage-exact table
        (docs/algorithms.md), to see what it buys on a stage list that carries members.
        ``offload=True`` (optimal only): checkpoints may also be copied to host memory and back
        (docs/python.md, "Offload"), over the link given (``link=``, ``set_link``), else the
        chain's, else the device's, measured once (``remat.measure_link``); default, the
        constructor's or the last call's. ``host_memory`` (bytes or ``"16GiB"``, with offload;
        None: no bound) bounds what the copies hold on the host at once; default, the
        constructor's or the last call's."""
        budget = _one_of("budget", budget, "custom_mem_limit", custom_mem_limit)
        budget = _one_of("budget", budget, "mem_limit", mem_limit)
        if mem_slots is not None:
            slots = _whole("mem_slots", mem_slots, 0)
        self._check_stages()
        given = budget if budget is not None else self.budget
        slots, segments, threads = _solver_arguments(slots, segments, threads)
        offload = bool(self._solve_options.get("offload", False) if offload is None else offload)
        host_memory = self._host_memory(host_memory, offload)
        if offload:
            self._ensure_link()
        budget_bytes = parse_budget(
            given if given is not None else self._default_budget(), self.store_all_peak(),
            lambda: self.min_budget(algorithm, slots=slots, segments=segments,
                                    exact_storages=exact_storages, offload=offload,
                                    host_memory=host_memory))
        # The runtime's reserve and rotor's loss_tmp_memory_usage come out of the budget in the
        # C++ runtime (reserve_bytes()), and every figure of the solution includes them.
        solution = self._impl.compute_sequence(budget_bytes, algorithm, slots, segments, threads,
                                               bool(exact_storages), offload,
                                               host_memory_bytes(host_memory))
        if budget is not None:
            self.budget = budget
        self._solve_options = {"algorithm": algorithm, "slots": slots, "segments": segments,
                               "threads": threads, "exact_storages": bool(exact_storages),
                               "offload": offload, "host_memory": host_memory}
        return Solution(solution, self._measured_chain())

    @property
    def solution(self) -> Optional[Solution]:
        """The last ``compute_sequence``'s solution, feasible or not (``ok``); None before the
        first, and after a new ``measure``."""
        try:
            solution = self._impl.solution
        except RuntimeError:  # none yet
            return None
        return Solution(solution, self._measured_chain())

    def _default_budget(self) -> int:
        device = torch.device(self._impl.device)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        return self.store_all_peak()

    # ---- run ---------------------------------------------------------------------------

    def forward(self, *inputs: torch.Tensor, context: Any = None) -> Any:
        context_list = _as_list(context, "context")
        if context is not None and not self._takes_context:
            raise ValueError(_NO_CONTEXT)
        self._check_stages()
        if not self.training or not torch.is_grad_enabled():
            return _run_plainly(self._callables.values(), inputs, context_list)
        if (not self._impl.has_chain()
                or (self._measured_grads not in (None, _grad_flags(inputs))
                    and all(isinstance(t, torch.Tensor) for t in inputs))):
            # First step; or an input that wants its gradient now, measured without one (rotor's
            # example sets requires_grad after measuring): measured anew, its gradient counted.
            self.measure(tuple(inputs), context=context, loss=self._loss)
        if not self._impl.has_sequence():
            solution = self.compute_sequence(**self._solve_options)
            if not solution.ok:
                raise ValueError(f"remat: no schedule fits the budget for this chain: {solution._needs()}")
        outputs = self._impl.forward(_as_list(inputs, "input"), context_list)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # ---- where a step's time goes ----------------------------------------------------

    def trace_next_step(self, memory: bool = False) -> None:
        """Makes the next training step record its operations: once the backward of its loss
        has run, ``last_trace`` lists them, each timed where it ran (between CUDA events on a
        GPU: the GPU's own timeline), and ``trace_summary`` sums them by kind (docs/python.md).
        The steps after it are not traced. With ``memory=True``, each operation's peak memory
        and the memory it leaves are measured too, against the prediction. remat's tracker
        resets its peak before each operation: on the CPU it is raised back at the step's end;
        on a GPU, ``torch.cuda.max_memory_allocated()`` is then the last operation's peak."""
        self._impl.trace_next_step(bool(memory))

    @property
    def last_trace(self) -> list:
        """The operations of the last traced step, in order: dicts with ``operations`` (their
        text: ``"Fe_3"``, ``"B_9..7"`` for consecutive backwards that one engine call ran),
        ``kind`` (``forward``, ``loss``, ``recomputation`` or ``backward``), ``first`` and
        ``last`` (their indices in the sequence), ``start_ms``, ``measured_ms`` and
        ``predicted_ms``; ``measured_peak_bytes`` and ``measured_after_bytes`` (the peak while
        they ran and the memory live after them, above the memory live before the step's first
        operation; None unless traced with ``memory=True``), ``predicted_peak_bytes`` and
        ``predicted_after_bytes`` (the same as the schedule predicts them). Empty until a
        traced step's backward has run."""
        return self._impl.last_trace

    @property
    def trace_summary(self) -> dict:
        """``last_trace`` summed by kind: for ``forward``, ``loss``, ``recomputation`` and
        ``backward``, the number of operations and their predicted and measured ms; then
        ``between_ms`` (the time between operations, the runtime's own work), ``caller_ms``
        (between the forward phase and the backward: the caller's loss), and the step's
        ``predicted_ms`` and ``measured_ms`` (without ``caller_ms``)."""
        return self._impl.trace_summary

    def extra_repr(self) -> str:
        if not self._impl.has_chain():
            return "not measured yet"
        if not self._impl.has_sequence():
            return f"{counted(len(self._callables), 'stage')}, no sequence yet"
        s = self._impl.solution
        return (f"{counted(len(self._callables), 'stage')}, budget {format_bytes(s.budget_bytes)}: predicted peak "
                f"{format_bytes(s.peak_bytes)}, {s.makespan_ms:.2f} ms")


_NO_CONTEXT = ("context given, but this Checkpointable was built without one: its stages would "
               "not see it. Give context= to the constructor (its stages are then called with "
               "the context tensors after their inputs)")


# The wrapped module's own keys in state_dict() and load_state_dict(), also where the wrapper
# is a submodule of a larger model (whose state_dict() and load_state_dict() reach it by
# _save_to_state_dict and _load_from_state_dict, not by its state_dict methods): the
# "module." of the attribute that holds the wrapped module goes when saving, and comes back
# when loading a key without it (a checkpoint of the plain model; one with it loads too).
def _keys_without_wrapper(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:  # the modules' versions, under the same names
        for key in [k for k in metadata if k == inner[:-1] or k.startswith(inner)]:
            renamed = prefix + key[len(inner):]
            value = metadata.pop(key)
            metadata.setdefault(renamed[:-1] if renamed.endswith(".") else renamed, value)


def _keys_with_wrapper(state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                       missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in list(metadata) if k.startswith(prefix) and not k.startswith(inner)
                    and k != prefix[:-1]]:
            metadata.setdefault(inner + key[len(prefix):], metadata[key])


def _use_wrapped_keys(module: nn.Module) -> None:
    module._register_state_dict_hook(_keys_without_wrapper)
    module._register_load_state_dict_pre_hook(_keys_with_wrapper)


def _is_model(module: Any) -> bool:
    """Whether ``module`` is one model rather than a chain of stages: an nn.Module that is not
    an nn.Sequential (or is one with a forward of its own) nor an nn.ModuleList."""
    if not isinstance(module, nn.Module) or isinstance(module, nn.ModuleList):
        return False
    return not isinstance(module, nn.Sequential) or type(module).forward is not nn.Sequential.forward


def _one_of(name: str, value: Any, rotor_name: str, rotor_value: Any) -> Any:
    """``value``, or rotor's keyword for it; both given is an error."""
    if rotor_value is None:
        return value
    if value is not None:
        raise TypeError(f"{name} and {rotor_name} (rotor's name for it) both given")
    return rotor_value


def _through(stages: Any, inputs: Sequence[Any], context: Sequence[torch.Tensor] = ()) -> Any:
    """``stages`` run one after the other, each called with the previous one's outputs (a
    tensor is one output), then the context tensors if any: the last one's outputs, a tuple
    (or what a stage returned that is neither a tensor nor a tuple)."""
    x: Any = tuple(inputs)
    for stage in stages:
        x = stage(*x, *context)
        if isinstance(x, torch.Tensor):
            x = (x,)
    return x


def _run_plainly(stages: Any, inputs: Sequence[torch.Tensor], context: Sequence[torch.Tensor] = ()) -> Any:
    """The chain without a schedule (eval mode, no autograd): each stage called with the
    previous one's outputs, then the context tensors if any."""
    x = _through(stages, inputs, context)
    return x[0] if len(x) == 1 else tuple(x)


def _grad_flags(inputs: Sequence[Any]) -> tuple:
    """Which of ``inputs`` want a gradient (anything but a tensor does not: the runtime names
    it as what it is)."""
    return tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)


def _first_in_place_group(stages: list, groups: list, sample: Sequence[torch.Tensor],
                          context: Sequence[torch.Tensor], takes_context: bool) -> Optional[int]:
    """The first of ``groups`` (consecutive stages run as one) that changes its input in place,
    run without autograd on a copy of ``sample``, or None. The stages' buffers (BatchNorm's
    statistics) and the random state are left as they were."""
    if not all(isinstance(t, torch.Tensor) and not t.is_inference() for t in list(sample) + list(context)):
        return None  # measuring says what is wrong with them (inference tensors: no versions)
    modules = [s for s in stages if isinstance(s, nn.Module)]
    saved = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
    modes = [(sub, sub.training) for m in modules for sub in m.modules()]
    devices = sorted({t.device.index or 0 for t in sample if t.device.type == "cuda"})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            for m in modules:
                m.train(True)  # as measuring and training run them
            x: Any = tuple(t.detach().clone() for t in sample)
            extra = tuple(context) if takes_context else ()
            start = 0
            for index, size in enumerate(groups):
                inputs = [t for t in x if isinstance(t, torch.Tensor) and not t.is_inference()]
                versions = [t._version for t in inputs]
                try:
                    x = _through(stages[start:start + size], x, extra)
                except Exception:  # measuring names the stage and what went wrong
                    return None
                start += size
                if [t._version for t in inputs] != versions:
                    return index
                if not isinstance(x, (tuple, list)):
                    return None  # measuring says what is wrong with it
            return None
    finally:
        for m, mode in modes:
            m.training = mode
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


class _Fused(nn.Module):
    """Consecutive stages run as one stage of the chain (each called with the previous one's
    outputs, then the context tensors if any). Not registered anywhere: the stages' modules
    are the Checkpointable's."""

    def __init__(self, stages: list, context_count: int):
        super().__init__()
        self._stages = [stage for _, stage in stages]
        for name, stage in stages:
            if isinstance(stage, nn.Module):
                self.add_module(name.replace(".", "_"), stage)
        self._context_count = context_count

    def forward(self, *args: torch.Tensor) -> Any:
        count = len(args) - self._context_count
        return _run_plainly(self._stages, args[:count], args[count:])


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad) for t in inputs)


class _ScheduleCache(dict):
    """The Checkpointables ``checkpoint_sequential`` made for a chain, by input signature and
    budget, kept on the chain's first module. A copy of that module (deepcopy, pickle,
    torch.save) gets an empty cache: the copy measures for itself."""

    MAX_ENTRIES = 4  # the latest signatures: a smaller last batch, a validation shape

    def __reduce__(self) -> tuple:
        return (_ScheduleCache, ())

    def __deepcopy__(self, memo: dict) -> "_ScheduleCache":
        return _ScheduleCache()


def checkpoint_sequential(functions: StageList, budget: Optional[Budget] = None, input: Any = None,
                          **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input)`` with a
    budget in bytes (``700 * 2**20``, ``"700MiB"`` or ``"50%"`` of the store-all peak;
    ``"min"``, as little as possible; ``"50%+"``, 50% or the least where more) in place of the
    segment count. The chain is measured on the first input of each shape and solved
    once (the schedules of the last 4 shapes are kept); the schedule is optimal for the budget,
    and BatchNorm statistics are updated once per step, as in plain training. In eval mode or
    without autograd the functions run plainly. ``functions`` is an ``nn.Sequential`` or a list
    of modules and callables, with at least one module. Extra keyword arguments of torch's
    function (``use_reentrant``, ``preserve_rng_state``, ``determinism_check``, ``debug``) are
    accepted and ignored: remat always restores the random state when it recomputes, and
    checks what each recomputation returns. ``progress`` (default True) shows measuring."""
    if "segments" in kwargs:
        raise TypeError(
            f"remat.checkpoint_sequential takes a memory budget, not torch's segments="
            f"{kwargs['segments']!r}: remat chooses what to keep. Give the budget in bytes "
            "(700 * 2**20), as a size ('700MiB') or as a share of the store-all peak ('50%'): "
            "remat.checkpoint_sequential(functions, '50%', input)")
    if budget is None:
        raise TypeError("remat.checkpoint_sequential needs a budget: bytes (700 * 2**20), a size "
                        "('700MiB') or a share of the store-all peak ('50%')")
    if input is None:
        raise TypeError("remat.checkpoint_sequential needs the input: checkpoint_sequential("
                        "functions, budget, input)")
    unknown = set(kwargs) - {"use_reentrant", "preserve_rng_state", "determinism_check", "debug",
                             "progress"}
    if unknown:
        raise TypeError(f"checkpoint_sequential() got unexpected keyword arguments {sorted(unknown)}")
    if isinstance(budget, numbers.Integral) and not isinstance(budget, bool) and 0 < budget <= 64:
        raise ValueError(f"checkpoint_sequential: a budget of {budget} bytes: remat takes memory "
                         "(bytes, '700MiB' or '50%'), not torch's number of segments")
    inputs = _as_list(input, "input")
    if isinstance(functions, nn.Sequential):
        holder, stages = functions, functions
    else:
        stages = list(functions.children()) if isinstance(functions, nn.ModuleList) else list(functions)
        modules = [f for f in stages if isinstance(f, nn.Module)]
        if not modules:
            raise TypeError("checkpoint_sequential takes an nn.Sequential or a list of modules and "
                            "callables with at least one module (it keeps its schedule there)")
        holder = modules[0]
    if not holder.training or not torch.is_grad_enabled():
        return _run_plainly(stages, inputs)
    # The cache lives on the chain itself (a reference cycle the garbage collector frees with
    # it): one Checkpointable per chain, input signature and budget.
    cache = holder.__dict__.get("_remat_checkpoint_sequential")
    if not isinstance(cache, _ScheduleCache):
        cache = _ScheduleCache()
        object.__setattr__(holder, "_remat_checkpoint_sequential", cache)
    key = (tuple(id(f) for f in stages), _signature(inputs), str(budget))
    chk = cache.pop(key, None)
    if chk is None:
        chk = Checkpointable(stages, tuple(inputs), budget, progress=bool(kwargs.get("progress", True)))
        while len(cache) >= _ScheduleCache.MAX_ENTRIES:
            cache.pop(next(iter(cache)))
    cache[key] = chk  # the latest last
    chk.training = True
    return chk(*inputs)
