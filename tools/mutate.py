#!/usr/bin/env python3
"""A mutation check of remat's tests: applies plausible bugs, one at a time, to a copy of the
tree, builds, runs the tests that should notice, and reports which mutations survived.

    python3 tools/mutate.py            # the solver, simulator and report mutations (no LibTorch)
    python3 tools/mutate.py --list     # the mutations, with what each would break
    python3 tools/mutate.py --only ID  # one mutation

The copy is made with `git archive HEAD` in build-mutate/tree (committed code only) and
built without LibTorch (REMAT_WITH_TORCH=OFF) in build-mutate/build: the solver, report and
CLI tests. Exit status 1 when a mutation survives without a written reason (EXPLAINED); a
surviving mutation needs a test, or such a reason. docs/testing.md reports the kill rate.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, file, the text replaced, its replacement, what the bug would be)
MUTATIONS = [
    ("sim-fwd-tmp", "solver/src/simulator.cpp",
     "temporary = stage->fwd_tmp_bytes;", "temporary = 0;",
     "the simulator forgets a forward's temporary memory"),
    ("sim-nograd-tmp", "solver/src/simulator.cpp",
     "temporary = stage->nograd_tmp_bytes();", "temporary = stage->fwd_tmp_bytes;",
     "a forward without autograd is charged the autograd forward's temporary"),
    ("sim-loss-tmp", "solver/src/simulator.cpp",
     "temporary = chain.loss_tmp_bytes;", "temporary = 0;",
     "the loss's temporary is not counted"),
    ("sim-bwd-tmp", "solver/src/simulator.cpp",
     "temporary = stage->bwd_tmp_bytes;", "temporary = 0;",
     "a backward's temporary is not counted"),
    ("sim-saved-outputs", "solver/src/simulator.cpp",
     "held.push_back(value[ui + 1][static_cast<std::size_t>(k)]);", "(void)k;",
     "the autograd state does not hold the output members the stage saves"),
    ("sim-keep-x0", "solver/src/simulator.cpp",
     "    if (k == 0) return;\n", "    if (k < 0) return;\n",
     "the caller's input x_0 is freed by the schedule"),
    ("sim-lifetime", "solver/src/simulator.cpp",
     "return next_read[uk] != kNever && next_read[uk] < next_produce[uk];",
     "return next_read[uk] != kNever && next_read[uk] <= next_produce[uk];",
     "a value is kept although it is produced again before its next read"),
    ("sim-grad-release", "solver/src/simulator.cpp",
     "        if (id >= 0) memory.release(id, Memory::kGradient);\n", "        (void)id;\n",
     "B_i never frees y_{i+1}"),
    ("units-round-down", "solver/include/remat/solver/solver.h",
     "return bytes / unit_bytes + (bytes % unit_bytes != 0 ? 1 : 0);", "return bytes / unit_bytes;",
     "sizes are rounded down to memory slots, so a schedule can exceed its budget"),
    ("parse-kib", "solver/src/units.cpp",
     '{"KiB", std::int64_t{1} << 10},', '{"KiB", 1000},', "KiB parsed as 1000 bytes"),
    ("periodic-size", "solver/src/heuristics.cpp",
     "const int size = length / segments;", "const int size = (length + segments - 1) / segments;",
     "periodic's segments are sized as rounded up, not as checkpoint_sequential does"),
    ("dp-lf-bound", "solver/src/persistent_dp.cpp",
     "if (uj > i + 1) lf = std::max(lf, c.x[uj - 1] + c.x[uj] + c.nt[uj - 1]);",
     "if (uj > i + 1) lf = std::max(lf, c.x[uj - 1] + c.x[uj]);",
     "the dynamic program forgets a no-grad forward's temporary in a bound"),
    ("plot-off-scale", "report/src/plots.cpp",
     "const bool off_scale = p.makespan_ms > y.d1;", "const bool off_scale = false;",
     "points above the trade-off plot's scale are drawn outside it"),
]


# Survivors with a written reason: they do not fail the check, and the reason is printed.
EXPLAINED = {
    "sim-lifetime": "equivalent: the operation that next reads x_k (it reads x_k, produces "
                    "x_{k+1}) is never the one that next produces x_k, so < and <= agree",
}


def run(cmd, cwd, log):
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        return subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    mutations = [m for m in MUTATIONS if not args.only or m[0] in args.only]
    if args.list:
        for mid, path, _, _, why in mutations:
            print(f"{mid:20} {path:40} {why}")
        return 0
    if args.only and len(mutations) != len(args.only):
        sys.exit("remat: unknown mutation in --only (see --list)")
    work = os.path.join(ROOT, "build-mutate")
    tree, build, log = (os.path.join(work, d) for d in ("tree", "build", "mutate.log"))
    # A fresh build too: `git archive` gives the sources the commit's times, older than objects
    # a previous run built from a mutated source, which make would then keep.
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(build, ignore_errors=True)
    os.makedirs(tree)
    open(log, "w").close()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True,
                             stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    if run(["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DREMAT_WITH_TORCH=OFF", "-DREMAT_BUILD_BENCH=OFF"], ROOT, log) != 0 or \
            run(["cmake", "--build", build, "-j", str(args.jobs)], ROOT, log) != 0:
        sys.exit(f"remat: the unmutated tree does not build (log: {log})")
    if run(["ctest", "--test-dir", build, "-j", str(args.jobs)], ROOT, log) != 0:
        sys.exit(f"remat: the unmutated tree fails its tests (log: {log})")
    survived = []
    for mid, path, old, new, why in mutations:
        source = os.path.join(tree, path)
        original = open(source).read()
        if original.count(old) != 1:
            sys.exit(f"remat: mutation {mid}: its text is not found once in {path} (update it)")
        started = time.time()
        open(source, "w").write(original.replace(old, new))
        try:
            if run(["cmake", "--build", build, "-j", str(args.jobs)], ROOT, log) != 0:
                verdict = "killed (does not build)"
            elif run(["ctest", "--test-dir", build, "-j", str(args.jobs), "--stop-on-failure"],
                     ROOT, log) != 0:
                verdict = "killed"
            else:
                verdict = "SURVIVED"
                survived.append(mid)
        finally:
            open(source, "w").write(original)
        print(f"{mid:20} {verdict:24} {time.time() - started:5.0f} s  {why}", flush=True)
        if verdict == "SURVIVED" and mid in EXPLAINED:
            print(f"{'':20} {EXPLAINED[mid]}", flush=True)
    killed = len(mutations) - len(survived)
    print(f"\n{killed} of {len(mutations)} mutations killed"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    unexplained = [mid for mid in survived if mid not in EXPLAINED]
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
