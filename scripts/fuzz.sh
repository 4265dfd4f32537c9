#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang and runs each for a bounded time.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]   random seed, SECONDS each (default 60), every
#                                                target unless named; e.g. 3600 state_dict
#   bash scripts/fuzz.sh --ci                    what CI runs (scripts/run.sh test): every
#                                                committed input once, nothing new tried
#   bash scripts/fuzz.sh --merge [TARGET...]     adds to fuzz/corpus/<target>/ the inputs kept
#                                                by earlier runs that reach new code
# With SECONDS, new inputs that reach new code are kept in build-fuzz/corpus/<target>/ (the
# committed inputs in fuzz/corpus/<target>/ are only read); --merge then copies to
# fuzz/corpus/<target>/ those that reach code the committed ones do not (libFuzzer's -merge=1),
# to be committed. --ci replays the committed inputs alone: a search for new inputs is not the
# same from one run to the next, even from the same random seed (the values the code compares,
# heap addresses among them, steer the mutations), so a CI that searched could fail by chance;
# replaying the same files cannot.
# A finding is written to build-fuzz/findings/<target>/ and fails the script; reproduce it
# with build-fuzz/fuzz_<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=0
merge=0
if [ "${1:-}" = --ci ]; then ci=1; shift; seconds=600
elif [ "${1:-}" = --merge ]; then merge=1; shift; seconds=600
else seconds=${1:-60}; shift || true; fi
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(chain_parser graph_parser solver state_dict safetensors)
case "$seconds" in ''|*[!0-9]*) echo "usage: $0 [SECONDS | --ci | --merge] [TARGET...]" >&2; exit 2 ;; esac
command -v clang++ >/dev/null || { echo "remat: the fuzz targets need clang++ (apt-get install clang libclang-rt-dev)" >&2; exit 1; }

source scripts/ccache.sh
remat_use_ccache
build=build-fuzz
cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The targets run side by side, one per core (each is one process on one core); each one's
# summary is printed when all have ended, in the order named.
run_target() {  # run_target <target>: writes $build/fuzz_<target>.log and .status (its exit code)
  local target=$1 corpus limits code=0
  corpus=$build/corpus/$target
  limits=(-max_total_time="$seconds")
  if [ $ci = 1 ]; then
    # The committed inputs, each run once (-runs=0: no new input is made).
    corpus=$build/ci-corpus/$target
    rm -rf "$corpus" && mkdir -p "$corpus"
    limits+=(-runs=0)
  elif [ $merge = 1 ]; then
    "$build/fuzz_$target" -merge=1 "fuzz/corpus/$target" "$build/corpus/$target" \
        -rss_limit_mb=2048 -timeout=10 > "$build/fuzz_$target.log" 2>&1 || code=$?
    echo "$code" > "$build/fuzz_$target.status"
    return
  fi
  # -rss_limit_mb: an input that makes the reader take 2 GB is a finding; -timeout: so is one
  # that takes 10 s.
  "$build/fuzz_$target" "$corpus" "fuzz/corpus/$target" "${limits[@]}" \
      -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$build/findings/$target/" > "$build/fuzz_$target.log" 2>&1 || code=$?
  echo "$code" > "$build/fuzz_$target.status"
}
for target in "${targets[@]}"; do
  [ -d "fuzz/corpus/$target" ] || { echo "remat: no fuzz target '$target'" >&2; exit 2; }
done
cores=$(nproc 2>/dev/null || echo 2)
for target in "${targets[@]}"; do
  mkdir -p "$build/corpus/$target" "$build/findings/$target"
  rm -f "$build/fuzz_$target.status"
  if [ $ci = 1 ]; then
    echo "== fuzz_$target: the $(ls "fuzz/corpus/$target" | wc -l) committed inputs, once each"
  elif [ $merge = 1 ]; then
    echo "== fuzz_$target: merging $build/corpus/$target into fuzz/corpus/$target"
  else
    echo "== fuzz_$target for ${seconds} s"
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$cores" ]; do wait -n || true; done
  run_target "$target" &
done
wait
status=0
for target in "${targets[@]}"; do
  echo -n "fuzz_$target: "
  if [ "$(cat "$build/fuzz_$target.status" 2>/dev/null)" != 0 ]; then
    echo "found a failing input (log: $build/fuzz_$target.log):"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$build/fuzz_$target.log" | head -n 10
    status=1
  fi
  if [ $merge = 1 ]; then
    grep -E "MERGE-OUTER: [0-9]+ new files" "$build/fuzz_$target.log" || echo
  else
    # The code reached (cov: its edges), and what ran.
    grep -oE "(INITED|DONE) +cov: [0-9]+" "$build/fuzz_$target.log" | tail -n 1 | tr -s ' ' | tr '\n' ' '
    grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$build/fuzz_$target.log" | tr '\n' ' '
    echo
  fi
done
exit $status
