"""remat from Python against PyTorch's checkpoint_sequential (and rockmate, where it runs) at
equal memory: measured peak, step time and solve time.

    python bench/python_bench.py [--models resnet50,transformer] [--fractions 0.75,0.5,0.35]
        [--steps 3] [--device cpu] [--threads N] [--json out.json] [--quick]

Networks (each an nn.Sequential of stages, built after torch.manual_seed(0), in train mode):
- "resnet50": torchvision's resnet50 split as remat's C++ port splits it (18 stages,
  bench/torchvision_stages.py), batch 8 at 224x224 (--quick: batch 2 at 96x96), 1000 classes.
- "transformer": a GPT-style causal language model, one stage per block: token and position
  embedding; 6 pre-norm blocks (d 256, 8 heads, MLP 1024, GELU, dropout 0.1, causal
  scaled-dot-product attention); final LayerNorm and a 8192-token LM head. Batch 8 of 256
  tokens (--quick: 2 blocks, batch 2 of 64). Its logits (batch x 256 x 8192 floats) are
  the largest tensor of the step, as in real language models.

The step: forward, cross-entropy on random integer targets, backward. Parameter gradients are
allocated before measuring and zeroed (set_to_none=False) outside the timed region; the input
and targets are allocated once; no optimizer update.

Methods, for each budget (a fraction of remat's store-all peak, the loss included):
- "remat": remat.Checkpointable measured with the loss, and with output_held=False, as the
  step is written (the output goes once the loss has its value; profiling: 5 timed
  repetitions per stage), solved for the budget ("solve s": the solver's own time for that
  budget); one Checkpointable per budget over the same chain and the same measurement
  (set_chain), so that all budgets can take turns.
- "checkpoint_sequential": torch.utils.checkpoint.checkpoint_sequential(chain, K, x,
  use_reentrant=False), for the K in 2 .. floor(2 sqrt(L)) (L stages) that is fastest among
  those whose measured peak fits in the budget; "none fits" when none does.
- "plain": the chain under plain autograd, once, for reference.
- "rockmate": rockmate 2.0 (Inria) is not measured; the bench prints why: PyPI's rockmate
  2.0.0 cannot be imported (its rkgb 2.0.0 lacks rkgb.core), it runs on CUDA only, and where
  it does import this bench does not drive it (docs/performance.md, "Python").

glibc is asked to keep freed memory (remat.keep_freed_memory(), as remat's C++ benchmarks and
commands do): without it, steps fault in pages glibc gave back, a cost that depends on the
order of frees rather than on the method (--malloc-defaults leaves glibc as it is).

Measurements: every configuration (plain, each K, remat at each budget) runs one step in turn,
round after round: one untimed round, then --steps timed ones; step time is a configuration's
median. Taking turns puts any drift of the machine's speed during the run on every
configuration alike. The peak is that of one more step: the peak of LibTorch's CPU allocations
during the step above what was live before it, counted by remat's tracking allocator (which
sees every allocation of LibTorch's CPU allocator, whoever makes it; on CUDA:
torch.cuda.max_memory_allocated).

Output: a table on stdout (also written to --markdown), progress on stderr, and with --json
the raw figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("KINETO_LOG_LEVEL", "5")
# On a GPU, every block the caching allocator hands out is its tensor's size rounded up to 512
# bytes, as remat's profiler makes it (remat::exact_cuda_blocks, docs/cost-model.md), so that
# every method is measured alike; a setting given in the environment is kept.
if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint_sequential  # noqa: E402

import remat  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


# ---- networks --------------------------------------------------------------------------------


class Embedding(nn.Module):
    def __init__(self, vocab: int, d: int, seq: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.tokens(ids) + self.positions[: ids.shape[1]])


class Block(nn.Module):
    """A GPT-2-style pre-norm block with causal attention."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=0.1 if self.training else 0.0)
        x = x + self.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Head(nn.Module):
    def __init__(self, d: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def transformer(blocks: int, d: int = 256, heads: int = 8, vocab: int = 8192, seq: int = 256) -> nn.Sequential:
    stages = [("embed", Embedding(vocab, d, seq))]
    stages += [(f"block{i}", Block(d, heads)) for i in range(blocks)]
    return nn.Sequential(OrderedDict(stages + [("head", Head(d, vocab))]))


def workload(name: str, quick: bool, device: torch.device, large: bool = False):
    """(chain, input, targets, loss, description). `large`: sizes at which a GPU is busy with
    the computation rather than with launching it (offload_bench.py --large): resnet50 at batch
    64, the transformer with 12 blocks of width 1024 over batch 8 x 1024 tokens."""
    torch.manual_seed(0)
    if name == "resnet50":
        from torchvision_stages import stages

        batch, image = (2, 96) if quick else (64, 224) if large else (8, 224)
        chain, _ = stages("resnet50")
        x = torch.randn(batch, 3, image, image, device=device)
        targets = torch.randint(0, 1000, (batch,), device=device)
        loss = lambda out: F.cross_entropy(out, targets)  # noqa: E731
        return chain.to(device), x, loss, f"batch {batch}, {image}x{image}"
    if name == "transformer":
        blocks, batch, seq, width, heads = ((2, 2, 64, 256, 8) if quick else
                                            (12, 8, 1024, 1024, 16) if large else
                                            (6, 8, 256, 256, 8))
        # The position table at least 256 long, as the quick and default sizes always had it.
        chain = transformer(blocks, d=width, heads=heads, seq=max(seq, 256))
        ids = torch.randint(0, 8192, (batch, seq), device=device)
        targets = torch.randint(0, 8192, (batch, seq), device=device)
        loss = lambda out: F.cross_entropy(out.flatten(0, 1), targets.flatten())  # noqa: E731
        return (chain.to(device), ids, loss,
                f"{blocks} blocks of width {width}, batch {batch} x {seq} tokens")
    raise SystemExit(f"python_bench.py: unknown model {name!r} (known: resnet50, transformer)")


# ---- measuring -------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_of(step: Callable[[], Any], device: torch.device) -> int:
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    return remat._C.peak_during(step, "cpu")


def measure_all(model: nn.Module, steps: "OrderedDict[str, Callable[[], Any]]", repeats: int,
                device: torch.device, on_round: Callable[[int], None] = lambda r: None) -> dict:
    """Each configuration's median step time and one step's peak, {name: {"step_ms",
    "peak_bytes"}}. The configurations take turns: one untimed round, then `repeats` timed
    rounds of one step each, so that a machine getting slower or faster during the run (other
    work on it, frequency, the allocator's state) weighs on every configuration alike rather
    than on whichever was measured last. The peaks come after, one step each."""
    params = [p for p in model.parameters() if p.requires_grad]

    def zero():
        for p in params:
            p.grad.zero_()

    for p in params:  # allocated once, outside the measured steps
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    times: dict = {name: [] for name in steps}
    for r in range(repeats + 1):
        for name, step in steps.items():
            zero()
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if r > 0:
                times[name].append(time.perf_counter() - start)
        on_round(r)
    figures = {}
    for name, step in steps.items():
        zero()
        figures[name] = {"step_ms": 1000 * statistics.median(times[name]),
                         "peak_bytes": peak_of(step, device)}
    return figures


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def rockmate_status(device: torch.device) -> str:
    """Why rockmate cannot be measured here, or "" when it can."""
    try:
        import rockmate  # noqa: F401
    except Exception as e:  # its import fails in more ways than ImportError
        return f"rockmate could not be imported: {type(e).__name__}: {e}"
    if device.type != "cuda":
        return ("rockmate 2.0 runs on CUDA only: its Rockmate module fixes its device to "
                "torch.device('cuda') and times and schedules with CUDA streams and events")
    return ("rockmate imports here, but this bench does not drive it: PyPI's rockmate could "
            "never be imported where the bench was written, so no driver could be tested")


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    chain, x, loss_fn, description = workload(name, args.quick, device)
    stages = len(chain)
    progress(f"{name}: {description}, {stages} stages")

    start = time.perf_counter()
    chk = remat.Checkpointable(chain, progress=False)
    chk.measure(x, loss=loss_fn, output_held=False)  # the step lets the output go (below)
    measure_s = time.perf_counter() - start
    full = chk.store_all_peak()
    least = chk.min_budget()
    progress(f"  remat measured in {measure_s:.1f} s: store-all {mib(full)} MiB, least {mib(least)} MiB")

    steps: "OrderedDict[str, Callable[[], Any]]" = OrderedDict()
    steps["plain"] = lambda: loss_fn(chain(x)).backward()
    segment_counts = list(range(2, min(stages, math.floor(2 * math.sqrt(stages))) + 1))
    for k in segment_counts:
        steps[f"K={k}"] = lambda k=k: loss_fn(checkpoint_sequential(chain, k, x, use_reentrant=False)).backward()
    budgets = {fraction: int(fraction * full) for fraction in args.fractions}
    solutions = {}
    for fraction, budget in budgets.items():
        if budget < least:
            continue
        runner = remat.Checkpointable(chain, progress=False)  # one per budget, on the same chain
        runner.set_chain(chk.chain)
        solutions[fraction] = runner.compute_sequence(budget)
        steps[f"remat {fraction}"] = lambda runner=runner: loss_fn(runner(x)).backward()
    progress(f"  {len(steps)} configurations, taking turns: 1 untimed and {args.steps} timed steps each")
    figures = measure_all(chain, steps, args.steps, device,
                          on_round=lambda r: progress(f"  round {r + 1} of {args.steps + 1} done"))
    plain = figures["plain"]
    progress(f"  plain: {plain['step_ms']:.0f} ms, peak {mib(plain['peak_bytes'])} MiB")
    theirs = {k: figures[f"K={k}"] for k in segment_counts}
    for k in segment_counts:
        progress(f"  checkpoint_sequential K={k}: {theirs[k]['step_ms']:.0f} ms, "
                 f"peak {mib(theirs[k]['peak_bytes'])} MiB")

    rows = []
    for fraction, budget in budgets.items():
        row: dict = {"fraction": fraction, "budget_bytes": budget}
        if fraction not in solutions:
            row["remat"] = {"infeasible": True, "least_bytes": least}
        else:
            solution = solutions[fraction]
            ours = dict(figures[f"remat {fraction}"])
            ours.update(solve_s=solution.solve_seconds, predicted_peak_bytes=solution.peak_bytes,
                        predicted_ms=solution.makespan_ms)
            row["remat"] = ours
            progress(f"  remat at {fraction:.0%}: {ours['step_ms']:.0f} ms, peak {mib(ours['peak_bytes'])} MiB, "
                     f"solved in {solution.solve_seconds:.4f} s")
        fits = [k for k in segment_counts if theirs[k]["peak_bytes"] <= budget]
        if fits:
            best = min(fits, key=lambda k: theirs[k]["step_ms"])
            row["checkpoint_sequential"] = dict(theirs[best], segments=best)
        else:
            row["checkpoint_sequential"] = {"none_fits": True}
        rows.append(row)
    return {"model": name, "workload": description, "stages": stages, "plain": plain,
            "store_all_bytes": full, "least_bytes": least, "measure_s": measure_s,
            "checkpoint_sequential": {str(k): v for k, v in theirs.items()}, "budgets": rows}


def print_table(results: list[dict], rockmate_note: str, print=print) -> None:
    print("| model | budget | method | peak MiB | predicted MiB | step ms (median) | vs plain | solve s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        plain_ms = r["plain"]["step_ms"]
        print(f"| {r['model']} | - | plain | {mib(r['plain']['peak_bytes'])} | - | {plain_ms:.0f} | 1.00 | - |")
        for row in r["budgets"]:
            budget = f"{row['fraction']:.0%} ({mib(row['budget_bytes'])} MiB)"
            ours = row["remat"]
            if ours.get("infeasible"):
                print(f"| {r['model']} | {budget} | remat | below the least budget "
                      f"({mib(ours['least_bytes'])} MiB) | | | | |")
            else:
                print(f"| {r['model']} | {budget} | remat | {mib(ours['peak_bytes'])} | "
                      f"{mib(ours['predicted_peak_bytes'])} | {ours['step_ms']:.0f} | "
                      f"{ours['step_ms'] / plain_ms:.2f} | {ours['solve_s']:.4f} |")
            theirs = row["checkpoint_sequential"]
            if theirs.get("none_fits"):
                print(f"| {r['model']} | {budget} | checkpoint_sequential | no segment count fits | | | | |")
            else:
                print(f"| {r['model']} | {budget} | checkpoint_sequential, K={theirs['segments']} | "
                      f"{mib(theirs['peak_bytes'])} | - | {theirs['step_ms']:.0f} | "
                      f"{theirs['step_ms'] / plain_ms:.2f} | - |")
    if rockmate_note:
        print(f"\nrockmate: not measured. {rockmate_note}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,transformer")
    p.add_argument("--fractions", default="0.75,0.5,0.35")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: its default)")
    p.add_argument("--json", help="write the raw figures here")
    p.add_argument("--markdown", help="write the table here too")
    p.add_argument("--malloc-defaults", action="store_true",
                   help="leave glibc's malloc settings alone (no remat.keep_freed_memory())")
    p.add_argument("--quick", action="store_true", help="small inputs: a smoke test of the bench itself")
    args = p.parse_args(argv)
    try:
        args.fractions = [float(f) for f in args.fractions.split(",")]
    except ValueError:
        p.error(f"--fractions: not a comma list of numbers: {args.fractions!r}")
    if not all(0 < f <= 1 for f in args.fractions):
        p.error("--fractions: each must be in (0, 1]")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    args.models = args.models.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = False if args.malloc_defaults else remat.keep_freed_memory()
    note = rockmate_status(device)
    results = [bench_model(name, args, device) for name in args.models]
    print_table(results, note)
    if args.markdown:
        lines: list[str] = []
        print_table(results, note, print=lines.append)
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    if args.json:
        meta = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
                "machine": platform.processor() or platform.machine(),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "keep_freed_memory": kept, "rockmate": note, "results": results}
        Path(args.json).write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
