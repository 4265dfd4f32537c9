#!/usr/bin/env bash
# The GPU check, in one command: builds remat against this machine's PyTorch (every CUDA
# source), runs the CUDA tests, the fidelity table, the throughput benchmark (remat against
# plain LibTorch, plain PyTorch and torch.utils.checkpoint.checkpoint_sequential on the same
# torchvision networks), the published reference point, GPT-2 against Hugging Face's
# checkpointing, data-parallel training, the Python package, and last the CPU tests. Logs,
# tables and plots go to the output folder (docs/gpu-check.md says what each holds).
# scripts/gpu-session.sh runs it in the background across several device calls.
#
#   bash scripts/gpu-check.sh                     on the GPU machine, output in $OUT; the
#                                                 header-only packages it lacks in .devdeps/
#                                                 (docs/gpu-check.md)
#   bash scripts/gpu-check.sh --cpu --build build --out DIR
#                                                 CPU mode: tiny sizes, on an existing build (CI)
# Options: --only PARTS, a comma list of build, tests (the CUDA ones), fidelity, throughput,
# reference, transformers, distributed, python, offload, models, cpu-tests (run in that order
# whatever the list's; GPU mode's default is all but models and cpu-tests, CPU mode's all but
# build, tests and cpu-tests; on a fresh machine, build must be among them; offload:
# bench/offload_bench.py; models: models as they come against Hugging Face's checkpointing,
# torch.compile's budget and a selective policy, bench/any_model_bench.py, about 5 minutes a
# model on a GPU), --zoo MODELS (the models part's, of bench/model_zoo.py), --compile-budgets
# LIST (the models part's torch.compile activation_memory_budget values),
# --build DIR (default build-gpu), --out DIR (default $OUT), --models resnet50:128:224,...
# (throughput models, batch sizes and image sizes; a model may be NAME@GRANULARITY, remat's
# stages at that granularity, e.g. inception_v3@branch:64:299), --no-stages-table (the fidelity
# part leaves out its second table, each stage timed alone: a shorter check).
# Environment: REMAT_PYTHON, the Python with torch and torchvision (default python3).
# Exit status: 0 when every part ran and passed; 1 when a test failed or a measured peak
# exceeded its budget (the other parts still run); 2 for bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
mode=gpu
build=build-gpu
out=${OUT:-}
only=""
throughput_models=""
zoo_models=""
compile_budgets=""
stages_table=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --only) only=$2; shift ;;
    --models) throughput_models=$2; shift ;;
    --zoo) zoo_models=$2; shift ;;
    --compile-budgets) compile_budgets=$2; shift ;;
    --no-stages-table) stages_table=0 ;;
    *) echo "usage: $0 [--cpu] [--build DIR] [--out DIR] [--only PARTS] [--models M:B,...] [--zoo MODELS] [--compile-budgets LIST] [--no-stages-table]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "gpu-check: no output folder (set OUT or pass --out DIR)" >&2; exit 2; }
mkdir -p "$out"
source scripts/cuda-compiler.sh
python=${REMAT_PYTHON:-python3}
jobs=$(nproc 2>/dev/null || echo 2)
log=$out/gpu-check.log
status=0
started=$SECONDS
say() { echo "== [$(( SECONDS - started ))s] $*" | tee -a "$log"; }
run() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }
: > "$log"

if [ "$mode" = gpu ]; then
  device=cuda
  # The packages the machine lacks, carried in .devdeps (their headers, and fmt's library for
  # the programs built here), for every part: a later call may skip the build.
  if [ -f .devdeps/env.sh ]; then source .devdeps/env.sh >/dev/null; fi
  # Programs built on another machine against the same PyTorch (docs/gpu-check.md, "Built on
  # the CPU machine") find this machine's LibTorch and CUDA libraries; those built here find
  # the same ones.
  torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)
  if [ -n "$torch_lib" ]; then
    export LD_LIBRARY_PATH=$torch_lib:$torch_lib/../../nvidia/cu13/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # cpu-tests only when asked for: CI runs them, and device time is short.
  [ -n "$only" ] || only=build,tests,fidelity,throughput,reference,transformers,distributed,python,offload
  # Every block the caching allocator hands out is its tensor's size rounded up to 512 bytes
  # (remat::exact_cuda_blocks, which remat's profiler sets anyway), for every method measured,
  # PyTorch's baselines included; a setting given in the environment is kept.
  if [ -z "${PYTORCH_CUDA_ALLOC_CONF:-}${PYTORCH_ALLOC_CONF:-}" ]; then
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  fi
  distributed_args=(--model resnet50 --batch 64 --image 224 --steps 10 --budget 50%)
  # Plain training and the schedules take turns, in 5 rounds of 2 timed steps: a slow spell of
  # the machine is shared among them, not taken by one schedule.
  fidelity_args=(--models resnet18,resnet50,densenet121,inception_v3,inception_v3@branch --batch 32 --steps 10 --warmup 3 --rounds 5)
  [ -n "$throughput_models" ] || throughput_models=resnet50:128:224,resnet152:128:224,densenet201:64:224,inception_v3:64:299,inception_v3@branch:64:299,vgg16:64:224
  throughput_args=(--steps 10 --warmup 3)
  # PyTorch's configurations take turns, in 5 rounds of 2 timed steps (bench/pytorch_baseline.py).
  baseline_args=(--steps 10 --warmup 3 --rounds 5)
  # PyTorch's sublinear-memory reimplementation: resnet152, batch 16, 5459 MiB -> 2455 MiB
  # (45%) at 10% lower speed; remat at 45% of store-all, and at 40% and 35% (where the
  # parameters and gradients, which that figure included, would put 45% of the total).
  reference_spec=resnet152:16:224
  reference_budgets=100,45,40,35
  transformer_args=(--models gpt2,gpt2-medium --batch 8 --seq 1024 --steps 10 --warmup 3)
  transformer_repeat=(--repeat 3)
  python_bench_args=(--device cuda --steps 10)
  offload_args=(--device cuda --steps 10 --large)
  granularity_args=(--device cuda --batch 32)
  models_args=(--device cuda --size gpu --steps 5 --warmup 2
               --compile-budgets "${compile_budgets:-0.1,0.4,0.7,1.0}"
               --models "${zoo_models:-resnet50,vit_b_16,convnext_tiny,gpt2,llama,unet}")
else
  device=cpu
  [ -n "$only" ] || only=fidelity,throughput,reference,transformers,distributed,python,offload,models
  distributed_args=(--model resnet18 --batch 2 --image 32 --steps 2 --budget 100% --repeat 1)
  fidelity_args=(--models resnet18,resnet50,densenet121,inception_v3_noaux@branch --batch 2 --image 80 --steps 3 --warmup 1 --rounds 2 --repeat 1 --traced 2)
  [ -n "$throughput_models" ] || throughput_models=resnet18:4:64
  throughput_args=(--steps 3 --warmup 1 --repeat 1)
  baseline_args=(--steps 3 --warmup 1 --rounds 2)
  reference_spec=resnet18:2:64
  reference_budgets=100,45
  transformer_args=(--models gpt2 --batch 1 --seq 32 --steps 1 --warmup 0)
  transformer_repeat=(--repeat 1)
  python_bench_args=(--device cpu --steps 1 --quick)
  offload_args=(--device cpu --steps 1 --quick --models transformer --fractions 0.75,0.5)
  granularity_args=(--device cpu --quick)
  models_args=(--device cpu --size tiny --steps 1 --warmup 0 --budgets 75,50
               --compile-budgets "${compile_budgets:-0.5}" --models "${zoo_models:-unet,gpt2}")
fi
has() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
for part in ${only//,/ }; do
  case "$part" in
    build|tests|fidelity|throughput|reference|transformers|distributed|python|offload|models|cpu-tests) ;;
    *) echo "gpu-check: unknown part '$part' (known: build, tests, fidelity, throughput, reference, transformers, distributed, python, offload, models, cpu-tests)" >&2; exit 2 ;;
  esac
done

say "gpu-check ($mode mode) on $(hostname), output in $out"
if command -v nvidia-smi >/dev/null; then run nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
# The machine, for the tables' headings (tools/gpu_results.py reads environment.json).
run "$python" - "$out/environment.json" <<'PY'
import datetime, json, os, platform, subprocess, sys
import torch, torchvision
env = {"date": datetime.date.today().isoformat(), "host": platform.node(),
       "torch": torch.__version__, "cuda": torch.version.cuda,
       "cuda_available": torch.cuda.is_available(), "torchvision": torchvision.__version__,
       "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF")),
       "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
try:
    import transformers
    env["transformers"] = transformers.__version__
except ImportError:
    env["transformers"] = None
if torch.cuda.is_available():
    env["gpu"] = torch.cuda.get_device_name(0)
    env["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, check=True).stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        env["driver"] = None
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(" ".join(f"{k} {v}" for k, v in env.items()))
PY

if has build; then
  # Everything when tests run; else only the programs the selected parts run.
  targets=()
  if ! has tests && ! has cpu-tests; then
    { has fidelity || has throughput || has reference; } && targets+=(remat_training_bench)
    has transformers && targets+=(remat_transformer_bench)
    has distributed && targets+=(remat)
  fi
  say "building remat in $build against this machine's PyTorch${targets[*]:+ (${targets[*]})}"
  # (GPU mode sourced .devdeps/env.sh at the start.)
  if [ "$mode" = cpu ] && [ -f .devdeps/env.sh ]; then source .devdeps/env.sh; fi
  torch_prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  remat_cuda_compiler || true
  cuda_flag=-DREMAT_REQUIRE_CUDA=ON
  [ "$mode" = cpu ] && cuda_flag=-DREMAT_REQUIRE_CUDA=OFF
  run cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" \
    "$cuda_flag" -DREMAT_PYTHON="$(command -v "$python")" || { say "configure failed"; exit 1; }
  if has tests || has cpu-tests || [ ${#targets[@]} -gt 0 ]; then
    run cmake --build "$build" -j "$jobs" ${targets[@]:+--target "${targets[@]}"} || { say "build failed"; exit 1; }
  fi
fi
need() {  # need PROGRAM: it must have been built
  [ -x "$build/bin/$1" ] || { say "no $build/bin/$1: build first (--only build,...)"; exit 1; }
}
{ has fidelity || has throughput || has reference; } && need remat_training_bench
has transformers && need remat_transformer_bench
has distributed && need remat

if has tests; then
  # The CUDA tests one at a time (they share the GPU); the CPU tests come last (cpu-tests).
  say "tests: the CUDA ones"
  if [ -f "$build/CTestTestfile.cmake" ]; then
    run ctest --test-dir "$build" --output-on-failure --timeout 300 -R '(CUDA|cuda)' || status=1
  else
    # Test programs built elsewhere and carried here without CTest's files (docs/gpu-check.md,
    # "Built on the CPU machine"): each program's tests whose names say CUDA, one program at a
    # time. Catch matches names without regard to case.
    found=0
    for program in "$build"/tests/remat_*_tests; do
      [ -x "$program" ] || continue
      found=1
      say "tests: ${program##*/} '*cuda*'"
      run timeout 600 "$program" '*cuda*' || status=1
    done
    [ "$found" = 1 ] || { say "no CTest files and no test programs in $build/tests: build first (--only build,...)"; exit 1; }
  fi
fi

python_package=""  # where the package was installed, once it was
install_python_package() {
  # The package from this clone, built against this machine's torch (pip's build isolation
  # off: no network here, and scikit-build-core and pybind11 are installed), into a folder of
  # its own, once.
  [ -z "$python_package" ] || return 0
  say "the Python package: pip install (no build isolation)"
  remat_cuda_compiler || true
  export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
  python_package=$build/python-site
  rm -rf "$python_package"
  # The extension needs Python's headers, which a machine without -dev packages may lack.
  if ! "$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    say "no Python.h for $("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])'): the package cannot be built here"
    status=1
  fi
  run "$python" -m pip install --no-build-isolation --no-deps --no-index --target "$python_package" . || status=1
  export PYTHONPATH=$python_package${PYTHONPATH:+:$PYTHONPATH}
}

if has tests && [ "$mode" = gpu ]; then
  # The Python package's CUDA tests (names that say cuda: the CUDA twins of the random tuple
  # networks among them); CI runs the others.
  install_python_package
  say "tests: the Python package's CUDA ones"
  run "$python" -m pytest -q -p no:cacheprovider -rs -k cuda tests/python || status=1
fi

if has fidelity; then
  say "fidelity: measured peak and step time against the prediction, at 100/75/50/30% of store-all"
  run "$build/bin/remat_training_bench" fidelity --device "$device" --budgets 100,75,50,30 \
    "${fidelity_args[@]}" --chains "$out/chains" --json "$out/fidelity.json" --markdown "$out/fidelity.md" || status=1
  # The same with each stage timed alone (--timing stages), on the same machine: what timing
  # within whole passes (the default on a GPU) changes (docs/cost-model.md, "How times are taken").
  if [ "$mode" = gpu ] && [ "$stages_table" = 1 ]; then
    say "fidelity again, each stage timed alone (--timing stages)"
    run "$build/bin/remat_training_bench" fidelity --device "$device" --budgets 100,75,50,30 --timing stages \
      "${fidelity_args[@]}" --chains "$out/chains" --json "$out/fidelity-stages.json" --markdown "$out/fidelity-stages.md" || status=1
  fi
fi

# throughput_runs NAME SPECS BUDGETS: for each MODEL:BATCH:IMAGE of SPECS, PyTorch's side
# (plain and checkpoint_sequential for K = 2 .. 2 sqrt(L)), then remat's (plain LibTorch,
# optimal at BUDGETS percent of store-all, periodic); writes NAME.md, NAME.json, NAME.html.
throughput_runs() {
  local name=$1 specs=$2 budgets=$3 tables=() spec model batch image work
  # Per-model files beside the build, not in $out (the GPU machine returns 8 files at most).
  local work_dir=$build/gpu-check-work
  mkdir -p "$work_dir"
  for spec in ${specs//,/ }; do
    IFS=: read -r model batch image <<< "$spec"
    [ -n "$image" ] || { say "bad model entry '$spec': expected MODEL:BATCH:IMAGE"; exit 2; }
    work=$work_dir/$model-b$batch-$image
    say "$model, batch $batch: PyTorch (plain and checkpoint_sequential for K = 2 .. 2 sqrt(L))"
    # MODEL@GRANULARITY (inception_v3@branch): remat's stages; PyTorch's are torchvision's.
    run "$python" bench/pytorch_baseline.py --model "${model%@*}" --batch "$batch" --image "$image" --device "$device" \
      --segments all "${baseline_args[@]}" --json "$work-pytorch.json" || { status=1; continue; }
    say "$model, batch $batch: remat (plain LibTorch, optimal at $budgets% of store-all, periodic)"
    run "$build/bin/remat_training_bench" throughput --model "$model" --batch "$batch" --image "$image" --device "$device" \
      --budgets "$budgets" "${throughput_args[@]}" --pytorch-json "$work-pytorch.json" \
      --chains "$out/chains" --json "$work.json" --markdown "$work.md" --svg "$work.svg" || { status=1; continue; }
    tables+=("$work")
  done
  # One file of each kind: the tables, the results, the plots (one page).
  { for t in "${tables[@]}"; do echo "## ${t##*/}"; echo; cat "$t.md"; echo; done; } > "$out/$name.md"
  "$python" - "$out/$name" "${tables[@]}" <<'PY'
import json, sys
out, works = sys.argv[1], sys.argv[2:]
json.dump([json.load(open(w + ".json")) for w in works], open(out + ".json", "w"), indent=1)
with open(out + ".html", "w") as page:
    page.write("<!DOCTYPE html><html><head><meta charset='utf-8'><title>remat throughput</title></head><body>\n")
    for w in works:
        page.write(open(w + ".svg").read() + "\n")
    page.write("</body></html>\n")
PY
}

if has throughput; then
  say "throughput: remat against plain LibTorch, plain PyTorch and checkpoint_sequential"
  throughput_runs throughput "$throughput_models" 100,75,50,35,25
fi

if has reference; then
  say "the published reference point (resnet152, batch 16: 5459 -> 2455 MiB at 10% lower speed): $reference_spec at $reference_budgets% of store-all"
  throughput_runs reference "$reference_spec" "$reference_budgets"
fi

if has transformers; then
  say "transformers: GPT-2, Hugging Face's gradient_checkpointing_enable() against remat's schedules"
  hf_json=$build/gpu-check-work/hf-gpt2.json
  mkdir -p "${hf_json%/*}"
  if run "$python" bench/hf_gpt2_baseline.py --device "$device" "${transformer_args[@]}" --json "$hf_json"; then
    run "$build/bin/remat_transformer_bench" --device "$device" "${transformer_args[@]}" \
      "${transformer_repeat[@]}" --hf-json "$hf_json" --json "$out/transformers.json" \
      --markdown "$out/transformers.md" || status=1
  else
    status=1
  fi
fi

if has distributed; then
  # Data-parallel training through the backend --device chooses (NCCL on the GPU, Gloo on the
  # CPU), as a job of one rank started the way torchrun starts one (docs/distributed.md).
  say "data-parallel: remat train as rank 0 of 1 ($( [ "$mode" = gpu ] && echo NCCL || echo Gloo ))"
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    run "$build/bin/remat" train --device "$device" --classes 10 --timeout 120 "${distributed_args[@]}" || status=1
fi

if has python; then
  [ "$mode" = gpu ] && install_python_package
  say "the Python benchmark: remat, checkpoint_sequential and rockmate at 75/50/35% of store-all"
  run "$python" bench/python_bench.py "${python_bench_args[@]}" --json "$out/python.json" \
    --markdown "$out/python.md" || status=1
  say "finer stages: a ResNet by block, by convolution unit and by operation (predictions)"
  run "$python" bench/granularity_bench.py "${granularity_args[@]}" --markdown "$out/granularity.md" || status=1
fi

if has offload; then
  [ "$mode" = gpu ] && install_python_package  # once
  say "offload: remat with offload against recomputation only (and save_on_cpu on a GPU), 75-15% of store-all"
  run "$python" bench/offload_bench.py "${offload_args[@]}" --json "$out/offload.json" --plot "$out/offload.svg" \
    --markdown "$out/offload.md" || status=1
fi

if has models; then
  [ "$mode" = gpu ] && install_python_package  # once
  say "models as they come: remat against Hugging Face's checkpointing, torch.compile and a selective policy"
  run "$python" bench/any_model_bench.py "${models_args[@]}" --json "$out/models.json" \
    --plot "$out/models.svg" > "$out/models.md" || status=1
  cat "$out/models.md" >> "$log"
fi

if has cpu-tests; then
  say "tests: the CPU ones, in parallel"
  run ctest --test-dir "$build" --output-on-failure --timeout 600 -j "$jobs" -E '(CUDA|cuda)' || status=1
fi

say "done: $( [ $status = 0 ] && echo passed || echo FAILED ) in $(( SECONDS - started )) s; files in $out"
exit $status
