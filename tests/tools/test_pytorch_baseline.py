"""bench/pytorch_baseline.py, PyTorch's side of the throughput benchmark: the configurations
take turns in rounds as its docstring says, and a run in rounds gives every configuration its
steps (run by scripts/run.sh with pytest)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pytorch_baseline  # noqa: E402


@pytest.mark.parametrize("configs,steps,warmup,rounds", [
    (1, 10, 3, 1), (3, 10, 3, 1), (3, 10, 3, 3), (4, 7, 2, 4), (2, 3, 0, 5), (5, 1, 1, 2)])
def test_each_configuration_gets_its_steps_taking_turns(configs, steps, warmup, rounds):
    plan = pytorch_baseline.round_plan(configs, steps, warmup, rounds)
    used = min(rounds, steps)
    assert len(plan) == configs * used
    # Round by round, every configuration in order.
    assert [c for c, _, _ in plan] == list(range(configs)) * used
    timed, untimed = Counter(), Counter()
    for c, u, t in plan:
        timed[c] += t
        untimed[c] += u
        assert t >= 1
    assert all(timed[c] == steps for c in range(configs))
    # warmup at a configuration's first turn, one (if any) at each later turn.
    assert all(untimed[c] == warmup + (used - 1) * min(1, warmup) for c in range(configs))
    first_turn = plan[:configs]
    assert all(u == warmup for _, u, _ in first_turn)
    # The timed steps split evenly: the rounds differ by one step at most, the first larger.
    shares = [t for c, _, t in plan if c == 0]
    assert max(shares) - min(shares) <= 1 and shares == sorted(shares, reverse=True)


def test_a_run_in_rounds_gives_each_configuration_its_steps(tmp_path, capsys):
    out = tmp_path / "baseline.json"
    assert pytorch_baseline.main(["--model", "resnet18", "--batch", "2", "--image", "32", "--device", "cpu",
                                  "--steps", "3", "--warmup", "1", "--rounds", "2", "--segments", "2",
                                  "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["rounds"] == 2 and report["steps"] == 3
    assert [(r["method"], r["segments"]) for r in report["results"]] == [("plain-pytorch", None),
                                                                       ("checkpoint_sequential", 2)]
    for r in report["results"]:
        assert len(r["step_ms"]) == 3 and r["peak_bytes"] > 0
    assert "in 2 rounds" in capsys.readouterr().out
