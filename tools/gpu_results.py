#!/usr/bin/env python3
"""What the GPU check measured, against its targets, in Markdown for docs/performance.md.

    python3 tools/gpu_results.py RESULTS [--markdown FILE] [--img-dir DIR] [--chains-dir DIR] [--strict]

RESULTS is the GPU check's output folder, or the results.tar.gz that scripts/gpu-session.sh
hands back. Printed (and written to --markdown): the machine (environment.json), then each
part that ran, with every target of docs/gpu-check.md checked row by row:
- fidelity: measured peak at most the budget and within 5% of the prediction; measured step
  time within 10% of the predicted makespan;
- throughput: at every remat budget, at least 1.15 times the throughput of the fastest
  checkpoint_sequential whose measured peak is at most remat's (met outright where none
  fits); at 100% of store-all, within 2% of plain LibTorch;
- the published reference point (resnet152, batch 16, 5459 MiB -> 2455 MiB at 10% lower
  speed): remat's peak and throughput against plain at each budget;
- transformers: remat's schedules against Hugging Face's gradient_checkpointing_enable() at
  its measured peak;
- offload: at every budget where remat offloads, the measured peak at most the budget and the
  step within 10% of the prediction; reported beside them, the throughput against remat's
  recomputation-only schedule at the same budget and the share of the recomputation overhead
  (recomputing against plain) the offloads removed, POFO's mark being about a third; and the
  references (plain, save_on_cpu, torchtune's recipe) with their peaks.
--img-dir writes each network's throughput plot as its own SVG (gpu-throughput-MODEL.svg,
gpu-reference-MODEL.svg) and the offload plot (gpu-offload.svg), for docs/img/. --chains-dir copies the chains the check profiled
(chains/*.json: each model's measured stage costs on that GPU) into DIR, for
bench/gpu-profiles/: `remat schedule --chain FILE` solves them again on any machine. Exit
status: 0; with --strict, 1 when a target was missed; 2 when RESULTS cannot be read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

PEAK_TOLERANCE = 0.05  # measured peak within 5% of the prediction
TIME_TOLERANCE = 0.10  # measured step within 10% of the predicted makespan
SPEEDUP = 1.15  # against the best checkpoint_sequential at equal memory
PLAIN_TOLERANCE = 0.02  # remat at 100% against plain LibTorch
MIB = 1 << 20


class Report:
    """Markdown lines and the count of missed targets."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.missed: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def verdict(self, ok: bool, what: str) -> str:
        """'yes', or 'NO' after recording `what` as missed."""
        if not ok:
            self.missed.append(what)
        return "yes" if ok else "NO"


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; numbers are right-aligned by the caller's choice of `---:`."""
    return ["| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if h.endswith(("MiB", "ms", "/s", "ratio", "%")) or h.startswith("measured")
                           else "---" for h in header) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def environment(env: dict, report: Report) -> None:
    gpu = env.get("gpu") or "no GPU (CPU mode)"
    memory = f", {env['gpu_memory_bytes'] / (1 << 30):.0f} GiB" if env.get("gpu_memory_bytes") else ""
    cudnn = env.get("cudnn")
    cudnn_text = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if isinstance(cudnn, int) and cudnn >= 10000 else str(cudnn)
    report.add(f"Measured on {gpu}{memory} (driver {env.get('driver') or '-'}), CUDA {env.get('cuda')}, "
               f"cuDNN {cudnn_text}, PyTorch {env.get('torch')}, torchvision {env.get('torchvision')}, "
               f"transformers {env.get('transformers') or '-'}, on {env.get('date')}.", "")


def restarts(trace: dict) -> dict | None:
    """The first forward after each backward engine call in a traced step (a recomputation
    segment's start, when the host has no lead on the GPU): how many, predicted and measured
    ms. None for a trace without its operations (older results)."""
    ops = trace.get("operations")
    if not ops:
        return None
    out = {"operations": 0, "predicted_ms": 0.0, "measured_ms": 0.0}
    for before, op in zip(ops, ops[1:]):
        if before["operations"].startswith("B") and not op["operations"].startswith(("B", "L")):
            out["operations"] += 1
            out["predicted_ms"] += op["predicted_ms"]
            out["measured_ms"] += op["measured_ms"]
    return out


def fidelity(data: dict, report: Report) -> None:
    report.add("### Fidelity", "", f"{data.get('device', '')}, LibTorch {data.get('libtorch', '')}.", "")
    rows = []
    for r in data["rows"]:
        where = f"{r['model']} at {r['percent']:.0f}%"
        if r.get("infeasible"):
            rows.append([r["model"], f"{r['percent']:.0f}%", mib(r["budget_bytes"]),
                         f"infeasible (least {mib(r['min_budget_bytes'])})", "", "", "", "", ""])
            continue
        if r.get("oom"):
            rows.append([r["model"], f"{r['percent']:.0f}%", mib(r["budget_bytes"]), "out of memory",
                         "", "", "", report.verdict(False, f"fidelity: {where} ran out of memory"), ""])
            continue
        peak_ratio = r["measured_peak_bytes"] / r["predicted_peak_bytes"]
        time_ratio = r["measured_ms"] / r["predicted_ms"]
        within = r["measured_peak_bytes"] <= r["budget_bytes"]
        rows.append([
            r["model"], f"{r['percent']:.0f}%", mib(r["budget_bytes"]), mib(r["predicted_peak_bytes"]),
            mib(r["measured_peak_bytes"]), f"{peak_ratio:.3f}",
            report.verdict(within, f"fidelity: {where}: measured peak above the budget"),
            report.verdict(abs(peak_ratio - 1) <= PEAK_TOLERANCE,
                           f"fidelity: {where}: measured peak {peak_ratio:.3f} of the prediction"),
            f"{r['predicted_ms']:.1f}, {r['measured_ms']:.1f}: {time_ratio:.3f} "
            + report.verdict(abs(time_ratio - 1) <= TIME_TOLERANCE,
                             f"fidelity: {where}: step time {time_ratio:.3f} of the prediction"),
        ])
    report.add(*table(["model", "budget", "budget MiB", "predicted MiB", "measured MiB",
                       "measured / predicted", "within budget", "within 5%",
                       "predicted, measured ms: measured / predicted (within 10%)"], rows), "")
    plain = [[p["model"], f"{p['predicted_ms']:.1f}", f"{p['measured_ms']:.1f}",
              f"{p['measured_ms'] / p['predicted_ms']:.3f}", mib(p["measured_peak_bytes"])]
             for p in data.get("plain", []) if not p.get("oom")]
    if plain:
        report.add("Plain training through the same stages, against the predicted store-all "
                   "makespan (the profile's own bias, before any schedule):", "",
                   *table(["model", "predicted ms", "measured ms", "measured / predicted ratio",
                           "measured MiB"], plain), "")
    traced = [r for r in data["rows"] if r.get("trace")]
    if traced:
        parts = [("forward", "forwards"), ("recompute", "recomputations"), ("backward", "backwards")]

        def cell(part: dict) -> str:
            return f"{part['predicted_ms']:.1f} / {part['measured_ms']:.1f}"

        def spread(r: dict) -> str:
            # The traced steps' range: one traced step may be the exception (older results
            # traced one only).
            steps = [t["measured_ms"] for t in r.get("traces", [r["trace"]])]
            return f"{min(steps):.1f}-{max(steps):.1f} ({len(steps)})"

        def restart_cell(t: dict) -> str:
            r = restarts(t)
            return "-" if r is None else f"{cell(r)} ({r['operations']})" if r["operations"] else "none"

        rows = []
        for r in traced:
            t = r["trace"]
            rows.append([r["model"], f"{r['percent']:.0f}%", cell(t["forward"]),
                         f"{cell(t['recompute'])} ({t['recompute']['operations']})", restart_cell(t),
                         cell(t["backward"]), f"{t['between_ms']:.2f}",
                         f"{t['predicted_ms']:.1f} / {t['measured_ms']:.1f}", spread(r)])
        report.add("Where the time goes: steps traced after the timed ones, the median one shown "
                   "(each operation timed where it runs, between CUDA events on a GPU), "
                   "predicted / measured ms; the recomputations are the forwards after the loss "
                   "(how many), of which the restarts are the first forward after each backward "
                   "engine call; between: the time between operations, the runtime's own work; "
                   "then the range of the traced steps (how many):", "",
                   *table(["model", "budget", "forwards", "recomputations", "of which restarts",
                           "backwards", "between ms", "traced step", "traced steps ms"], rows), "")
        # The restarts over every traced step of every schedule: what one costs beyond its
        # profile, against the other recomputations (the case for a restart cost in the model).
        # Each traced step's recomputations and, among them, its restarts (older traces, without
        # their operations, left out).
        split = [(t["recompute"], restarts(t)) for r in traced for t in r.get("traces", [r["trace"]])]
        split = [(every, first) for every, first in split if first is not None]
        count = sum(first["operations"] for _, first in split)
        if count:
            extra = sum(first["measured_ms"] - first["predicted_ms"] for _, first in split)
            others = sum(every["operations"] - first["operations"] for every, first in split)
            others_extra = sum((every["measured_ms"] - first["measured_ms"])
                               - (every["predicted_ms"] - first["predicted_ms"]) for every, first in split)
            line = (f"Restarts: {count} in the traced steps, each {extra / count:+.3f} ms beyond its "
                    f"profile on average")
            if others:
                line += f"; the {others} other recomputations {others_extra / others:+.3f} ms each"
            report.add(line + ".", "")
        # Each time miss, split by where its extra time went.
        for r in traced:
            t = r["trace"]
            if abs(r["measured_ms"] / r["predicted_ms"] - 1) <= TIME_TOLERANCE or not t["predicted_ms"]:
                continue
            extra = [(label, t[key]["measured_ms"] - t[key]["predicted_ms"]) for key, label in parts]
            first = restarts(t)
            if first is not None and first["operations"]:
                restart_extra = first["measured_ms"] - first["predicted_ms"]
                extra = [("other recomputations", ms - restart_extra) if label == "recomputations"
                         else (label, ms) for label, ms in extra]
                extra.append((f"restarts ({first['operations']})", restart_extra))
            extra.append(("between operations", t["between_ms"]))
            extra.sort(key=lambda e: -abs(e[1]))
            report.add(f"- {r['model']} at {r['percent']:.0f}%: the traced step took "
                       f"{t['measured_ms']:.1f} ms against {t['predicted_ms']:.1f} predicted "
                       f"({t['measured_ms'] - t['predicted_ms']:+.1f} ms): "
                       + ", ".join(f"{label} {ms:+.1f} ms" for label, ms in extra) + ".")
        report.add("")
    def device_calls(r: dict) -> str:
        # cudaMalloc calls and retries (the allocator freeing its cache) over the timed steps:
        # each can make the host wait for the GPU. "-" where not recorded (older results).
        if "step_device_allocs" not in r:
            return "-"
        return f"{sum(r['step_device_allocs'])} / {sum(r.get('step_alloc_retries', []))}"

    detail = [[r["model"], f"{r['percent']:.0f}%", mib(r["measured_peak_bytes"]),
               mib(r["requested_peak_bytes"]) if r.get("requested_peak_bytes", -1) >= 0 else "-",
               mib(r["allocated_total_bytes"]), mib(r["reserved_bytes"]),
               mib(r["reserved_bytes"] - r["allocated_total_bytes"]), device_calls(r)]
              for r in data["rows"] if r.get("reserved_bytes", -1) >= 0]
    if detail:
        report.add("The caching allocator's view: the step's peak in blocks and in exact sizes "
                   "(above the start, the batch included), the peak of all live blocks and of the "
                   "reserved segments, the cache's excess over the live blocks, and its calls of "
                   "cudaMalloc and retries after freeing its cache in all the timed steps:", "",
                   *table(["model", "budget", "blocks MiB", "exact sizes MiB", "all blocks MiB",
                           "reserved MiB", "cache excess MiB", "cudaMalloc / retries"], detail), "")


def throughput(runs: list[dict], report: Report, reference: bool = False) -> None:
    report.add(f"### {'The published reference point' if reference else 'Throughput at equal memory'}", "")
    if reference:
        report.add("PyTorch's sublinear-memory reimplementation: resnet152 at batch 16 from 5459 MiB "
                   "to 2455 MiB (45%) at 10% lower speed. remat on the same network:", "")
    for run in runs:
        results = run["results"]
        plain = next((r for r in results if r["method"] == "plain-libtorch" and not r["oom"]), None)
        pytorch = next((r for r in results if r["method"] == "plain-pytorch" and not r.get("oom")), None)
        report.add(f"**{run['model']}** ({run['stages']} stages, {run['device']}, LibTorch {run['libtorch']}, "
                   f"median of {run['steps']} steps): plain LibTorch "
                   + (f"{plain['images_per_s']:.1f} images/s at {mib(plain['peak_bytes'])}" if plain else "out of memory")
                   + (f"; plain PyTorch {pytorch['images_per_s']:.1f} images/s at {mib(pytorch['peak_bytes'])}"
                      if pytorch else "") + ".", "")
        fused = next((r for r in results if r["method"] == "remat-optimal" and r["setting"] == "100%"
                      and not r["oom"]), None)
        per_stage = next((r for r in results if r["method"] == "remat-per-stage-backward"
                          and not r["oom"]), None)
        if fused and per_stage:
            report.add(f"Store-all through the runtime: {fused['images_per_s']:.1f} images/s with "
                       f"consecutive backwards in one engine call, {per_stage['images_per_s']:.1f} "
                       f"with one call per stage ({fused['images_per_s'] / per_stage['images_per_s']:.3f}x).",
                       "")
        rows = []
        for r in results:
            if r["method"] != "remat-optimal" or r["oom"]:
                continue
            row = [r["setting"], mib(r["peak_bytes"]), f"{r['images_per_s']:.1f}"]
            if plain:
                speed = r["images_per_s"] / plain["images_per_s"]
                cell = f"{100 * r['peak_bytes'] / plain['peak_bytes']:.0f}% / {speed:.3f}"
                if r["setting"] == "100%" and not reference:
                    cell += " " + report.verdict(speed >= 1 - PLAIN_TOLERANCE,
                                                 f"throughput: {run['model']} at 100%: {speed:.3f} of plain LibTorch")
                row.append(cell)
            else:
                row.append("-")
            equal = next((e for e in run["at_equal_memory"] if e["budget"] == r["setting"]), None)
            best = equal and equal.get("checkpoint_sequential")
            if best:
                ok = best["ratio"] >= SPEEDUP
                row.append(f"{best['setting']} ({mib(best['peak_bytes'])}, {best['images_per_s']:.1f}/s): "
                           f"{best['ratio']:.3f} " + ("" if reference else report.verdict(
                               ok, f"throughput: {run['model']} at {r['setting']}: {best['ratio']:.3f} "
                                   "of the best checkpoint_sequential")))
            else:
                row.append("none fits" + ("" if reference else " (met)"))
            periodic = equal and equal.get("remat-periodic")
            row.append(f"{periodic['setting']}: {periodic['ratio']:.3f}" if periodic else "none fits")
            rows.append(row)
        report.add(*table(["remat budget", "measured MiB", "images/s", "memory / speed vs plain",
                           "best checkpoint_sequential at equal memory: ratio",
                           "best remat periodic: ratio"], rows), "")


def transformers(data: dict, report: Report) -> None:
    report.add("### GPT-2 against Hugging Face's checkpointing", "",
               f"Batch {data['batch']}, sequence {data['sequence']}, {data['device']}, LibTorch "
               f"{data['libtorch']}. Ratios are throughputs (> 1: faster than Hugging Face's "
               "`gradient_checkpointing_enable()`).", "")
    rows = []
    for model in dict.fromkeys(r["model"] for r in data["rows"]):
        mine = [r for r in data["rows"] if r["model"] == model]
        hf = next((r for r in mine if r["method"] == "hf-checkpointing" and not r.get("oom")), None)
        if hf is None:
            report.add(f"{model}: no measurement of Hugging Face's checkpointing.", "")
            continue
        for r in mine:
            if r.get("oom") or r["measured_ms"] <= 0:
                continue
            equal = r["setting"].startswith("= HF")
            row = [model, r["method"], r["setting"], mib(r["measured_peak"]), f"{r['measured_ms']:.0f}",
                   f"{hf['measured_ms'] / r['measured_ms']:.3f}"]
            if equal:
                row.append(report.verdict(r["measured_peak"] <= hf["measured_peak"],
                                          f"transformers: {model} {r['method']}: peak above Hugging Face's"))
            else:
                row.append("")
            rows.append(row)
    report.add(*table(["model", "schedule", "setting", "measured MiB", "step ms",
                       "speed vs HF checkpointing ratio", "within HF's peak"], rows), "")


POFO_MARK = 1 / 3  # POFO removed about a third of the recomputation overhead (NeurIPS 2021)


def offload(data: dict, report: Report) -> None:
    report.add("### Offload against recomputation only", "", data["header"].strip(), "")
    for r in data["results"]:
        link = r["link"]
        report.add(f"{r['model']} ({r['description']}); link {link['d2h_gbps']:.3g} GB/s out, "
                   f"{link['h2d_gbps']:.3g} GB/s back, {link['latency_ms']:.3g} ms a copy.", "")
        references = ", ".join(f"{name} {m['step_ms']:.1f} ms at {mib(m['peak_bytes'])}"
                               for name, m in r["reference"].items())
        if references:
            report.add(f"References: {references}.", "")
        plain = r["reference"].get("plain", {}).get("step_ms")
        by = {(row["fraction"], row["method"]): row for row in r["rows"]}
        rows = []
        for fraction in sorted({row["fraction"] for row in r["rows"]}, reverse=True):
            rec, off = by.get((fraction, "recompute")), by.get((fraction, "offload"))
            where = f"offload: {r['model']} at {fraction:.0%}"
            if off is None or not off["feasible"]:
                rows.append([f"{fraction:.0%}", "infeasible" if rec is None or not rec["feasible"]
                             else f"{rec['step_ms']:.1f}", "infeasible", "", "", "", "", "", ""])
                continue
            time_ratio = off["step_ms"] / off["predicted_ms"]
            cells = [f"{fraction:.0%}", f"{rec['step_ms']:.1f}" if rec and rec["feasible"] else "infeasible",
                     f"{off['step_ms']:.1f} ({off['predicted_ms']:.1f})", str(off["offloads"]),
                     f"{mib(off['peak_bytes'])} of {mib(off['budget_bytes'])} "
                     + report.verdict(off["peak_bytes"] <= off["budget_bytes"],
                                      f"{where}: measured peak above the budget"),
                     f"{time_ratio:.3f} " + report.verdict(abs(time_ratio - 1) <= TIME_TOLERANCE,
                                                          f"{where}: step {time_ratio:.3f} of the prediction")]
            if rec and rec["feasible"]:
                cells.append(f"{rec['step_ms'] / off['step_ms']:.3f}")
                overhead = rec["step_ms"] - plain if plain is not None else 0
                cells.append(f"{(rec['step_ms'] - off['step_ms']) / overhead:.0%}"
                             if overhead > 0 and off["offloads"] else "-")
            else:
                cells += ["below recomputation's least", "-"]
            cells.append(mib(off["host_bytes"]))
            rows.append(cells)
        report.add(*table(["budget", "recompute ms", "offload ms (predicted)", "offloads",
                           "measured peak MiB", "step / predicted", "throughput ratio",
                           "overhead removed %", "host MiB"], rows), "")
    report.add(f"POFO's mark: about {POFO_MARK:.0%} of the recomputation overhead removed.", "")


def split_svgs(html: Path, prefix: str, runs: list[dict], out: Path) -> list[Path]:
    """Each <svg> of the check's HTML page, in the order of `runs`, as prefix-MODEL.svg."""
    svgs = re.findall(r"<svg\b.*?</svg>", html.read_text(), flags=re.S)
    written = []
    for run, svg in zip(runs, svgs):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", run["model"]).strip("-")
        path = out / f"{prefix}-{name}.svg"
        path.write_text(svg + "\n")
        written.append(path)
    return written


def copy_chains(source: Path, out: Path) -> list[Path]:
    """The chain files the check saved (remat_training_bench --chains), copied into `out`
    once every one of them is checked to be a remat chain (its format, a list of stages):
    either all are copied or, with a ValueError, none."""
    if not source.is_dir():
        raise ValueError("no chains/ folder in the results (the check saves one from its fidelity "
                         "and throughput parts)")
    texts = {path.name: path.read_text() for path in sorted(source.glob("*.json"))}
    if not texts:
        raise ValueError("no chain in the results' chains/ folder")
    for name, text in texts.items():
        chain = json.loads(text)
        if not (isinstance(chain, dict) and str(chain.get("format", "")).startswith("remat-chain/")
                and isinstance(chain.get("stages"), list) and chain["stages"]):
            raise ValueError(f"{name}: not a remat chain")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        (out / name).write_text(text)
        written.append(out / name)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="the output folder, or results.tar.gz")
    p.add_argument("--markdown", type=Path, help="also write the report here")
    p.add_argument("--img-dir", type=Path, help="write each throughput plot here as an SVG")
    p.add_argument("--chains-dir", type=Path, help="copy the profiled chains (chains/*.json) here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target was missed")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.results
        if args.results.is_file():
            try:
                with tarfile.open(args.results) as tar:
                    tar.extractall(tmp, filter="data")
            except (OSError, tarfile.TarError) as error:
                print(f"gpu_results: {args.results}: {error}", file=sys.stderr)
                return 2
            found = [f.parent for f in Path(tmp).rglob("gpu-check.log")]
            folder = found[0] if found else Path(tmp)
        if not folder.is_dir():
            print(f"gpu_results: {args.results}: neither a folder nor a tarball", file=sys.stderr)
            return 2
        report = Report()
        try:
            files = {f.name: f for f in folder.iterdir()}
            parts = [("environment.json", environment), ("fidelity.json", fidelity),
                     ("throughput.json", throughput),
                     ("reference.json", lambda d, r: throughput(d, r, reference=True)),
                     ("transformers.json", transformers), ("offload.json", offload)]
            for name, part in parts:
                if name in files:
                    part(json.loads(files[name].read_text()), report)
            if args.img_dir:
                args.img_dir.mkdir(parents=True, exist_ok=True)
                for prefix in ("throughput", "reference"):
                    if f"{prefix}.html" in files and f"{prefix}.json" in files:
                        for path in split_svgs(files[f"{prefix}.html"], f"gpu-{prefix}",
                                               json.loads(files[f"{prefix}.json"].read_text()), args.img_dir):
                            print(f"gpu_results: wrote {path}", file=sys.stderr)
                if "offload.svg" in files:
                    path = args.img_dir / "gpu-offload.svg"
                    path.write_text(files["offload.svg"].read_text())
                    print(f"gpu_results: wrote {path}", file=sys.stderr)
            if args.chains_dir:
                for path in copy_chains(folder / "chains", args.chains_dir):
                    print(f"gpu_results: wrote {path}", file=sys.stderr)
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"gpu_results: {folder}: cannot read the results: {type(error).__name__}: {error}",
                  file=sys.stderr)
            return 2
    if report.missed:
        report.add("### Targets missed", "", *(f"- {m}" for m in report.missed), "")
    else:
        report.add("Every target checked here was met.", "")
    text = "\n".join(report.lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if args.strict and report.missed else 0


if __name__ == "__main__":
    sys.exit(main())
