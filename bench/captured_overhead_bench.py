"""The host time remat adds per captured stage: a model that is not a chain, captured and split
by remat.Checkpointable, trained at store-all (nothing recomputed), against the same model run
plainly. The model's operations are tiny (residual blocks of Linear(16, 16) and ReLU, batch 4),
so that a step is the host's work, as on a GPU whose kernels are short; each operation becomes a
stage of its own. Prints a table: medians of the rounds, plain and remat taking turns.

    python bench/captured_overhead_bench.py                 # 16, 64 and 128 blocks
    python bench/captured_overhead_bench.py --blocks 64 --rounds 8 --steps 100

Comparing two builds: run it under each (PYTHONPATH=<an installed remat's parent>) in turn.
"""
import argparse
import copy
import statistics
import time

import torch
from torch import nn

import remat


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Net(nn.Module):
    """Residual blocks in a loop: not an nn.Sequential, so remat captures and splits it."""

    def __init__(self, blocks, width):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def seconds_per_step(model, x, steps):
    start = time.perf_counter()
    for _ in range(steps):
        model(x).sum().backward()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8, help="plain and remat in turn, this many times")
    parser.add_argument("--steps", type=int, default=100, help="steps per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, width {args.width}; "
          f"medians of {args.rounds} rounds of {args.steps} steps, taking turns")
    print("| blocks | stages | plain us | remat us | remat / plain | remat's own, us per stage |")
    print("|---:|---:|---:|---:|---:|---:|")
    for blocks in args.blocks:
        torch.manual_seed(0)
        model = Net(blocks, args.width)
        x = torch.randn(args.batch, args.width)
        plain = copy.deepcopy(model)
        wrapped = remat.Checkpointable(model, x, "100%", progress=False)
        stages = len(wrapped.chain.stage_names)
        for m in (plain, wrapped):  # warm-up: allocations, gradients' first accumulation
            seconds_per_step(m, x, 10)
        ours, theirs, ratios = [], [], []
        for _ in range(args.rounds):
            theirs.append(seconds_per_step(plain, x, args.steps))
            ours.append(seconds_per_step(wrapped, x, args.steps))
            ratios.append(ours[-1] / theirs[-1])
        p, r = statistics.median(theirs) * 1e6, statistics.median(ours) * 1e6
        print(f"| {blocks} | {stages} | {p:.0f} | {r:.0f} | {statistics.median(ratios):.2f} | "
              f"{(r - p) / stages:.1f} |", flush=True)


if __name__ == "__main__":
    main()
