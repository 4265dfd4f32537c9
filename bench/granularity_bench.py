"""What finer stages buy a ResNet: the optimal schedule's predicted time at equal budgets for
torchvision's network cut three ways (predictions from each cut's own profile; nothing is
trained).

    python bench/granularity_bench.py [--model resnet50] [--batch 8] [--image 224]
        [--fractions 0.75,0.5,0.35,0.25] [--device cpu] [--threads N] [--markdown FILE] [--quick]

The cuts (each an nn.Sequential-like list of stages over the same torchvision modules):
- "block": remat's C++ port's stages (bench/torchvision_stages.py): "conv1", "maxpool", one
  stage per residual block, "fc";
- "unit": each residual block cut into its convolution units (conv, BatchNorm, ReLU; the
  last adds the block's input, through `downsample` where it has one, then its ReLU): every
  unit but the last takes and returns (block input, its own output), so the block's input
  is carried, one storage;
- "operation": each unit cut again, its convolution alone, then its BatchNorm and ReLU.

Each cut is checked to compute torchvision's output bit for bit (train mode, the same seed),
then measured by remat.Checkpointable (5 timed repetitions per stage). Printed: each cut's
stages, store-all time and peak, least budget, and for each budget (a fraction of the block
cut's store-all peak) the optimal schedule's predicted time against that cut's own store-all
time, with its predicted peak, and the merged chain's stage count where the schedule is that
chain's, expanded (solve() merges each block's run of carrying stages into one stage too, and
keeps the faster schedule). A second table: for the cuts that carry members, what the
storage-exact table (every storage counted once; `exact_storages`) buys, the same budgets
solved with it (the default) and without, with each solve's time. docs/algorithms.md
("Carried members", "The storage-exact dynamic program") quotes a run.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchvision_stages import stages as block_stages  # noqa: E402

import remat  # noqa: E402

MIB = float(1 << 20)


class Conv(nn.Module):
    """The convolution of a unit alone: (x[, h]) -> (x, conv(h or x))."""

    def __init__(self, conv: nn.Module, first: bool):
        super().__init__()
        self.conv, self.first = conv, first

    def forward(self, x, h=None):
        return x, self.conv(x if self.first else h)


class Norm(nn.Module):
    """The BatchNorm and ReLU of a unit (the last adding the shortcut): (x, c) -> ..."""

    def __init__(self, norm: nn.Module, last: bool, downsample):
        super().__init__()
        self.norm, self.last, self.downsample = norm, last, downsample

    def forward(self, x, c):
        h = self.norm(c)
        if self.last:
            return torch.relu(h + (self.downsample(x) if self.downsample is not None else x))
        return x, torch.relu(h)


class Unit(nn.Module):
    """One convolution unit of a residual block, its Conv then its Norm: (x[, h]) ->
    (x, relu(bn(conv(h or x)))), or, for the block's last, relu(bn(conv(h)) + shortcut(x))."""

    def __init__(self, conv: nn.Module, norm: nn.Module, first: bool, last: bool, downsample):
        super().__init__()
        self.conv, self.norm = Conv(conv, first), Norm(norm, last, downsample)

    def forward(self, x, h=None):
        return self.norm(*self.conv(x, h))


def block_parts(block: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    names = ("1", "2", "3") if hasattr(block, "conv3") else ("1", "2")
    return [(getattr(block, "conv" + n), getattr(block, "bn" + n)) for n in names]


def cut(model_name: str, how: str) -> list[tuple[str, nn.Module]]:
    """The stages of torchvision's `model_name` (built after torch.manual_seed(0)), cut `how`."""
    torch.manual_seed(0)
    chain, names = block_stages(model_name)
    out = []
    for name, stage in zip(names, chain):
        if how == "block" or not name.startswith("layer"):
            out.append((name, stage))
            continue
        parts = block_parts(stage)
        for k, (conv, norm) in enumerate(parts):
            first, last = k == 0, k == len(parts) - 1
            if how == "unit":
                out.append((f"{name}_unit{k}", Unit(conv, norm, first, last, stage.downsample)))
            else:
                out.append((f"{name}_conv{k}", Conv(conv, first)))
                out.append((f"{name}_norm{k}", Norm(norm, last, stage.downsample)))
    return out


def run_stages(stages: list[tuple[str, nn.Module]], x: torch.Tensor) -> torch.Tensor:
    value = (x,)
    for _, stage in stages:
        value = stage(*value)
        value = value if isinstance(value, tuple) else (value,)
    return value[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", help="resnet18, resnet34, resnet50, resnet101 or resnet152")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--fractions", default="0.75,0.5,0.35,0.25")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: its default)")
    p.add_argument("--markdown", help="write the table here too")
    p.add_argument("--quick", action="store_true", help="resnet18, batch 2 at 64x64, at 95%% and 90%%: a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.batch, args.image, args.fractions = "resnet18", 2, 64, "0.95,0.9"
    if not args.model.startswith("resnet"):
        p.error(f"--model {args.model}: only the ResNets are cut finer here")
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    torch.manual_seed(1)
    x = torch.randn(args.batch, 3, args.image, args.image, device=device)
    cuts = {how: cut(args.model, how) for how in ("block", "unit", "operation")}
    for how, stages in cuts.items():
        for _, stage in stages:
            stage.to(device).train()
    # Each cut computes torchvision's output, bit for bit (BatchNorm statistics of a copy).
    reference = None
    for how, stages in cuts.items():
        with torch.no_grad():
            out = run_stages(copy.deepcopy(stages), x)
        if reference is None:
            reference = out
        elif not torch.equal(out, reference):
            print(f"granularity_bench: the {how} cut does not compute the block cut's output", file=sys.stderr)
            return 1

    measured = {}
    for how, stages in cuts.items():
        start = time.time()
        print(f"{args.model} by {how}: measuring {len(stages)} stages", file=sys.stderr, flush=True)
        measured[how] = remat.Checkpointable(stages, x, progress=False)
        print(f"  {time.time() - start:.1f} s", file=sys.stderr, flush=True)

    lines = [f"{args.model}, batch {args.batch}, {args.image}x{args.image}, {device}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads: each cut's optimal schedule, predicted time against its own "
             "store-all (predicted peak).", "",
             "| cut | stages | store-all ms | store-all peak MiB | least budget MiB |",
             "|---|---:|---:|---:|---:|"]
    for how, chk in measured.items():
        lines.append(f"| {how} | {len(cuts[how])} | {chk.chain.store_all_ms():.1f} | "
                     f"{chk.store_all_peak() / MIB:.1f} | {chk.min_budget() / MIB:.1f} |")
    lines += ["", "| budget (of the block cut's store-all peak) | " + " | ".join(measured) + " |",
              "|---:|" + "---:|" * len(measured)]
    base = measured["block"].store_all_peak()
    for fraction in fractions:
        cells = []
        for chk in measured.values():
            solution = chk.compute_sequence(int(base * fraction))
            merged = f", merged: {solution.merged_stages} stages" if solution.merged_stages else ""
            cells.append(f"{solution.makespan_ms / solution.store_all_makespan_ms:.3f} "
                         f"({solution.peak_bytes / MIB:.1f} MiB{merged})" if solution.ok else "infeasible")
        lines.append(f"| {fraction:.0%} | " + " | ".join(cells) + " |")
    lines += ["", "The storage-exact table: predicted time against the cut's store-all, with it (the "
              "default) and without, and each solve's time.", "",
              "| cut | budget | with | without | gain (points) | solve s with | solve s without |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for how, chk in measured.items():
        if how == "block":
            continue
        for fraction in fractions:
            budget = int(base * fraction)
            with_it = chk.compute_sequence(budget)
            without = chk.compute_sequence(budget, exact_storages=False)
            if not with_it.ok:
                lines.append(f"| {how} | {fraction:.0%} | infeasible | | | | |")
                continue
            ratio = with_it.makespan_ms / with_it.store_all_makespan_ms
            other = without.makespan_ms / without.store_all_makespan_ms if without.ok else None
            lines.append(f"| {how} | {fraction:.0%} | {ratio:.4f} | "
                         f"{f'{other:.4f}' if other else 'infeasible'} | "
                         f"{f'{100 * (other - ratio):.2f}' if other else ''} | "
                         f"{with_it.solve_seconds:.2f} | {without.solve_seconds:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
