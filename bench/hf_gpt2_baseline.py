"""Hugging Face's side of the GPT-2 benchmark: transformers' GPT2LMHeadModel trained as users
run it, with plain autograd and with gradient_checkpointing_enable(), for
remat_transformer_bench --hf-json to set beside remat's schedules at equal measured memory
(docs/models.md).

    python bench/hf_gpt2_baseline.py --models gpt2,gpt2-medium --batch 8 --seq 1024 \
        --device cuda --steps 10 --warmup 3 --json hf.json

The model: GPT2LMHeadModel(GPT2Config(...)) with the published sizes of each configuration
(gpt2: 12 layers, width 768, 12 heads; gpt2-medium: 24, 1024, 16; gpt2-large: 36, 1280, 20;
gpt2-xl: 48, 1600, 25), randomly initialized after torch.manual_seed(0) (no download), in
train mode (dropout 0.1 as published), float32, transformers' default attention
implementation (recorded in the output), use_cache=False (no key-value cache kept in
training; gradient_checkpointing_enable() turns it off anyway). The token ids: random integers in [0, 50257) of
shape batch x sequence, allocated once, on the device. A step: model(input_ids=ids,
labels=ids).loss (the causal LM loss, labels shifted inside), then backward. Parameter
gradients are allocated beforehand and zeroed (set_to_none=False) before each step, outside
the timed region; no optimizer update. This is what remat_transformer_bench times.

Configurations: "hf-plain" (plain autograd) and "hf-checkpointing" (after
model.gradient_checkpointing_enable() with its defaults: every block under
torch.utils.checkpoint.checkpoint, use_reentrant=False; the embeddings and the head are not
checkpointed).

Measurements, per configuration:
- step time: the median of --steps timed steps after --warmup untimed ones (on CUDA,
  torch.cuda.synchronize() before reading the clock);
- peak bytes: the peak during the step minus what was live just before it (parameters,
  gradients, the ids), plus the ids' bytes (rounded up to 512 on CUDA), because remat's cost
  model counts the chain's input in its peak and remat_transformer_bench measures it so.
  On CUDA: the caching allocator's max_memory_allocated after reset_peak_memory_stats, the
  largest over the timed steps. On CPU: one extra untimed step under torch.profiler's memory
  events (pytorch_baseline.timed_steps).
A configuration that runs out of CUDA memory is recorded as {"oom": true}.

Output: one progress line per configuration on stderr, a table on stdout and, with --json,
{"batch", "sequence", "device", "device_name", "torch", "transformers", "threads", "steps",
"results": [{"model", "method", "attn_implementation", "median_ms", "step_ms",
"peak_bytes", "tokens_per_s"} or {"model", "method", "oom": true}]}.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import warnings
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")
# On a GPU, every block the caching allocator hands out is its tensor's size rounded up to 512
# bytes, as remat's profiler makes it (remat::exact_cuda_blocks, docs/cost-model.md), so that
# every method is measured alike; a setting given in the environment is kept.
if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytorch_baseline import (  # noqa: E402
    _non_negative, _positive, device_name, format_bytes, parse_device, timed_steps)

# The published GPT-2 sizes: layers, width, heads (remat::models::gpt2_config's).
CONFIGS = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16),
           "gpt2-large": (36, 1280, 20), "gpt2-xl": (48, 1600, 25)}
VOCABULARY = 50257
POSITIONS = 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (argparse exits 2 on bad arguments)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2,gpt2-medium",
                   help="comma list of " + ", ".join(CONFIGS))
    p.add_argument("--batch", type=_positive, default=1)
    p.add_argument("--seq", type=_positive, default=1024, help=f"tokens (at most {POSITIONS})")
    p.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    p.add_argument("--steps", type=_positive, default=10, help="timed steps (median)")
    p.add_argument("--warmup", type=_non_negative, default=3)
    p.add_argument("--threads", type=_positive, help="torch.set_num_threads")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in CONFIGS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    if args.seq > POSITIONS:
        p.error(f"--seq: GPT-2 takes at most {POSITIONS} tokens")
    args.device = parse_device(p, args.device)
    return args


def gpt2(name: str, device: torch.device) -> torch.nn.Module:
    """transformers' GPT2LMHeadModel of the named size, random weights, train mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, width, heads = CONFIGS[name]
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCABULARY, n_positions=POSITIONS, n_layer=layers,
                        n_embd=width, n_head=heads, use_cache=False)
    return GPT2LMHeadModel(config).to(device).train()


def counted_bytes(t: torch.Tensor) -> int:
    """The tensor's bytes as remat counts them on its device (512-byte blocks on CUDA)."""
    n = t.numel() * t.element_size()
    return (n + 511) // 512 * 512 if t.device.type == "cuda" else n


def measure(model: torch.nn.Module, ids: torch.Tensor, steps: int, warmup: int) -> dict:
    """Times `steps` training steps after `warmup`; the peak bytes as the docstring says."""

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    times, peak = timed_steps(step, model, ids.device, steps, warmup)
    median = statistics.median(times)
    return {"median_ms": median, "step_ms": times, "peak_bytes": peak + counted_bytes(ids),
            "tokens_per_s": ids.numel() / (median / 1e3)}


def main(argv: list[str] | None = None) -> int:
    """Runs every configuration, prints the table, writes the JSON; returns the exit status."""
    args = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in args.models:
        model = gpt2(name, args.device)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        torch.manual_seed(1)
        ids = torch.randint(VOCABULARY, (args.batch, args.seq)).to(args.device)
        for method in ("hf-plain", "hf-checkpointing"):
            if method == "hf-checkpointing":
                with warnings.catch_warnings():  # deprecated in 5.x for activation_checkpointing_enable
                    warnings.simplefilter("ignore", FutureWarning)
                    model.gradient_checkpointing_enable()
            result: dict = {"model": name, "method": method,
                            "attn_implementation": getattr(model.config, "_attn_implementation", None)}
            oom = False
            try:
                result |= measure(model, ids, args.steps, args.warmup)
            except torch.OutOfMemoryError:
                oom = True  # cleaned up outside the handler, whose traceback holds the tensors
            if oom:
                result["oom"] = True
                model.zero_grad(set_to_none=False)
                gc.collect()
                torch.cuda.empty_cache()
            results.append(result)
            status = ("out of memory" if oom else
                      f"{result['median_ms']:.1f} ms, peak {format_bytes(result['peak_bytes'])}")
            print(f"{name} {method}: {status}", file=sys.stderr, flush=True)
        del model, ids
        gc.collect()
        if args.device.type == "cuda":
            torch.cuda.empty_cache()

    report = {"batch": args.batch, "sequence": args.seq, "device": str(args.device),
              "device_name": device_name(args.device), "torch": torch.__version__,
              "transformers": transformers.__version__, "threads": torch.get_num_threads(),
              "steps": args.steps, "results": results}
    print(f"GPT2LMHeadModel (transformers {transformers.__version__}), batch {args.batch}, "
          f"sequence {args.seq}, {args.device} ({report['device_name']}), torch "
          f"{torch.__version__}, median of {args.steps} steps after {args.warmup}")
    print(f"{'model':<12} {'method':<17} {'median ms':>10} {'tokens/s':>9} {'peak':>12}")
    for r in results:
        if r.get("oom"):
            print(f"{r['model']:<12} {r['method']:<17} {'out of memory':>10}")
            continue
        print(f"{r['model']:<12} {r['method']:<17} {r['median_ms']:>10.1f} "
              f"{r['tokens_per_s']:>9.0f} {format_bytes(r['peak_bytes']):>12}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
