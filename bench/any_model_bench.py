"""Models as they come under remat, against what their users have today, side by side in one
run: step time and measured peak at each memory setting.

    python bench/any_model_bench.py --models resnet50,gpt2 --device cpu --json out.json \
        --plot out.svg

For each model of bench/model_zoo.py (its sizes: --size cpu or gpu):
- "plain": plain autograd, everything stored. Its measured peak is store-all, the 100% of
  the budgets.
- "remat": `remat.Checkpointable(model, sample)` (captured, split, measured once), then
  solved and run at --budgets percent of store-all (default 90, 75, 50, 35, 25).
- "remat-chain": remat on the hand-written chain of bench/torchvision_stages.py (resnet50,
  densenet121, inception_v3), at the same budgets.
- "hf-checkpointing": Hugging Face's `gradient_checkpointing_enable()` (every block).
- "compile": `torch.compile` with torch._functorch.config.activation_memory_budget at each
  of --compile-budgets (default 0.1, 0.2, ..., 1). Backend --compile-backend: by default
  inductor on a GPU; on the CPU aot_eager_decomp_partition, the same min-cut partitioner
  that honours the budget without Inductor's C++ code generation (minutes a model here).
- "selective": each repeated block (model_zoo.blocks) under torch.utils.checkpoint with a
  selective policy that saves matrix products, convolutions and attention, and recomputes
  the rest.
- "checkpoint_sequential": torch's, on the hand-written chain, at --segments (default 2, 4,
  8 and the chain's length).

Every configuration runs --warmup untimed steps, then --steps timed ones (the median is
reported), then one step under torch.profiler's memory events for its peak: CPU memory
allocated during the step above what was live before it, the same count for every method
(pytorch_baseline.timed_steps; on CUDA the caching allocator's max_memory_allocated).
Parameter gradients are allocated before and zeroed between steps; no optimizer update.

Reported: a table per model (method, setting, measured peak and its share of store-all,
median step ms, and remat's prediction), then for each remat budget the fastest competitor
whose measured peak is no larger; remat's capture, split, measuring and solve times; a
plot of step time against measured peak, one panel per model (--plot, needs matplotlib).
A configuration that fails (a competitor that cannot capture a model) is reported as such.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_zoo  # noqa: E402
from pytorch_baseline import device_name, format_bytes, timed_steps  # noqa: E402

import remat  # noqa: E402

CHAINS = ("resnet50", "densenet121", "inception_v3")  # bench/torchvision_stages.py writes them


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(model_zoo.ALL),
                   help=f"comma-separated, of: {', '.join(model_zoo.ALL)}")
    p.add_argument("--size", choices=["cpu", "gpu", "tiny"], default=None,
                   help="the models' sizes (default: the device's kind)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--budgets", default="90,75,50,35,25", help="percent of store-all")
    p.add_argument("--compile-budgets", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0")
    p.add_argument("--compile-backend", default=None)
    p.add_argument("--segments", default="2,4,8,all")
    p.add_argument("--methods", default="plain,remat,remat-chain,hf-checkpointing,compile,selective,"
                                        "checkpoint_sequential")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="the plot (needs matplotlib; without it, a note)")
    p.add_argument("--from-json", type=Path,
                   help="no run: the tables and --plot of an earlier run's --json")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in model_zoo.ALL:
            p.error(f"--models: unknown model {m!r} (one of {', '.join(model_zoo.ALL)})")
    args.methods = set(args.methods.split(","))
    args.device = torch.device(args.device)
    args.size = args.size or ("gpu" if args.device.type == "cuda" else "cpu")
    args.budgets = [float(b) for b in args.budgets.split(",")]
    args.compile_budgets = [float(b) for b in args.compile_budgets.split(",") if b]
    args.compile_backend = args.compile_backend or (
        "inductor" if args.device.type == "cuda" else "aot_eager_decomp_partition")
    return args


def _progress(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.results = []

    def measure(self, model, method, setting, module, extra=None):
        """Runs the configuration's steps and records its median time and peak."""
        spec = self.spec

        def step():
            spec.loss(spec.call(module)).backward()

        entry = {"model": model, "method": method, "setting": setting}
        try:
            times, peak = timed_steps(step, spec.module, self.args.device, self.args.steps,
                                      self.args.warmup)
            entry.update(median_ms=statistics.median(times), step_ms=times, peak_bytes=peak)
        except Exception as error:  # a competitor that fails on this model: recorded as such
            entry["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        entry.update(extra or {})
        self.results.append(entry)
        shown = (f"{format_bytes(entry['peak_bytes'])}, {entry['median_ms']:.1f} ms"
                 if "error" not in entry else entry["error"])
        _progress(f"{model} {method} {setting}: {shown}")
        gc.collect()
        return entry

    def run_model(self, name):
        args = self.args
        spec = model_zoo.build(name, args.size, args.device)
        spec.module.train()
        self.spec = spec
        module = spec.module
        for p in module.parameters():
            p.grad = torch.zeros_like(p)
        plain = self.measure(name, "plain", "store-all", module, {"description": spec.description})
        if "error" in plain:
            return
        store_all = plain["peak_bytes"]
        budgets = [(pct, int(store_all * pct / 100)) for pct in args.budgets]
        if "remat" in args.methods:
            self.run_remat(name, "remat", module, spec.sample, store_all, budgets)
        if name in CHAINS and ({"remat-chain", "checkpoint_sequential"} & args.methods):
            import torchvision_stages

            chain = torchvision_stages.chain_of(module, name)
            if "remat-chain" in args.methods:
                self.run_remat(name, "remat-chain", chain, spec.sample, store_all, budgets)
            if "checkpoint_sequential" in args.methods:
                self.run_checkpoint_sequential(name, chain)
        if spec.hugging_face and "hf-checkpointing" in args.methods:
            # transformers 5 renamed gradient_checkpointing_enable (kept, deprecated).
            enable = getattr(module, "activation_checkpointing_enable", None) or \
                module.gradient_checkpointing_enable
            disable = getattr(module, "activation_checkpointing_disable", None) or \
                module.gradient_checkpointing_disable
            enable()
            self.measure(name, "hf-checkpointing", "every block", module)
            disable()
        if "selective" in args.methods:
            with selective_checkpointing(module, model_zoo.BLOCKS.get(name, ())) as count:
                self.measure(name, "selective", f"{count} blocks, save matmuls", module)
        if "compile" in args.methods:
            self.run_compile(name, module)
        # Plain again, last: the first configuration of a model also pays what a process does
        # once (the allocator's growth, page faults), which a second turn does not.
        self.measure(name, "plain", "store-all, again", module)
        del self.spec

    def run_remat(self, name, method, module, sample, store_all, budgets):
        spec = self.spec
        start = time.perf_counter()
        # The step, `loss(call(module)).backward()`, lets the output go once the loss has its
        # value: output_held=False says so (the logits are not held through the backward).
        if method == "remat":
            wrapped = remat.Checkpointable(module, sample, progress=False, output_held=False)
        else:
            wrapped = remat.Checkpointable(module, progress=False, output_held=False)
            wrapped.measure(sample)
        total = time.perf_counter() - start
        captured = getattr(wrapped, "captured", None)
        times = {"stages": len(wrapped.chain.stage_names), "setup_s": total}
        if captured is not None:
            times.update(export_s=captured.export_seconds, split_s=captured.split_seconds,
                         measure_s=total - captured.export_seconds - captured.split_seconds)
        else:
            times["measure_s"] = total
        _progress(f"{name} {method}: {times['stages']} stages, ready in {total:.1f} s")
        run = wrapped if method == "remat" else _ChainCall(wrapped, spec)
        least = wrapped.min_budget()
        for pct, budget in budgets + [(None, least)]:
            solution = wrapped.compute_sequence(budget)
            setting = f"{pct:g}%" if pct is not None else f"least ({100 * least / store_all:.0f}%)"
            extra = dict(times, budget_bytes=budget, solve_s=solution.solve_seconds)
            if not solution.ok:
                self.results.append({"model": name, "method": method, "setting": setting,
                                     "infeasible": True, **extra})
                _progress(f"{name} {method} {setting}: no schedule fits")
                continue
            extra.update(predicted_peak_bytes=solution.peak_bytes,
                         predicted_ms=solution.makespan_ms)
            self.measure(name, method, setting, run, extra)

    def run_checkpoint_sequential(self, name, chain):
        spec = self.spec
        length = len(chain)
        counts = sorted({length if s == "all" else min(int(s), length)
                         for s in self.args.segments.split(",")})
        for segments in counts:
            def forward(x, segments=segments):
                return torch.utils.checkpoint.checkpoint_sequential(chain, segments, x,
                                                                    use_reentrant=False)

            self.measure(name, "checkpoint_sequential", f"{segments} segments",
                         _ChainCall(forward, spec))

    def run_compile(self, name, module):
        import torch._dynamo
        import torch._functorch.config as functorch_config

        for budget in self.args.compile_budgets:
            torch._dynamo.reset()
            start = time.perf_counter()
            with functorch_config.patch(activation_memory_budget=budget):
                compiled = torch.compile(module, backend=self.args.compile_backend)
                entry = self.measure(name, "compile", f"budget {budget:g}", compiled,
                                     {"backend": self.args.compile_backend})
            entry["compile_and_steps_s"] = time.perf_counter() - start
        torch._dynamo.reset()


class _ChainCall(torch.nn.Module):
    """A hand-written chain called as the model is: its output converted back for the loss."""

    def __init__(self, forward, spec):
        super().__init__()
        self.forward_chain = forward
        self.spec = spec

    def forward(self, x):
        out = self.forward_chain(x)
        if self.spec.name == "inception_v3" and isinstance(out, torch.Tensor):
            import torchvision_stages

            return torchvision_stages.split_inception_output(out, self.spec.extra["classes"])
        return out


def _save_matmuls_policy():
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    saved = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
             aten.convolution.default, aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_efficient_attention.default}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention"):
        if hasattr(aten, name):
            saved.add(getattr(aten, name).default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


@contextlib.contextmanager
def selective_checkpointing(module, classes=()):
    """Each repeated block's forward under torch.utils.checkpoint, saving matrix products,
    convolutions and attention; yields the number of blocks."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_policy())
    wrapped = []
    for _, block in model_zoo.blocks(module, classes):
        inner = block.forward

        def forward(*a, inner=inner, **k):
            return checkpoint(inner, *a, use_reentrant=False, context_fn=context_fn, **k)

        block.forward = forward
        wrapped.append(block)
    try:
        yield len(wrapped)
    finally:
        for block in wrapped:
            del block.forward


def report(results, args, out=sys.stdout):
    by_model = {}
    for r in results:
        by_model.setdefault(r["model"], []).append(r)
    for model, rows in by_model.items():
        plain = [r for r in rows if r["method"] == "plain" and "peak_bytes" in r]
        if not plain:
            print(f"\n## {model}\n\nfailed: {rows[0].get('error', 'no plain step')}", file=out)
            continue
        store_all = plain[0]["peak_bytes"]
        print(f"\n## {model} ({rows[0].get('description', '')})\n", file=out)
        print("| method | setting | measured peak | of store-all | median step | remat's prediction |",
              file=out)
        print("|---|---|---:|---:|---:|---|", file=out)
        for r in rows:
            if "error" in r:
                print(f"| {r['method']} | {r['setting']} | failed: {r['error']} | | | |", file=out)
                continue
            if r.get("infeasible"):
                print(f"| {r['method']} | {r['setting']} | no schedule fits | | | |", file=out)
                continue
            predicted = (f"{format_bytes(r['predicted_peak_bytes'])}, {r['predicted_ms']:.1f} ms"
                         if "predicted_peak_bytes" in r else "")
            print(f"| {r['method']} | {r['setting']} | {format_bytes(r['peak_bytes'])} | "
                  f"{100 * r['peak_bytes'] / store_all:.0f}% | {r['median_ms']:.1f} ms | {predicted} |",
                  file=out)
        remats = [r for r in rows if r["method"] == "remat" and "median_ms" in r]
        others = [r for r in rows if r["method"] not in ("remat", "remat-chain") and "median_ms" in r]
        if remats:
            print("\n| remat budget | remat peak, step | fastest competitor at no more memory | "
                  "its peak, step | remat's speed-up |", file=out)
            print("|---|---|---|---|---:|", file=out)
            for r in remats:
                fits = [o for o in others if o["peak_bytes"] <= r["peak_bytes"]]
                best = min(fits, key=lambda o: o["median_ms"]) if fits else None
                shown = (f"{best['method']} ({best['setting']}) | {format_bytes(best['peak_bytes'])}, "
                         f"{best['median_ms']:.1f} ms | {best['median_ms'] / r['median_ms']:.2f}x"
                         if best else "none fits | | ")
                print(f"| {r['setting']} | {format_bytes(r['peak_bytes'])}, {r['median_ms']:.1f} ms | "
                      f"{shown} |", file=out)
            first = remats[0]
            solves = ", ".join(f"{r['solve_s']:.3f}" for r in rows
                               if r["method"] == "remat" and "solve_s" in r)
            print(f"\nremat: {first['stages']} stages; export {first.get('export_s', 0):.2f} s, split "
                  f"{first.get('split_s', 0):.2f} s, measuring {first['measure_s']:.1f} s; solve "
                  f"{solves} s", file=out)


def plot(results, path):
    try:
        import matplotlib
    except ImportError:
        print(f"no plot: matplotlib is not installed (bench/any_model_bench.py --from-json "
              f"results.json --plot {path} draws it elsewhere)", file=sys.stderr)
        return

    matplotlib.use("svg" if path.suffix == ".svg" else "agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a tenth of the file
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in results))
    cols = min(4, len(models))
    rows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    styles = {"plain": ("k", "s"), "remat": ("C0", "o"), "remat-chain": ("C9", "^"),
              "hf-checkpointing": ("C1", "D"), "compile": ("C3", "x"), "selective": ("C2", "P"),
              "checkpoint_sequential": ("C4", "v")}
    for ax, model in zip(axes.flat, models):
        rows_ = [r for r in results if r["model"] == model and "median_ms" in r]
        for method, (color, marker) in styles.items():
            pts = sorted((r["peak_bytes"] / 2**20, r["median_ms"]) for r in rows_ if r["method"] == method)
            if pts:
                ax.plot(*zip(*pts), color=color, marker=marker, label=method,
                        linestyle="-" if len(pts) > 1 else "none")
        ax.set_title(model)
        ax.set_xlabel("measured peak (MiB)")
        ax.set_ylabel("step (ms)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path)


def main(argv=None):
    args = parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        print(f"# Models as they come: {data['device_name']}, torch {data['torch']}, "
              f"{data['threads']} threads, {data['date']}")
        report(data["results"], args)
        if args.plot:
            plot(data["results"], args.plot)
        return 0
    torch.manual_seed(0)
    bench = Bench(args)
    started = time.perf_counter()
    def header():
        return {"device": str(args.device), "device_name": device_name(args.device),
                "torch": torch.__version__, "threads": torch.get_num_threads(),
                "size": args.size, "steps": args.steps, "compile_backend": args.compile_backend,
                "date": time.strftime("%Y-%m-%d"), "seconds": time.perf_counter() - started}

    for name in args.models:
        _progress(f"{name}: building")
        try:
            bench.run_model(name)
        except Exception:
            traceback.print_exc()
            bench.results.append({"model": name, "method": "setup", "setting": "",
                                  "error": traceback.format_exc().splitlines()[-1]})
        if args.json:  # after each model: a long run stopped early keeps what it measured
            args.json.write_text(json.dumps({**header(), "results": bench.results}, indent=1))
    header = header()
    print(f"# Models as they come: {header['device_name']}, torch {header['torch']}, "
          f"{header['threads']} threads, {header['date']}")
    report(bench.results, args)
    if args.json:
        args.json.write_text(json.dumps({**header, "results": bench.results}, indent=1))
    if args.plot:
        plot(bench.results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
