"""tools/gpu_results.py: each target of the GPU check is judged as docs/gpu-check.md says, on
synthetic results where the right verdict is known (run by scripts/run.sh with pytest)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import gpu_results  # noqa: E402

MIB = 1 << 20


def fidelity_row(percent: float, budget: int, predicted: int, measured: int,
                 predicted_ms: float = 100.0, measured_ms: float = 100.0) -> dict:
    return {"model": "net", "percent": percent, "budget_bytes": budget,
            "predicted_peak_bytes": predicted, "measured_peak_bytes": measured,
            "predicted_ms": predicted_ms, "measured_ms": measured_ms}


def throughput_run(remat_100: float, plain: float, ratio_50: float | None) -> list[dict]:
    def result(method: str, setting: str, images: float, peak: int) -> dict:
        return {"method": method, "setting": setting, "oom": False, "images_per_s": images,
                "peak_bytes": peak}
    equal = [{"budget": "100%", "checkpoint_sequential": None, "remat-periodic": None},
             {"budget": "50%", "remat-periodic": None,
              "checkpoint_sequential": None if ratio_50 is None else
              {"setting": "K=4", "peak_bytes": 40 * MIB, "images_per_s": 100 / ratio_50, "ratio": ratio_50}}]
    return [{"model": "net b8", "stages": 10, "device": "CUDA cuda", "libtorch": "2.11.0", "steps": 10,
             "results": [result("plain-libtorch", "", plain, 100 * MIB),
                         result("remat-optimal", "100%", remat_100, 100 * MIB),
                         result("remat-optimal", "50%", 100.0, 50 * MIB)],
             "at_equal_memory": equal}]


def judge(tmp_path: Path, files: dict, strict: bool = True, name: str = "out") -> tuple[int, str]:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "gpu-check.log").write_text("== done\n")
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    markdown = tmp_path / f"{name}.md"
    code = gpu_results.main([str(folder), "--markdown", str(markdown)] + (["--strict"] if strict else []))
    return code, markdown.read_text()


@pytest.mark.parametrize("row, missed", [
    (fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB), None),
    (fidelity_row(50, 50 * MIB, 49 * MIB, 50 * MIB + 512), "above the budget"),
    (fidelity_row(50, 50 * MIB, 40 * MIB, 43 * MIB), "of the prediction"),  # 7.5% above it
    (fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB, 100.0, 111.0), "step time 1.110"),
    (fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB, 100.0, 89.0), "step time 0.890"),
    (fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB, 100.0, 109.0), None),
])
def test_fidelity_targets(tmp_path: Path, row: dict, missed: str | None) -> None:
    code, text = judge(tmp_path, {"fidelity.json": {"device": "CUDA", "libtorch": "2.11", "rows": [row]}})
    assert code == (0 if missed is None else 1)
    if missed:
        assert "Targets missed" in text and missed in text
    else:
        assert "Every target checked here was met." in text


def test_infeasible_budgets_are_listed_not_missed(tmp_path: Path) -> None:
    row = {"model": "net", "percent": 30, "budget_bytes": 30 * MIB, "infeasible": True,
           "min_budget_bytes": 35 * MIB}
    code, text = judge(tmp_path, {"fidelity.json": {"rows": [row]}})
    assert code == 0 and "infeasible (least 35.0 MiB)" in text


@pytest.mark.parametrize("remat_100, ratio_50, missed", [
    (99.0, 1.20, None),
    (97.0, 1.20, "at 100%: 0.970 of plain LibTorch"),
    (99.0, 1.10, "at 50%: 1.100 of the best checkpoint_sequential"),
    (99.0, None, None),  # no checkpoint_sequential fits in remat's memory: met outright
])
def test_throughput_targets(tmp_path: Path, remat_100: float, ratio_50: float | None,
                            missed: str | None) -> None:
    code, text = judge(tmp_path, {"throughput.json": throughput_run(remat_100, 100.0, ratio_50)})
    assert code == (0 if missed is None else 1), text
    if missed:
        assert missed in text
    # The reference point reports the same measurements and judges none of them.
    code, text = judge(tmp_path, {"reference.json": throughput_run(remat_100, 100.0, ratio_50)},
                       name="reference")
    assert code == 0 and "published reference point" in text


def test_throughput_reports_what_one_backward_call_gives(tmp_path: Path) -> None:
    run = throughput_run(99.0, 100.0, 1.2)
    run[0]["results"].append({"method": "remat-per-stage-backward", "setting": "100%", "oom": False,
                              "images_per_s": 90.0, "peak_bytes": 100 * MIB})
    (tmp_path / "with").mkdir()
    code, text = judge(tmp_path / "with", {"throughput.json": run})
    assert code == 0, text
    assert ("99.0 images/s with consecutive backwards in one engine call, 90.0 with one call per "
            "stage (1.100x)") in text
    # Without the row (results from before it existed), no sentence.
    (tmp_path / "without").mkdir()
    code, text = judge(tmp_path / "without", {"throughput.json": throughput_run(99.0, 100.0, 1.2)})
    assert "one call per stage" not in text


def test_transformers_within_hugging_face_peak(tmp_path: Path) -> None:
    def row(method: str, setting: str, peak: int, ms: float) -> dict:
        return {"model": "gpt2", "method": method, "setting": setting, "measured_peak": peak,
                "measured_ms": ms, "oom": False}
    data = {"batch": 8, "sequence": 1024, "device": "cuda", "libtorch": "2.11.0",
            "rows": [row("hf-checkpointing", "gradient_checkpointing_enable()", 100 * MIB, 120.0),
                     row("optimal/block", "= HF checkpointing's measured peak", 99 * MIB, 100.0),
                     row("optimal/half", "= HF checkpointing's measured peak", 101 * MIB, 100.0)]}
    code, text = judge(tmp_path, {"transformers.json": data})
    assert code == 1
    assert "| gpt2 | optimal/block | = HF checkpointing's measured peak | 99.0 MiB | 100 | 1.200 | yes |" in text
    assert "optimal/half: peak above Hugging Face's" in text


def offload_results(off_peak: int, off_ms: float, predicted_ms: float) -> dict:
    def row(fraction: float, method: str, **more) -> dict:
        return {"model": "resnet50", "fraction": fraction, "budget_bytes": int(fraction * 100 * MIB),
                "method": method, "feasible": True, **more}
    rows = [row(0.5, "recompute", step_ms=130.0, predicted_ms=128.0, peak_bytes=49 * MIB, offloads=0),
            row(0.5, "offload", step_ms=off_ms, predicted_ms=predicted_ms, peak_bytes=off_peak,
                offloads=3, host_bytes=12 * MIB),
            {**row(0.15, "recompute"), "feasible": False, "least_bytes": 20 * MIB},
            row(0.15, "offload", step_ms=150.0, predicted_ms=149.0, peak_bytes=14 * MIB, offloads=6,
                host_bytes=30 * MIB)]
    return {"header": "offload_bench on gpu (cuda, torch 2.11.0), medians of 10 steps taking turns\n",
            "results": [{"model": "resnet50", "description": "batch 8, 224x224",
                         "link": {"d2h_gbps": 50.0, "h2d_gbps": 52.0, "latency_ms": 0.01},
                         "store_all_peak_bytes": 100 * MIB, "rows": rows,
                         "reference": {"plain": {"step_ms": 100.0, "peak_bytes": 100 * MIB},
                                       "save_on_cpu": {"step_ms": 160.0, "peak_bytes": 30 * MIB}}}]}


@pytest.mark.parametrize("off_peak, off_ms, predicted_ms, missed", [
    (48 * MIB, 120.0, 118.0, None),
    (50 * MIB + 512, 120.0, 118.0, "offload: resnet50 at 50%: measured peak above the budget"),
    (48 * MIB, 120.0, 105.0, "offload: resnet50 at 50%: step 1.143 of the prediction"),
])
def test_offload_targets_and_overhead_removed(tmp_path: Path, off_peak: int, off_ms: float,
                                              predicted_ms: float, missed: str | None) -> None:
    code, text = judge(tmp_path, {"offload.json": offload_results(off_peak, off_ms, predicted_ms)})
    assert code == (0 if missed is None else 1), text
    if missed is not None:
        assert missed in text
    assert "References: plain 100.0 ms at 100.0 MiB, save_on_cpu 160.0 ms at 30.0 MiB." in text
    # 130 ms recomputing, 100 plain: 30 ms of overhead, of which 10 removed at 120 ms.
    if off_ms == 120.0:
        assert f"| 130.0 | 120.0 ({predicted_ms:.1f}) | 3 |" in text
        assert "| 1.083 | 33% | 12.0 MiB |" in text
    # Below recomputation's least, offloading is the only schedule: no ratio, still judged.
    assert "| 15% | infeasible | 150.0 (149.0) | 6 | 14.0 MiB of 15.0 MiB yes | 1.007 yes | below recomputation's least | - | 30.0 MiB |" in text


def test_offload_plot_copied(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "gpu-check.log").write_text("== done\n")
    (folder / "offload.json").write_text(json.dumps(offload_results(48 * MIB, 120.0, 118.0)))
    (folder / "offload.svg").write_text("<svg>o</svg>\n")
    images = tmp_path / "img"
    assert gpu_results.main([str(folder), "--img-dir", str(images), "--strict"]) == 0
    assert (images / "gpu-offload.svg").read_text() == "<svg>o</svg>\n"


def test_tarball_and_plots(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "gpu-check.log").write_text("== done\n")
    (folder / "throughput.json").write_text(json.dumps(throughput_run(99.0, 100.0, 1.2)))
    (folder / "throughput.html").write_text("<html><body><svg a='1'>x</svg>\n</body></html>")
    tarball = tmp_path / "results.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(folder, arcname="out")
    images = tmp_path / "img"
    assert gpu_results.main([str(tarball), "--img-dir", str(images), "--strict"]) == 0
    assert (images / "gpu-throughput-net-b8.svg").read_text() == "<svg a='1'>x</svg>\n"


def test_chains_copied_when_each_is_a_chain(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    (folder / "chains").mkdir(parents=True)
    (folder / "gpu-check.log").write_text("== done\n")
    chain = {"format": "remat-chain/2", "name": "net b8", "inputs": [{"bytes": 8}],
             "stages": [{"name": "s0", "fwd_ms": 1.0, "bwd_ms": 2.0}]}
    (folder / "chains" / "fidelity-net-b8-224-auto.json").write_text(json.dumps(chain))
    (folder / "chains" / "notes.txt").write_text("not a chain, not copied")
    out = tmp_path / "profiles"
    assert gpu_results.main([str(folder), "--chains-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["fidelity-net-b8-224-auto.json"]
    assert json.loads((out / "fidelity-net-b8-224-auto.json").read_text()) == chain
    # Something else under chains/, or no chain, or no chains/ at all: the results cannot be
    # read as asked, and nothing is copied.
    (folder / "chains" / "bad.json").write_text(json.dumps({"format": "other", "stages": [1]}))
    assert gpu_results.main([str(folder), "--chains-dir", str(tmp_path / "again")]) == 2
    assert not (tmp_path / "again").exists()
    (folder / "chains" / "bad.json").unlink()
    (folder / "chains" / "empty.json").write_text(json.dumps({"format": "remat-chain/2", "stages": []}))
    assert gpu_results.main([str(folder), "--chains-dir", str(tmp_path / "again")]) == 2
    for f in (folder / "chains").iterdir():
        f.unlink()
    assert gpu_results.main([str(folder), "--chains-dir", str(tmp_path / "again")]) == 2
    (folder / "chains").rmdir()
    assert gpu_results.main([str(folder), "--chains-dir", str(tmp_path / "again")]) == 2


def test_unreadable_results_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "results.tar.gz"
    bad.write_text("not a tarball")
    assert gpu_results.main([str(bad)]) == 2
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "fidelity.json").write_text('{"rows": [{"model": "net"}]}')  # fields missing
    assert gpu_results.main([str(folder)]) == 2


def test_fidelity_diagnostics(tmp_path: Path) -> None:
    row = fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB)
    row |= {"requested_peak_bytes": 48 * MIB, "allocated_total_bytes": 300 * MIB,
            "reserved_bytes": 320 * MIB}
    plain = {"model": "net", "predicted_ms": 80.0, "measured_ms": 72.0, "measured_peak_bytes": 90 * MIB}
    code, text = judge(tmp_path, {"fidelity.json": {"rows": [row], "plain": [plain]}})
    assert code == 0
    assert "| net | 80.0 | 72.0 | 0.900 | 90.0 MiB |" in text
    assert "| net | 50% | 49.0 MiB | 48.0 MiB | 300.0 MiB | 320.0 MiB | 20.0 MiB | - |" in text
    # With the allocator's calls per timed step: summed.
    row |= {"step_device_allocs": [0, 2, 0], "step_alloc_retries": [0, 1, 0]}
    code, text = judge(tmp_path, {"fidelity.json": {"rows": [row], "plain": [plain]}}, name="calls")
    assert "| net | 50% | 49.0 MiB | 48.0 MiB | 300.0 MiB | 320.0 MiB | 20.0 MiB | 2 / 1 |" in text


def test_traced_steps_say_where_a_miss_went(tmp_path: Path) -> None:
    def part(n: int, predicted: float, measured: float) -> dict:
        return {"operations": n, "predicted_ms": predicted, "measured_ms": measured}

    def trace(recompute_measured: float, between: float) -> dict:
        t = {"forward": part(10, 30.0, 30.5), "loss": part(1, 0.0, 0.0),
             "recompute": part(6, 20.0, recompute_measured), "backward": part(10, 50.0, 49.0),
             "between_ms": between, "caller_ms": 1.0, "predicted_ms": 100.0}
        t["measured_ms"] = sum(t[k]["measured_ms"] for k in ("forward", "loss", "recompute", "backward")) + between
        return t

    # Three traced steps, the median shown, with their range; an older result traced one.
    median = trace(32.0, 1.5)
    missed = fidelity_row(30, 50 * MIB, 49 * MIB, 49 * MIB, 100.0, 114.0) | {
        "trace": median, "traces": [trace(31.0, 1.5), median, trace(40.0, 1.5)]}
    met = fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB, 100.0, 101.0) | {"trace": trace(21.0, 0.5)}
    code, text = judge(tmp_path, {"fidelity.json": {"rows": [missed, met]}})
    assert code == 1  # the 14% miss
    assert ("| net | 30% | 30.0 / 30.5 | 20.0 / 32.0 (6) | - | 50.0 / 49.0 | 1.50 | 100.0 / 113.0 | "
            "112.0-121.0 (3) |") in text
    assert ("| net | 50% | 30.0 / 30.5 | 20.0 / 21.0 (6) | - | 50.0 / 49.0 | 0.50 | 100.0 / 101.0 | "
            "101.0-101.0 (1) |") in text
    assert "Restarts:" not in text  # older traces have no operations
    # The miss, split by where its 13 ms went, the largest first; the met row is not split.
    assert ("- net at 30%: the traced step took 113.0 ms against 100.0 predicted (+13.0 ms): "
            "recomputations +12.0 ms, between operations +1.5 ms, backwards -1.0 ms, "
            "forwards +0.5 ms.") in text
    assert "- net at 50%" not in text


def test_restarts_are_told_apart_from_the_other_recomputations(tmp_path: Path) -> None:
    # A traced step's operations: the first forward after each backward engine call is a
    # restart (here 0.3 ms slow each), the others recomputations (0.1 ms slow).
    def op(label: str, predicted: float, measured: float) -> dict:
        return {"operations": label, "start_ms": 0.0, "predicted_ms": predicted, "measured_ms": measured}

    ops = [op("Fn_0", 1, 1), op("Fn_1", 1, 1), op("Fe_2", 1, 1), op("L", 0, 0), op("B_2", 2, 2),
           op("Fn_0", 1, 1.3), op("Fe_1", 1, 1.1), op("B_1", 2, 2), op("Fe_0", 1, 1.3), op("B_0", 2, 2)]

    def part(n: int, predicted: float, measured: float) -> dict:
        return {"operations": n, "predicted_ms": predicted, "measured_ms": measured}

    trace = {"forward": part(3, 3.0, 3.0), "loss": part(1, 0.0, 0.0), "recompute": part(3, 3.0, 3.7),
             "backward": part(3, 6.0, 6.0), "between_ms": 0.0, "caller_ms": 0.0, "predicted_ms": 12.0,
             "measured_ms": 12.7, "operations": ops}
    # 12.7 against 12.0 is within 10%; a second schedule misses by 0.7 ms of 6.
    missed = dict(trace, predicted_ms=6.0)
    rows = [fidelity_row(50, 50 * MIB, 49 * MIB, 49 * MIB, 12.0, 12.7) | {"trace": trace},
            fidelity_row(30, 50 * MIB, 49 * MIB, 49 * MIB, 6.0, 12.7) | {"trace": missed}]
    code, text = judge(tmp_path, {"fidelity.json": {"rows": rows}})
    assert code == 1
    assert "| net | 50% | 3.0 / 3.0 | 3.0 / 3.7 (3) | 2.0 / 2.6 (2) | 6.0 / 6.0 | 0.00 | 12.0 / 12.7 |" in text
    assert ("Restarts: 4 in the traced steps, each +0.300 ms beyond its profile on average; the 2 other "
            "recomputations +0.100 ms each.") in text
    # The miss's split: the restarts apart.
    assert ("- net at 30%: the traced step took 12.7 ms against 6.0 predicted (+6.7 ms): "
            "restarts (2) +0.6 ms, other recomputations +0.1 ms, forwards +0.0 ms, backwards +0.0 ms, "
            "between operations +0.0 ms.") in text
    # A schedule without recomputations: no restart.
    plain = dict(trace, recompute=part(0, 0.0, 0.0),
                 operations=[op("Fe_0", 1, 1), op("L", 0, 0), op("B_0", 2, 2)])
    code, text = judge(tmp_path, {"fidelity.json": {"rows": [
        fidelity_row(100, 50 * MIB, 49 * MIB, 49 * MIB, 12.0, 12.7) | {"trace": plain}]}}, name="none")
    assert "| 0.0 / 0.0 (0) | none | 6.0 / 6.0 |" in text and "Restarts:" not in text
