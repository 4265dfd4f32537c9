#!/usr/bin/env python3
"""CTest bench.fidelity_rounds: `remat_training_bench fidelity --rounds R` gives plain training
and every feasible schedule all of --steps timed steps, in R rounds in which they take turns
(the GPU check's fidelity part relies on it: docs/gpu-check.md).

    python3 bench/check_fidelity_rounds.py build/bin/remat_training_bench
"""
import json
import os
import re
import subprocess
import sys
import tempfile

STEPS, ROUNDS = 5, 3  # rounds of 2, 2 and 1 timed steps


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fidelity.json")
        run = subprocess.run(
            [bench, "fidelity", "--models", "resnet18", "--batch", "2", "--image", "64",
             "--budgets", "100,99,5", "--steps", str(STEPS), "--warmup", "1",
             "--rounds", str(ROUNDS), "--repeat", "1", "--traced", "1", "--threads", "1",
             "--json", out, "--markdown", os.path.join(tmp, "fidelity.md")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            print(run.stdout, run.stderr, sep="\n")
            return 1
        result = json.load(open(out))
    failures = []
    if result["rounds"] != ROUNDS:
        failures.append(f"rounds {result['rounds']}, not {ROUNDS}")
    # resnet18 fits at 100% and 99% of store-all, not at 5%. (Its least budget on the CPU is
    # 85% with LibTorch 1.13 and above 90% with 2.15, whose convolutions take more scratch
    # memory: a fixed 90% failed there.)
    feasible = [row for row in result["rows"] if not row.get("infeasible")]
    if [row["percent"] for row in feasible] != [100, 99]:
        failures.append(f"feasible budgets {[row['percent'] for row in feasible]}, not [100, 99]")
    if not any(row.get("infeasible") for row in result["rows"]):
        failures.append("5% of store-all was not infeasible")
    for row in feasible + result["plain"]:
        if len(row.get("step_ms", [])) != STEPS:
            failures.append(f"{row.get('percent', 'plain')}: {len(row.get('step_ms', []))} "
                            f"timed steps, not {STEPS}")
    for row in feasible:
        if len(row.get("traces", [])) != 1:
            failures.append(f"{row['percent']}%: not one traced step")
    # The order they ran in: each round, plain then the two schedules.
    ran = re.findall(r": (plain|optimal at \d+%)(?: of store-all)? \(round (\d) of \d\)", run.stderr)
    order = [(what, int(r)) for what, r in ran]
    expected = [(what, r) for r in range(1, ROUNDS + 1)
                for what in ("plain", "optimal at 100%", "optimal at 99%")]
    if order != expected:
        failures.append(f"ran in the order {order}, not {expected}")
    for failure in failures:
        print("bench.fidelity_rounds:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
