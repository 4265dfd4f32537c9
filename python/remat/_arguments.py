"""The Python API's arguments, checked before they reach the C++ core, for both remat.profile
and remat.solve (_api.py) and the Checkpointable classes (_checkpointable.py, _model.py): whole
numbers within the core's types and limits, the link, a bound on host memory, the sample as a
list of tensors, the profiler's options and its progress line. It imports nothing of remat's
but the extension, so that the modules above it import it and not each other."""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Callable, NamedTuple, Optional, Tuple, Union

import torch

from . import _C

_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1  # C++'s int: counts of repetitions, segments, points
_MAX_THREADS = _C.MAX_THREADS  # the core's limits (kMaxThreads, ...), as the CLI's
_MAX_STAGES = _C.MAX_STAGES


class Link(NamedTuple):
    """The device's link to host memory, for schedules that offload activations
    (docs/cost-model.md, "Offload"): bandwidths in GB/s (10**9 bytes per second) each way, and
    the fixed time of each copy in milliseconds. A copy of ``n`` bytes out takes
    ``latency_ms + n / (d2h_gbps * 1e6)`` ms."""

    d2h_gbps: float
    h2d_gbps: float
    latency_ms: float


def _link_tuple(link: Optional[Any]) -> Optional[tuple]:
    """``link`` (a Link or a 3-tuple) as the C++ core takes it, or TypeError."""
    if link is None:
        return None
    try:
        d2h, h2d, latency = link
        return (float(d2h), float(h2d), float(latency))
    except (TypeError, ValueError):
        raise TypeError("link must be a remat.Link(d2h_gbps, h2d_gbps, latency_ms) or None, not "
                        f"{link!r}") from None



def _whole(name: str, value: Any, low: int, high: int = _INT64_MAX) -> int:
    """``value`` as an int from ``low`` to ``high``, or TypeError/ValueError naming ``name``:
    the C++ core takes 64- or 32-bit integers, and a bad one must not reach it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number, not {type(value).__name__}")
    value = int(value)
    if value < low:
        raise ValueError(f"{name} ({value}) must be at least {low}")
    if value > high:
        raise ValueError(f"{name} ({value}) must be at most {high}")
    return value


def _solver_arguments(slots: int, segments: int, threads: int) -> tuple:
    """Checks the solver's integer options before they reach C++ (whose own checks say which
    algorithm each applies to)."""
    return (_whole("slots", slots, 0), _whole("segments", segments, 0, _INT32_MAX),
            _whole("threads", threads, 0, _MAX_THREADS))



def host_memory_bytes(host_memory: Optional[Union[int, str]]) -> int:
    """A bound on host memory as the solver takes it: -1 for None (no bound), else bytes, from an
    int or a size (``"16GiB"``). Raises ValueError naming it."""
    if host_memory is None:
        return -1
    if isinstance(host_memory, bool) or not isinstance(host_memory, (int, str)):
        raise TypeError(f"host_memory: {host_memory!r} is neither bytes (an int) nor a size "
                        "such as '16GiB'")
    if isinstance(host_memory, str):
        try:
            return _C.parse_size(host_memory)
        except ValueError as error:
            raise ValueError(f"host_memory: {error}") from None
    if host_memory < 0:
        raise ValueError(f"host_memory ({host_memory}) must be at least 0 bytes (None: no bound)")
    return host_memory


def _host_memory_option(host_memory: Optional[Union[int, str]], offload: bool
                        ) -> Optional[Union[int, str]]:
    """``host_memory`` as given, checked now (and needing ``offload``), for a later solve."""
    if host_memory is not None:
        host_memory_bytes(host_memory)
        if not offload:
            raise ValueError(f"host_memory={host_memory!r} bounds the offloaded copies: it needs "
                             "offload=True")
    return host_memory



def _progress(total_label: str) -> Callable[[int, int, str], None]:
    """A progress callback: tqdm if installed, else one line rewritten on stderr."""
    try:
        from tqdm.auto import tqdm  # type: ignore
    except ImportError:
        tqdm = None
    state: dict = {}

    def update(stage: int, stages: int, name: str) -> None:
        if tqdm is not None:
            bar = state.get("bar")
            if bar is None:
                bar = state["bar"] = tqdm(total=stages, desc=f"profile {total_label}", unit="stage", leave=False)
            bar.n = stage
            bar.set_postfix_str(name if stage < stages else "", refresh=True)
            if stage >= stages:
                bar.close()
            return
        if not sys.stderr.isatty():
            return
        if stage < stages:
            sys.stderr.write(f"\rremat: profiling {total_label}: stage {stage + 1}/{stages} ({name})\x1b[K")
        else:
            sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()

    return update


def _as_list(x: Any, what: str = "sample") -> list:
    """A tensor, or a tuple or list of tensors, as a list; TypeError naming ``what`` (and the
    item) for anything else, such as a NumPy array."""
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return [x]
    def kind(obj: Any) -> str:
        hint = " (torch.from_numpy converts an array)" if type(obj).__module__ == "numpy" else ""
        return f"{type(obj).__module__}.{type(obj).__name__}{hint}"

    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{what} must be a tensor or a tuple or list of tensors, not {kind(x)}")
    for i, item in enumerate(x):
        if not isinstance(item, torch.Tensor):
            raise TypeError(f"{what}[{i}] must be a tensor, not {kind(item)}")
    return list(x)


_TIMINGS = ("auto", "stages", "passes")


# What measuring costs by default: about this many training steps (docs/python.md, "What
# measuring costs").
DEFAULT_MEASURE_STEPS = 3.0
# The C++ core's limits (kMaxProfileRepeat, kMaxTradeoffPoints), checked here before any work.
_MAX_PROFILE_REPEAT = _C.MAX_PROFILE_REPEAT
_MAX_TRADEOFF_POINTS = _C.MAX_TRADEOFF_POINTS


def _measuring(repeat: Optional[int], measure_steps: Optional[float]) -> Tuple[int, float]:
    """(repeat, max_steps) for the profiler: bounded by ``measure_steps`` training steps (3 by
    default), or, with only ``repeat`` given, by its count of timed runs."""
    if measure_steps is None:
        measure_steps = DEFAULT_MEASURE_STEPS if repeat is None else 0.0
    elif (isinstance(measure_steps, bool) or not isinstance(measure_steps, numbers.Real)
          or not math.isfinite(measure_steps) or measure_steps <= 0):
        raise ValueError(f"measure_steps must be a positive number of training steps, not {measure_steps!r}")
    if measure_steps > _MAX_PROFILE_REPEAT:
        raise ValueError(f"measure_steps ({measure_steps!r}) must be at most {_MAX_PROFILE_REPEAT}")
    return (5 if repeat is None else _whole("repeat", repeat, 1, _MAX_PROFILE_REPEAT)), float(measure_steps)


def _profile_arguments(repeat: int, warmup: int, measure_time: bool, name: str,
                       loss: Optional[Callable], output_held: bool, progress: bool,
                       timing: str = "auto", max_steps: float = 0.0) -> tuple:
    """The profiler's options, as remat._C's profile and Checkpointable.measure take them."""
    if loss is not None and not callable(loss):
        raise TypeError(f"loss must be callable, not {type(loss).__name__}")
    if timing not in _TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(map(repr, _TIMINGS))}, not {timing!r}")
    return (_whole("repeat", repeat, 1, _MAX_PROFILE_REPEAT),
            _whole("warmup", warmup, 0, _MAX_PROFILE_REPEAT),
            bool(measure_time), str(name),
            None if loss is None else (lambda outs: loss(*outs)), bool(output_held),
            _progress(name or "chain") if progress else None, timing, float(max_steps))



def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, the noun plural unless n is 1: "1 stage", "3 stages" (as the C++
    core's remat::counted)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
