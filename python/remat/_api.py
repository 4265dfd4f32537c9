"""Chains, solutions and trade-offs: the C++ solver's, with pictures for Jupyter."""

from __future__ import annotations

import numbers
import os
from typing import Any, Callable, Optional, Union

import torch

from . import _C
from ._arguments import (_INT64_MAX, _MAX_TRADEOFF_POINTS, Link, _as_list, _host_memory_option,
                         _link_tuple, _measuring, _profile_arguments, _solver_arguments, _whole,
                         counted, host_memory_bytes)
from ._stages import _stage_specs

Budget = Union[int, str]


def measure_link(device: Union[str, torch.device] = "cpu", *, nbytes: int = 64 * 2**20,
                 repeat: int = 5) -> Link:
    """Measures the link between ``device`` and host memory, with copies as the runtime makes
    them (a GPU: pinned memory, a stream of its own; the CPU: host memory outside LibTorch's
    allocator): the latency of a small copy and the bandwidth of copies of ``nbytes`` each way,
    medians of ``repeat`` measurements (docs/python.md, "Offload")."""
    nbytes = _whole("nbytes", nbytes, 2**20, 2**32)
    repeat = _whole("repeat", repeat, 1, 1000)
    return Link(*_C.measure_link(str(torch.device(device)), nbytes, repeat))


def parse_budget(budget: Budget, store_all_peak: Optional[int] = None,
                 least: Union[None, int, Callable[[], int]] = None) -> int:
    """A budget in bytes from bytes (``700 * 2**20``), a size (``"700MiB"``, ``"1.5GB"``), a
    percentage of the store-all peak (``"50%"``, which needs ``store_all_peak``), ``"min"``, the
    least budget any schedule fits, or a size or percentage followed by ``+`` (``"50%+"``): that,
    or the least where it is more. The last two need ``least``, the least budget (bytes, or a
    function returning them; -1 when no budget is enough), which ``Checkpointable``,
    ``compute_sequence`` and ``solve`` work out themselves."""
    if isinstance(budget, bool):
        raise TypeError("a budget is bytes (an int) or a string such as '700MiB' or '50%', not a bool")
    if isinstance(budget, numbers.Integral):
        budget = int(budget)
        if budget < 0:
            raise ValueError(f"the budget ({budget} bytes) must not be negative")
        if budget > _INT64_MAX:
            raise ValueError(f"the budget ({budget} bytes) must be at most 2^63-1 bytes")
        return budget
    if not isinstance(budget, str):
        raise TypeError(
            f"a budget is bytes (an int) or a string such as '700MiB' or '50%', not {type(budget).__name__}")
    text = budget.strip()
    if text.rstrip("+").rstrip().endswith("%") and store_all_peak is None:
        raise ValueError(f"budget {budget!r}: a percentage needs the store-all peak (measure first)")
    if _C.budget_needs_least(text):
        _C.check_budget_syntax(text)
        if least is None:
            raise ValueError(f"budget {budget!r} depends on the chain's least budget: give it to "
                             "Checkpointable, compute_sequence or solve, which work that out")
        least = least() if callable(least) else least
    else:
        least = None
    # The CLI's parser: the same sizes, and percentages floored exactly.
    return _C.parse_budget(text, 0 if store_all_peak is None else store_all_peak, least)


def check_budget(budget: Budget) -> None:
    """Raises TypeError or ValueError when ``budget`` is not one parse_budget reads, before the
    chain (its store-all peak, its least budget) is known."""
    if isinstance(budget, str):
        _C.check_budget_syntax(budget.strip())
    else:
        parse_budget(budget, 1)


def peak_during(step: Callable[[], Any], device: Union[str, torch.device] = "cpu") -> int:
    """The peak bytes allocated on ``device`` while ``step()`` runs, above what was allocated
    just before it: what a budget counts (docs/python.md, "Measuring a step's peak").

    On the CPU, remat's tracker: every allocation of LibTorch's CPU allocator, a kernel's
    scratch memory included (installed at the first call; memory allocated before then is
    simply not counted). On CUDA, the caching allocator's own statistics
    (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, which it resets),
    the device synchronized before and after. ``step``'s result is dropped."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    if device.type != "cpu":
        raise ValueError(f"peak_during measures on the CPU or CUDA, not {device}")
    return int(_C.peak_during(step, "cpu"))


def keep_freed_memory(pad_bytes: int = 256 * 2**20) -> bool:
    """Asks glibc's allocator to keep the memory the process frees instead of returning it to
    the operating system, so that training steps after the first take no page faults (on the
    CPU, 5-13% of a step in docs/performance.md; checkpointed schedules, which free stage by
    stage, pay more of them than plain autograd). Process-wide and lasting: the resident size
    stays at its peak, plus up to ``pad_bytes`` mapped but untouched; blocks above 32 MiB are
    still mapped and unmapped by glibc. remat never calls it on its own. Returns False where
    it does nothing (not glibc)."""
    if isinstance(pad_bytes, bool) or not isinstance(pad_bytes, int) or pad_bytes < 0:
        raise ValueError(f"pad_bytes must be a non-negative int, not {pad_bytes!r}")
    return _C.keep_freed_memory(pad_bytes)


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.50 KiB"``, as the CLI prints sizes."""
    return _C.format_bytes(int(n))


def _write_text(path: Union[str, os.PathLike], text: str) -> None:
    # The CLI's writer: a temporary made by mkstemp in the same folder, then a rename; never
    # half a file, never through a planted link, never onto a directory, FIFO or device.
    try:
        _C.write_text_file(os.fspath(path), text)
    except RuntimeError as error:
        raise OSError(str(error)) from None


class Chain:
    """A profiled chain: each stage's forward and backward times and what it keeps in memory,
    in the JSON format of ``remat profile`` (docs/cost-model.md)."""

    def __init__(self, chain: "_C.Chain"):
        self._chain = chain

    @staticmethod
    def load(path: Union[str, os.PathLike]) -> "Chain":
        """Reads a chain file (``remat-chain/1`` or ``/2``); ValueError names the field that is wrong."""
        return Chain(_C.Chain.load(os.fspath(path)))

    @staticmethod
    def from_json(text: str, source: str = "chain") -> "Chain":
        return Chain(_C.Chain.from_json(text, source))

    def to_json(self) -> str:
        return self._chain.to_json()

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the chain file (through a temporary file: never half a file); OSError if it
        cannot, as ``save_svg``."""
        _write_text(path, self.to_json())

    @property
    def name(self) -> str:
        return self._chain.name

    @property
    def stage_names(self) -> list:
        return self._chain.stage_names

    @property
    def fwd_ms(self) -> list:
        return self._chain.fwd_ms

    @property
    def bwd_ms(self) -> list:
        return self._chain.bwd_ms

    @property
    def input_bytes(self) -> int:
        return self._chain.input_bytes

    @property
    def output_bytes(self) -> list:
        """Bytes of each stage's output activation x_1 .. x_L."""
        return self._chain.output_bytes

    @property
    def loss_tmp_bytes(self) -> int:
        """The loss's own memory, beyond x_L and its gradient (0 when no loss was measured)."""
        return self._chain.loss_tmp_bytes

    @property
    def output_held(self) -> bool:
        """Whether the step keeps the chain's output until it ends (True: counted from the loss
        to the step's end, the loss measured with it held), or lets it go once the loss has its
        value (False)."""
        return self._chain.output_held

    @property
    def restart_ms(self) -> float:
        """What a forward right after a backward (a recomputation's start) costs more, in ms:
        measured on a GPU, 0 on the CPU (docs/cost-model.md, "The time model")."""
        return self._chain.restart_ms

    @property
    def link(self) -> Optional[Link]:
        """The device's link to host memory (a chain file of version 3 holds one), which a
        schedule that offloads needs; None without one."""
        link = self._chain.link
        return None if link is None else Link(*link)

    def with_link(self, link: Optional[Link]) -> "Chain":
        """A copy of the chain with ``link`` (None: without one); ValueError for bandwidths
        outside 0.001 to 10**6 GB/s, or a negative latency."""
        return Chain(self._chain.with_link(_link_tuple(link)))

    def __eq__(self, other: object) -> bool:
        """Chains are equal when their files would be (every figure, every name)."""
        return isinstance(other, Chain) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (Chain.from_json, (self.to_json(), "a pickled chain"))

    def __len__(self) -> int:
        return self._chain.length

    def store_all_peak(self) -> int:
        """The peak of store-all (every activation kept), in bytes."""
        return self._chain.store_all_peak()

    def store_all_ms(self) -> float:
        return self._chain.store_all_ms()

    def min_budget(self, algorithm: str = "optimal", *, offload: bool = False,
                   host_memory: Optional[Union[int, str]] = None) -> int:
        """The least budget ``algorithm`` finds a schedule for (with ``offload``, one that may
        offload: it needs the chain's link; ``host_memory`` bounds what its copies hold)."""
        return _C.min_feasible_budget(
            self._chain, algorithm, offload=bool(offload),
            host_memory=host_memory_bytes(_host_memory_option(host_memory, offload)))

    def svg(self) -> str:
        """Per-stage bars: times above, bytes below (SVG text)."""
        return self._chain.profile_svg()

    def save_svg(self, path: Union[str, os.PathLike]) -> None:
        _write_text(path, self.svg())

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        return (f"remat.Chain({self.name!r}, {counted(len(self), 'stage')}, store-all peak "
                f"{format_bytes(self.store_all_peak())}, {self.store_all_ms():.1f} ms)")


class Solution:
    """A schedule: its status (``optimal``, ``feasible`` or ``infeasible``, with the least
    budget that works), the operations, the predicted peak and time.

    What its bytes count: from ``remat.solve``, the chain's own memory (its input, activations,
    gradients and loss, docs/cost-model.md); from a ``Checkpointable``'s ``compute_sequence``,
    also ``Checkpointable.reserve_bytes()`` (the runtime's reserve and
    ``loss_tmp_memory_usage``), so that ``budget_bytes``, ``peak_bytes`` and
    ``min_feasible_budget_bytes`` are the whole step's there, as its budget is."""

    def __init__(self, solution: "_C.Solution", chain: Chain):
        self._solution = solution
        self.chain = chain

    ok = property(lambda self: self._solution.ok, doc="Whether a schedule was found.")
    status = property(lambda self: self._solution.status)
    algorithm = property(lambda self: self._solution.algorithm)
    budget_bytes = property(lambda self: self._solution.budget_bytes)
    peak_bytes = property(lambda self: self._solution.peak_bytes, doc="Predicted peak, in bytes.")
    makespan_ms = property(lambda self: self._solution.makespan_ms, doc="Predicted time of a step.")
    store_all_makespan_ms = property(lambda self: self._solution.store_all_makespan_ms)
    min_feasible_budget_bytes = property(
        lambda self: None if self._solution.min_feasible_budget_bytes < 0 else self._solution.min_feasible_budget_bytes,
        doc="The least budget the algorithm accepts; None when none is enough (too few slots).")
    solve_seconds = property(lambda self: self._solution.solve_seconds)
    solved_budget_bytes = property(
        lambda self: self._solution.solved_budget_bytes,
        doc="optimal: the budget the dynamic program solved for; more than budget_bytes on a "
            "chain with carried members, whose schedule's exact peak still fits the budget.")
    merged_stages = property(
        lambda self: self._solution.merged_stages,
        doc="optimal: 0, or the number of stages of the merged chain (each run of stages that "
            "carries a member solved as one stage) whose schedule, expanded, this is.")
    exact_storages = property(
        lambda self: self._solution.exact_storages,
        doc="optimal: whether the storage-exact table (every storage counted once) was solved "
            "too: the schedule is then at least as fast as the best nested one at its unit.")
    warning = property(lambda self: self._solution.warning)
    offloads = property(lambda self: self._solution.offloads,
                        doc="Checkpoints the schedule copies to host memory and back (O_i).")
    copy_wait_ms = property(
        lambda self: self._solution.copy_wait_ms,
        doc="Of makespan_ms, the time the computation waits for copies that do not overlap it.")
    host_peak_bytes = property(lambda self: self._solution.host_peak_bytes,
                               doc="The most host memory the copies hold at once.")
    sequence = property(lambda self: self._solution.sequence,
                        doc="The operations, runs collapsed: 'CF_0 Fn_1..4 ...'.")
    operations = property(lambda self: self._solution.operations)

    def svg(self) -> str:
        """The schedule's timeline and memory over time (SVG text)."""
        if not self.ok:
            raise ValueError(f"no schedule to draw: {self._needs()}")
        return _C.schedule_svg(self.chain._chain, self._solution)

    def save_svg(self, path: Union[str, os.PathLike]) -> None:
        _write_text(path, self.svg())

    def _repr_svg_(self) -> Optional[str]:
        return self.svg() if self.ok else None

    def _needs(self) -> str:
        least = self.min_feasible_budget_bytes
        if least is None:
            return (f"no budget is enough for {self.algorithm} with these slots, "
                    f"budget {format_bytes(self.budget_bytes)}")
        return (f"{self.algorithm} needs at least {_C.format_bytes_exact(least)}, "
                f"budget {_C.format_bytes_exact(self.budget_bytes)}")

    def __repr__(self) -> str:
        if not self.ok:
            return f"remat.Solution(infeasible: {self._needs()})"
        slower = 100 * (self.makespan_ms / self.store_all_makespan_ms - 1) if self.store_all_makespan_ms else 0
        return (f"remat.Solution({self.status}, {self.algorithm}, peak {format_bytes(self.peak_bytes)} "
                f"of {format_bytes(self.budget_bytes)}, {self.makespan_ms:.2f} ms "
                f"({_C.format_signed_percent(slower)} against store-all))")


class Tradeoff:
    """Makespan against budget for the optimal, revolve and periodic schedules."""

    def __init__(self, tradeoff: "_C.Tradeoff", chain: Chain):
        self._tradeoff = tradeoff
        self.chain = chain

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_tradeoff":  # copy and pickle look before __init__
            raise AttributeError(name)
        return getattr(self._tradeoff, name)

    def svg(self) -> str:
        return _C.tradeoff_svg(self.chain._chain, self._tradeoff)

    def save_svg(self, path: Union[str, os.PathLike]) -> None:
        _write_text(path, self.svg())

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        t = self._tradeoff
        if not t.budgets:
            return f"remat.Tradeoff({self.chain.name!r}, no budgets)"
        least = t.budgets[0]

        def at_least(points: list) -> str:
            p = points[0]
            if not p.feasible:
                return "infeasible"
            slower = 100 * (p.makespan_ms / t.store_all_makespan_ms - 1) if t.store_all_makespan_ms else 0
            return _C.format_signed_percent(slower)

        return (f"remat.Tradeoff({self.chain.name!r}, {len(t.budgets)} budgets from "
                f"{format_bytes(least)} to {format_bytes(t.budgets[-1])}; at {format_bytes(least)}, "
                f"against store-all: optimal {at_least(t.optimal)}, revolve {at_least(t.revolve)}, "
                f"periodic {at_least(t.periodic_best)})")


def solve(chain: Chain, budget: Budget, algorithm: str = "optimal", *, slots: int = 0,
          segments: int = 0, threads: int = 0, exact_storages: bool = True,
          offload: bool = False, host_memory: Optional[Union[int, str]] = None) -> Solution:
    """The fastest schedule of ``algorithm`` within ``budget`` (bytes, ``"700MiB"`` or ``"50%"``
    of the chain's store-all peak). An infeasible budget is a result (``ok`` is False), not an
    exception. ``exact_storages=False`` leaves out the storage-exact table (docs/algorithms.md).
    ``offload=True`` (optimal only; the chain needs a link, ``Chain.with_link``): a checkpoint
    may also be copied to host memory and back where that beats keeping or recomputing it;
    ``host_memory`` (bytes or ``"16GiB"``) bounds what the copies hold at once."""
    slots, segments, threads = _solver_arguments(slots, segments, threads)
    host = host_memory_bytes(_host_memory_option(host_memory, offload))
    budget_bytes = parse_budget(budget, chain.store_all_peak(),
                                lambda: _C.min_feasible_budget(chain._chain, algorithm, slots,
                                                               segments, bool(exact_storages),
                                                               bool(offload), host))
    return Solution(_C.solve(chain._chain, budget_bytes, algorithm, slots, segments, threads,
                             bool(exact_storages), bool(offload), host), chain)


def tradeoff(chain: Chain, *, points: int = 25, from_budget: Budget = 0, to_budget: Budget = 0,
             slots: int = 0, threads: int = 0) -> Tradeoff:
    """Each algorithm's makespan over a grid of budgets (0: the least budget and store-all)."""
    peak = chain.store_all_peak()
    for name, value in (("from_budget", from_budget), ("to_budget", to_budget)):
        if isinstance(value, str) and _C.budget_needs_least(value):
            raise ValueError(f"{name}={value!r}: the table's budgets are sizes or percentages; it "
                             "starts at the least budget when from_budget is left out")
    slots, _, threads = _solver_arguments(slots, 0, threads)
    return Tradeoff(_C.tradeoff(chain._chain, parse_budget(from_budget, peak), parse_budget(to_budget, peak),
                                _whole("points", points, 2, _MAX_TRADEOFF_POINTS), slots, threads), chain)


def profile(module: Any, sample: Any, *, context: Any = None, loss: Optional[Callable] = None,
            output_held: bool = True, repeat: Optional[int] = None, warmup: int = 1,
            measure_time: bool = True, name: str = "", progress: bool = True, timing: str = "auto",
            measure_steps: Optional[float] = None) -> Chain:
    """Measures each stage of ``module`` (an ``nn.Sequential``, a list of modules or of
    (name, module) pairs) on ``sample`` (a tensor or a tuple of them): times, and what each
    keeps for its backward, in bytes. On the CPU this installs remat's tracking CPU allocator
    in the process (docs/python.md). ``loss`` and ``output_held``: as for
    ``Checkpointable``. ``timing``: ``"stages"`` times each stage alone, ``"passes"`` within
    whole forward and backward passes as in a step (it needs the store-all memory), ``"auto"``
    the latter on a GPU where it fits (docs/cost-model.md, "How times are taken").
    ``measure_steps``: measuring takes about that many training steps at most (3 unless
    ``repeat`` is given, which then times each quantity that many times; docs/python.md, "What
    measuring costs")."""
    specs, _ = _stage_specs(module, takes_context=context is not None)
    inputs = _as_list(sample)
    repeat, max_steps = _measuring(repeat, measure_steps)
    return Chain(_C.profile(specs, inputs, _as_list(context, "context"),
                            *_profile_arguments(repeat, warmup, measure_time, name, loss,
                                                output_held, progress, timing, max_steps)))
