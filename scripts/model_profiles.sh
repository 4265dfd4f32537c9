#!/usr/bin/env bash
# What the optimal schedule buys on each model family (the table in docs/models.md):
# profiles each model on this machine's CPU, then asks `remat schedule` for the optimal
# schedule at 50% and 25% of the store-all peak.
#   scripts/model_profiles.sh [BATCH] [MODELS...]
# Environment: REMAT (the remat binary), OUT (where the chains go), IMAGE (input size; the
# model's own minimum when that is larger, as for inception_v3's 299), REPEAT (profiler
# repetitions, default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
remat=${REMAT:-build/bin/remat}
out=${OUT:-build/model-profiles}
batch=${1:-4}
image=${IMAGE:-128}
repeat=${REPEAT:-3}
shift || true
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  models=(resnet18 resnet50 resnet101 resnet152 vgg11 vgg16 vgg19_bn inception_v3 densenet121
          densenet169 densenet201)
fi
mkdir -p "$out"
printf '| model | stages | input | store-all peak | least budget | at 50%% | at 25%% |\n|---|---|---|---|---|---|---|\n'
for model in "${models[@]}"; do
  size=$image
  [ "$model" = inception_v3 ] && [ "$size" -lt 299 ] && size=299
  chain="$out/$model-b$batch-$size.json"
  [ -f "$chain" ] || "$remat" profile --model "$model" --batch "$batch" --image "$size" \
                       --repeat "$repeat" -o "$chain" \
                       --format json >/dev/null 2>"$out/$model.log" ||
                       { cat "$out/$model.log" >&2; rm -f "$chain"; exit 1; }
  row=$(python3 - "$chain" "$remat" <<'PY'
import json, subprocess, sys
chain_path, remat = sys.argv[1], sys.argv[2]
chain = json.load(open(chain_path))
def schedule(budget):
    r = subprocess.run([remat, "schedule", "--chain", chain_path, "--budget", budget,
                        "--format", "json"], capture_output=True, text=True)
    return json.loads(r.stdout) if r.stdout.strip() else None
full = schedule("100%")
def mib(b): return f"{b / 2**20:,.1f} MiB"
def cell(p):
    s = schedule(p)
    if s is None or s["status"] == "infeasible":
        return "infeasible"
    return f"+{100 * (s['makespan_ms'] / full['store_all_makespan_ms'] - 1):.1f}%"
least = schedule("1")["min_feasible_budget_bytes"]
peak = full["budget_bytes"]
n = len(chain["stages"])
name = chain["name"].split(" ")
print(f"| {name[0]} | {n} | {name[1]} {name[2]} | {mib(peak)} | {mib(least)} ({100 * least / peak:.0f}%) | {cell('50%')} | {cell('25%')} |")
PY
)
  echo "$row"
done
