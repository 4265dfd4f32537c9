"""remat with offload against remat recomputing only, and against torch's save_on_cpu, at
equal memory: measured peak, step time, the prediction, and the host memory the copies held.

    python bench/offload_bench.py [--models resnet50,transformer] [--fractions 0.75,0.5,0.35,0.25,0.15]
        [--steps 5] [--device cpu|cuda] [--link D2H,H2D,LATENCY] [--json out.json] [--quick]
        [--large] [--plot out.svg]
    python bench/offload_bench.py --from-json out.json [--plot out.svg]

The networks, step and measurement are python_bench.py's (same chains, loss, taking turns,
medians; peak of one more step above what was live before it). For each budget, a fraction of
remat's store-all peak (the loss included):
- "recompute": remat's optimal schedule, recomputation only;
- "offload": remat's optimal schedule where checkpoints may also be copied to host memory and
  brought back (docs/runtime.md, "Offload"), over the device's link as remat.measure_link
  measures it (or --link); "offloads" is how many it copies, "host" the most host memory the
  copies held in a step. A budget below recomputation's least may be feasible with offload.
Besides the fractions, both at the budget of each offloading reference below (save_on_cpu,
torchtune): its own measured peak, so that remat and it are compared at equal memory.
And once, for reference:
- "plain": the chain under plain autograd;
- "save_on_cpu" (CUDA only): torch.autograd.graph.save_on_cpu(pin_memory=True) around the whole
  step: every saved tensor goes to host memory and comes back, without overlap (pytorch#106360).
  On the CPU it saves nothing (the tensors are already there) and is not measured.
- "torchtune" (CUDA only, where torchtune is installed): torchtune's recipe of activation
  checkpointing with activation offloading, each stage under torch.utils.checkpoint
  (use_reentrant=False, as torchtune wraps each layer) and the whole forward under
  torchtune.training.OffloadActivations (pinned buffers, a copy stream): the stages' inputs go
  to host memory and come back. Its peak is what it is; no budget steers it.

On the CPU the copies are memory copies on the host's own time, so offloading buys little or
nothing there; the bench measures the logic and the prediction. The gain is the GPU's.

--large: sizes at which a GPU computes more than it launches (python_bench.workload): resnet50
at batch 64, a transformer of 12 blocks of width 1024 over batch 8 x 1024 tokens.

Output: a table on stdout (also --markdown), progress on stderr, --json the raw figures,
--plot the step time against the measured peak, one panel per network (matplotlib, where it is
installed; --from-json draws it from an earlier run's figures elsewhere).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import python_bench as pb  # noqa: E402  (sets the allocator's settings before torch loads)

import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import remat  # noqa: E402


def torchtune_offloading():
    """torchtune's OffloadActivations, or None with the reason it is not available."""
    if not torch.cuda.is_available():
        return None, "CUDA only"
    try:
        from torchtune.training import OffloadActivations
    except Exception as error:  # ImportError, or torchtune's own check of torchao
        return None, f"torchtune is not installed ({type(error).__name__}: {error})".split("\n")[0]
    return OffloadActivations, ""


def parse_link(text: str) -> remat.Link:
    try:
        d2h, h2d, latency = (float(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"offload_bench.py: --link {text!r}: D2H,H2D,LATENCY (GB/s, GB/s, ms)")
    return remat.Link(d2h, h2d, latency)


def bench_model(name: str, args, device: torch.device, link: remat.Link) -> dict:
    chain_module, x, loss, description = pb.workload(name, args.quick, device, args.large)
    print(f"offload_bench: {name} ({description}) on {device}", file=sys.stderr)
    probe = remat.Checkpointable(chain_module, progress=False, loss=loss, output_held=False)
    chain = probe.measure(x)
    chain = chain.with_link(link)
    peak_all = probe.store_all_peak()
    configurations: "OrderedDict[str, object]" = OrderedDict()
    configurations["plain"] = lambda: loss(chain_module(x)).backward()
    if device.type == "cuda":
        def saved_on_cpu():
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                out = chain_module(x)
                value = loss(out)
            value.backward()
        configurations["save_on_cpu"] = saved_on_cpu
        offloading, why = torchtune_offloading()
        if offloading is None:
            print(f"offload_bench: no torchtune configuration: {why}", file=sys.stderr)
        else:
            def torchtune_recipe():
                with offloading():
                    out = x
                    for stage in chain_module:
                        out = checkpoint(stage, out, use_reentrant=False)
                    value = loss(out)
                value.backward()
            configurations["torchtune"] = torchtune_recipe
    # (fraction, budget, what it matches): the fractions of store-all, then each offloading
    # reference's own peak (one step after a warm-up, as measure_all takes peaks).
    budgets = [(fraction, int(fraction * peak_all), "") for fraction in args.fractions]
    for reference in ("save_on_cpu", "torchtune"):
        if reference in configurations:
            configurations[reference]()
            peak = pb.peak_of(configurations[reference], device)
            budgets.append((peak / peak_all, peak, reference))
            print(f"offload_bench: {reference}'s peak {remat._api.format_bytes(peak)}, "
                  f"{peak / peak_all:.1%} of store-all", file=sys.stderr)
    rows = []
    solutions = {}
    for fraction, budget, matches in budgets:
        for method, offload in (("recompute", False), ("offload", True)):
            chk = remat.Checkpointable(chain_module, progress=False, loss=loss, output_held=False)
            chk.set_chain(chain)
            solution = chk.compute_sequence(budget, offload=offload)
            key = f"{method} {budget}"
            solutions[key] = (chk, solution, fraction, method, budget, matches)
            if solution.ok:
                configurations[key] = (lambda c=chk: loss(c(x)).backward())
    measured = pb.measure_all(chain_module, configurations, args.steps, device)
    for key, (chk, solution, fraction, method, budget, matches) in solutions.items():
        row = {"model": name, "fraction": fraction, "budget_bytes": budget, "method": method,
               "matches": matches, "feasible": solution.ok}
        if solution.ok:
            row.update(measured[key])
            row.update({"predicted_ms": solution.makespan_ms,
                        "predicted_peak_bytes": solution.peak_bytes,
                        "offloads": solution.offloads, "copy_wait_ms": solution.copy_wait_ms,
                        "predicted_host_bytes": solution.host_peak_bytes,
                        "host_bytes": chk.host_memory["peak_bytes"] if solution.offloads else 0,
                        "solve_s": solution.solve_seconds})
        else:
            row["least_bytes"] = solution.min_feasible_budget_bytes
        rows.append(row)
    reference = {k: measured[k] for k in ("plain", "save_on_cpu", "torchtune") if k in measured}
    return {"model": name, "description": description, "store_all_peak_bytes": peak_all,
            "link": link._asdict(), "rows": rows, "reference": reference}


def table(results: list) -> str:
    lines = []
    for r in results:
        lines.append(f"\n### {r['model']} ({r['description']}); link {r['link']['d2h_gbps']:.3g} "
                     f"GB/s out, {r['link']['h2d_gbps']:.3g} GB/s back, "
                     f"{r['link']['latency_ms']:.3g} ms a copy\n")
        for name, m in r["reference"].items():
            lines.append(f"- {name}: {m['step_ms']:.1f} ms, peak {remat._api.format_bytes(m['peak_bytes'])}")
        lines.append("")
        lines.append("| budget | recompute ms (predicted) | peak | offload ms (predicted) | peak "
                     "| offloads | host | recompute / offload |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        by = {(row["budget_bytes"], row["method"]): row for row in r["rows"]}
        for budget in sorted({row["budget_bytes"] for row in r["rows"]}, reverse=True):
            rec, off = by[(budget, "recompute")], by[(budget, "offload")]
            fraction = rec["fraction"]
            label = f"{fraction:.0%}" + (f", {rec['matches']}'s peak" if rec.get("matches") else "")

            def cells(row):
                if not row["feasible"]:
                    return ["infeasible", "-"]
                return [f"{row['step_ms']:.1f} ({row['predicted_ms']:.1f})",
                        remat._api.format_bytes(row["peak_bytes"])]
            ratio = (f"{rec['step_ms'] / off['step_ms']:.3f}"
                     if rec["feasible"] and off["feasible"] else "-")
            host = remat._api.format_bytes(off["host_bytes"]) if off["feasible"] else "-"
            offloads = str(off["offloads"]) if off["feasible"] else "-"
            lines.append(f"| {label} ({remat._api.format_bytes(budget)}) | "
                         + " | ".join(cells(rec)) + " | " + " | ".join(cells(off))
                         + f" | {offloads} | {host} | {ratio} |")
    return "\n".join(lines) + "\n"


def plot(results: list, path: Path) -> None:
    """Step time against measured peak, one panel per network: the two of remat's curves over
    the budgets, the references as points."""
    try:
        import matplotlib
    except ImportError:
        print(f"offload_bench: no plot: matplotlib is not installed (bench/offload_bench.py "
              f"--from-json FILE --plot {path} draws it elsewhere)", file=sys.stderr)
        return
    matplotlib.use("svg" if path.suffix == ".svg" else "agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.0), squeeze=False)
    for ax, r in zip(axes.flat, results):
        for method, color, marker in (("recompute", "C0", "o"), ("offload", "C2", "^")):
            points = sorted((row["peak_bytes"] / 2**20, row["step_ms"]) for row in r["rows"]
                            if row["method"] == method and row["feasible"])
            if points:
                ax.plot(*zip(*points), color=color, marker=marker, label=f"remat, {method}")
        for name, color, marker in (("plain", "k", "s"), ("save_on_cpu", "C1", "D"),
                                    ("torchtune", "C3", "P")):
            if name in r["reference"]:
                m = r["reference"][name]
                ax.plot([m["peak_bytes"] / 2**20], [m["step_ms"]], color=color, marker=marker,
                        linestyle="none", label=name)
        ax.set_title(f"{r['model']} ({r['description']})", fontsize=9)
        ax.set_xlabel("measured peak (MiB)")
        ax.set_ylabel("step (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"offload_bench: plot in {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50,transformer")
    parser.add_argument("--fractions", default="0.75,0.5,0.35,0.25,0.15")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--link", default="", help="D2H,H2D,LATENCY; default: measured")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", default="")
    parser.add_argument("--markdown", default="")
    parser.add_argument("--quick", action="store_true", help="small sizes (CI, the CPU mode)")
    parser.add_argument("--large", action="store_true",
                        help="resnet50 b64, a 12-block transformer of width 1024 (a GPU's sizes)")
    parser.add_argument("--plot", type=Path, help="step time against peak (.svg or .png)")
    parser.add_argument("--from-json", type=Path, help="draw and print an earlier run's --json")
    args = parser.parse_args()
    if args.from_json:
        try:
            data = json.loads(args.from_json.read_text())
            text = data["header"] + table(data["results"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"offload_bench.py: --from-json {args.from_json}: not this bench's "
                             f"figures ({type(error).__name__}: {error})")
        print(text)
        if args.plot:
            plot(data["results"], args.plot)
        return
    args.fractions = [float(f) for f in args.fractions.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    remat.keep_freed_memory()
    device = torch.device(args.device)
    link = parse_link(args.link) if args.link else remat.measure_link(device)
    results = [bench_model(name, args, device, link) for name in args.models.split(",")]
    header = (f"offload_bench on {platform.node()} ({device}, torch {torch.__version__}), "
              f"medians of {args.steps} steps taking turns\n")
    text = header + table(results)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
