"""PyTorch's side of the remat throughput benchmark: plain autograd and
torch.utils.checkpoint.checkpoint_sequential on torchvision networks, split into the same
stages as remat's C++ ports (see torchvision_stages.py).

    python bench/pytorch_baseline.py --model resnet50 --batch 32 --image 224 --device cuda \
        --steps 20 --warmup 3 --rounds 1 --segments all --json out.json [--threads N]

The training step: forward, cross-entropy on random integer targets (Inception v3 with its
auxiliary classifier: loss(logits) + 0.4 * loss(aux_logits), torchvision's recipe and remat's),
backward. The network is built after torch.manual_seed(0) and runs in train mode. Parameter
gradients are allocated before measuring and zeroed (set_to_none=False) before each step,
outside the timed region, as remat's `train` command does; the input batch and the targets
are allocated once. No optimizer update.

Configurations: "plain-pytorch" runs the torchvision model itself under plain autograd;
"checkpoint_sequential" runs checkpoint_sequential(chain, K, x, use_reentrant=False) on the
chain of stages, for each K of --segments ("all": K = 2 .. floor(2 sqrt(L)), capped at L, for
L stages; or a comma list). The chain shares the model's parameters. As PyTorch defines it,
checkpoint_sequential checkpoints the first K - 1 segments of floor(L / K) stages and runs the
rest of the chain (the last segment) under plain autograd.

Measurements, per configuration:
- step time: the median of --steps timed steps after --warmup untimed ones
  (time.perf_counter; on CUDA, torch.cuda.synchronize() before reading the clock). With
  --rounds R > 1 the configurations take turns: in each of R rounds each runs its share of
  the timed steps (the first steps mod R rounds one more), after --warmup untimed steps at
  its first turn and one at each later turn. A slow spell of the machine (a VM's host
  busy elsewhere, clocks) then falls on every configuration alike, not on whichever ran
  through it: the best configuration at equal memory is the fastest of several measurements,
  and one measured in a fast spell alone would set the bar too high (an H200 measured
  checkpoint_sequential K=8 on inception_v3 at 649 and at 820 images/s in two calls,
  docs/performance.md).
- peak activation bytes: the peak of memory during the step minus the memory live just
  before it (parameters, gradients, input, targets).
  On CUDA: torch.cuda.reset_peak_memory_stats() and memory_allocated() before each timed
  step, max_memory_allocated() after it; the largest over the timed steps (caching-allocator
  sizes, rounded up to 512 bytes per block).
  On CPU there is no allocator statistic: one extra untimed step runs under
  torch.profiler.profile(activities=[CPU], profile_memory=True), and the peak is the maximum
  of the running sum of its "[memory]" events' byte deltas (allocations positive, frees
  negative) in time order, read from prof.profiler.kineto_results.events() (exact tensor
  sizes). Checked by hand: for a 1000-2000-10 MLP at batch 64 this gives 8,520,008 bytes,
  the 8 MB weight gradient of the first layer, the 512 KB gradient of its output, its bias
  gradient and two 4-byte scalars, all live at once.
A configuration that runs out of CUDA memory is recorded as {"oom": true}.

Output: a table on stdout, one progress line per configuration on stderr and, with --json,
{"model", "batch", "image", "device", "torch", "device_name", "threads" (torch's intra-op
threads), "stages", "steps", "rounds", "results": [{"method", "segments" (null for plain),
"median_ms", "step_ms", "peak_bytes", "images_per_s"} or {"method", "segments", "oom": true}]}.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # no "gpuGetDeviceCount failed" on CPU-only hosts
# On a GPU, every block the caching allocator hands out is its tensor's size rounded up to 512
# bytes, as remat's profiler makes it (remat::exact_cuda_blocks, docs/cost-model.md), so that
# every method is measured alike; a setting given in the environment is kept.
if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint_sequential  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchvision_stages import NAMES, chain_of, split_inception_output, torchvision_model  # noqa: E402

MIN_IMAGE = {"inception_v3": 299, "inception_v3_noaux": 75}  # others: 32


def parse_args(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line (argparse exits 2 on bad arguments)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=NAMES)
    p.add_argument("--batch", type=_positive, default=32)
    p.add_argument("--image", type=_positive, default=224, help="square input size")
    p.add_argument("--classes", type=_positive, default=1000)
    p.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    p.add_argument("--steps", type=_positive, default=20, help="timed steps (median)")
    p.add_argument("--warmup", type=_non_negative, default=3)
    p.add_argument("--rounds", type=_positive, default=1,
                   help="rounds in which the configurations take turns (the timed steps split among them)")
    p.add_argument("--segments", default="all", help='"all" (2 .. floor(2 sqrt(L))) or a comma list')
    p.add_argument("--threads", type=_positive, help="torch.set_num_threads")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if args.image < MIN_IMAGE.get(args.model, 32):
        p.error(f"--image: {args.model} needs at least {MIN_IMAGE.get(args.model, 32)}"
                + (" (its auxiliary classifier; inception_v3_noaux takes 75)"
                   if args.model == "inception_v3" else ""))
    args.device = parse_device(p, args.device)
    return p, args


def parse_device(p: argparse.ArgumentParser, text: str) -> torch.device:
    """--device: "cpu" or a CUDA device that is available, else a usage error (exit 2)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        p.error(f"--device: invalid device {text!r}")
    if device.type not in ("cpu", "cuda"):
        p.error("--device: cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device: CUDA is not available")
    return device


def _int_at_least(text: str, low: int) -> int:
    """An argparse type: an integer >= low."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}")
    return value


def _positive(text: str) -> int:
    return _int_at_least(text, 1)


def _non_negative(text: str) -> int:
    return _int_at_least(text, 0)


def segment_counts(spec: str, stages: int) -> list[int]:
    """K values from --segments for a chain of `stages` stages; ValueError if invalid."""
    if spec == "all":
        return list(range(2, min(stages, math.isqrt(4 * stages)) + 1))  # floor(2 sqrt(L))
    try:
        counts = [int(k) for k in spec.split(",")]
    except ValueError:
        raise ValueError(f'expected "all" or a comma list of integers, got {spec!r}') from None
    if any(not 1 <= k <= stages for k in counts):
        raise ValueError(f"segment counts must be between 1 and {stages} (the stages)")
    return counts


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_peak_bytes(step: Callable[[], None]) -> int:
    """Peak of the running sum of CPU allocations minus frees during one call of `step`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as prof:
            step()
        events = prof.profiler.kineto_results.events()
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    running = peak = 0
    for _, nbytes in deltas:
        running += nbytes
        peak = max(peak, running)
    return peak


def round_plan(configs: int, steps: int, warmup: int, rounds: int) -> list[tuple[int, int, int]]:
    """The turns of `configs` configurations, in order, as (configuration, untimed steps, timed
    steps): `rounds` rounds (at most `steps`), in each of which every configuration takes its
    turn; `warmup` untimed steps at its first turn and min(1, warmup) at each later one (other
    configurations ran in between); the timed steps split among the rounds, the first
    steps % rounds rounds taking one more."""
    rounds = min(rounds, steps)
    return [(c, warmup if r == 0 else min(1, warmup), steps // rounds + (r < steps % rounds))
            for r in range(rounds) for c in range(configs)]


def training_step(forward: Callable[[torch.Tensor], torch.Tensor | tuple], x: torch.Tensor,
                  target: torch.Tensor, classes: int) -> Callable[[], None]:
    """One training step of `forward` on the batch: forward, cross-entropy, backward."""

    def step() -> None:
        out = forward(x)
        if isinstance(out, torch.Tensor):
            logits, aux = split_inception_output(out, classes)
        else:  # torchvision's InceptionOutputs
            logits, aux = out
        loss = F.cross_entropy(logits, target)
        if aux is not None:
            loss = loss + 0.4 * F.cross_entropy(aux, target)
        loss.backward()

    return step


def summary(times: list[float], peak: int, batch: int) -> dict:
    """A configuration's result from its timed steps and its peak."""
    median = statistics.median(times)
    return {"median_ms": median, "step_ms": times, "peak_bytes": peak,
            "images_per_s": batch / (median / 1e3)}


def timed_steps(step: Callable[[], None], model: torch.nn.Module, device: torch.device,
                steps: int, warmup: int, cpu_peak: bool = True) -> tuple[list[float], int]:
    """The times in ms of `steps` calls of `step` after `warmup` untimed ones, `model`'s
    gradients zeroed in place before each, and the peak bytes above what was live before a
    step, as the module docstring says (CUDA: the largest over the timed steps; CPU: one more
    step under the profiler's memory events, unless `cpu_peak` is false: then 0)."""
    cuda = device.type == "cuda"
    times, peak = [], 0
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        ms = (time.perf_counter() - start) * 1e3
        if i >= warmup:
            times.append(ms)
            if cuda:
                peak = max(peak, torch.cuda.max_memory_allocated(device) - before)
    if not cuda and cpu_peak:
        model.zero_grad(set_to_none=False)
        peak = cpu_peak_bytes(step)
    return times, peak


def format_bytes(n: int) -> str:
    """1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def main(argv: list[str] | None = None) -> int:
    """Runs every configuration, prints the table, writes the JSON; returns the exit status."""
    parser, args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torchvision_model(args.model, args.classes).to(args.device).train()
    chain = chain_of(model, args.model)
    try:
        counts = segment_counts(args.segments, len(chain))
    except ValueError as error:
        parser.error(f"--segments: {error}")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    x = torch.randn(args.batch, 3, args.image, args.image, device=args.device)
    target = torch.randint(args.classes, (args.batch,), device=args.device)

    configs: list[tuple[str, int | None, Callable]] = [("plain-pytorch", None, model)]
    configs += [("checkpoint_sequential", k,
                 lambda t, k=k: checkpoint_sequential(chain, k, t, use_reentrant=False))
                for k in counts]
    steps = [training_step(forward, x, target, args.classes) for _, _, forward in configs]
    times: list[list[float]] = [[] for _ in configs]
    peaks = [0] * len(configs)
    oom = [False] * len(configs)
    rounds = min(args.rounds, args.steps)  # as round_plan takes them
    plan = round_plan(len(configs), args.steps, args.warmup, rounds)
    last_turn = {c: n for n, (c, _, _) in enumerate(plan)}
    for n, (c, untimed, timed) in enumerate(plan):
        if oom[c]:
            continue
        try:
            # On the CPU the peak comes from one more step, after the configuration's last turn.
            turn_times, peak = timed_steps(steps[c], model, args.device, timed, untimed,
                                           cpu_peak=last_turn[c] == n)
            times[c] += turn_times
            peaks[c] = max(peaks[c], peak)
        except torch.OutOfMemoryError:
            oom[c] = True  # cleaned up outside the handler, whose traceback holds the tensors
        if oom[c]:
            model.zero_grad(set_to_none=False)
            gc.collect()
            torch.cuda.empty_cache()
        if last_turn[c] == n or oom[c]:
            method, k, _ = configs[c]
            label = method + (f" K={k}" if k else "")
            status = ("out of memory" if oom[c] else
                      f"{statistics.median(times[c]):.1f} ms, peak {format_bytes(peaks[c])}")
            print(f"[{c + 1}/{len(configs)}] {label}: {status}", file=sys.stderr, flush=True)
        elif args.rounds > 1 and c == len(configs) - 1:
            print(f"  round {n // len(configs) + 1} of {rounds} done",
                  file=sys.stderr, flush=True)
    results = []
    for c, (method, k, _) in enumerate(configs):
        result: dict = {"method": method, "segments": k}
        result |= {"oom": True} if oom[c] else summary(times[c], peaks[c], args.batch)
        results.append(result)

    report = {"model": args.model, "batch": args.batch, "image": args.image,
              "device": str(args.device), "torch": torch.__version__,
              "device_name": device_name(args.device), "threads": torch.get_num_threads(),
              "stages": len(chain), "steps": args.steps, "rounds": rounds,
              "results": results}
    print(f"{args.model}, batch {args.batch}, {args.image}x{args.image}, {args.device} "
          f"({report['device_name']}, {report['threads']} threads), torch {torch.__version__}, "
          f"{len(chain)} stages, median of {args.steps} steps after {args.warmup}"
          + (f", in {rounds} rounds" if args.rounds > 1 else ""))
    print(f"{'method':<22} {'segments':>8} {'median ms':>10} {'images/s':>9} "
          f"{'peak activations':>17} {'vs plain':>8}")
    plain = results[0].get("peak_bytes")
    for r in results:
        k = "-" if r["segments"] is None else str(r["segments"])
        if r.get("oom"):
            print(f"{r['method']:<22} {k:>8} {'out of memory':>10}")
            continue
        ratio = f"{100 * r['peak_bytes'] / plain:.0f}%" if plain else "-"
        print(f"{r['method']:<22} {k:>8} {r['median_ms']:>10.1f} {r['images_per_s']:>9.1f} "
              f"{format_bytes(r['peak_bytes']):>17} {ratio:>8}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
