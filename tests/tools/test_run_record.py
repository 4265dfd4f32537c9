"""scripts/run-lib.sh's run record: scripts/run.sh keeps each run's steps, after a header saying
which commit ran where, with which locale and PATH, in a file of its own under the cache folder, the
last 30 runs; the scripts it starts (which source run-lib.sh too) add nothing to it (run by
scripts/run.sh with pytest)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "REMAT_CLEAN_TREE": "1",
                   "LANG": "C.UTF-8", **env}
    # run.sh exports these when it runs these tests: its start, its ccache folder.
    for name in ("LC_ALL", "LC_CTYPE", "LC_MESSAGES", "REMAT_STARTED", "CCACHE_DIR"):
        environment.pop(name, None)
    return subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/run-lib.sh\n" + script],
                          cwd=ROOT, env=environment, capture_output=True, text=True, check=True)


def untimed(text: str) -> str:
    """The step lines without their times (a second may pass between two of them)."""
    return re.sub(r"^== \[\d+m\d+s\] ", "== ", text, flags=re.M)


def test_a_run_keeps_its_steps_after_a_header(tmp_path: Path) -> None:
    out = run(tmp_path, 'remat_record test\nstep "building"\n'
                        'bash -c "source scripts/run-lib.sh; step inner"\nstep "all tests passed"\n')
    assert "== building\n== inner\n== all tests passed\n" == untimed(out.stdout)
    records = list((tmp_path / "remat" / "runs").iterdir())
    assert len(records) == 1
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    commit = git("rev-parse", "HEAD")
    assert records[0].name.endswith(f"-{git('rev-parse', '--short', 'HEAD')}-test.log")
    lines = records[0].read_text().splitlines()
    assert lines[0] == f"run.sh test at {commit} (tree clean: 1)"
    assert lines[1].startswith(f"in {ROOT.resolve()} as ")
    assert lines[2] == ("locale: LANG=C.UTF-8 LC_ALL=(unset) LC_CTYPE=(unset) "
                        "LC_MESSAGES=(unset)")
    assert lines[3] == f"PATH: {os.environ['PATH']}"
    assert lines[4] == f"ccache folder: {tmp_path}/remat/ccache"
    # The steps, and not the inner script's.
    assert untimed("\n".join(lines[5:])) == "== building\n== all tests passed"
    assert lines[5].startswith("== [0m")  # timed from the run's start


def test_only_the_last_30_runs_are_kept(tmp_path: Path) -> None:
    runs = tmp_path / "remat" / "runs"
    runs.mkdir(parents=True)
    for k in range(35):
        old = runs / f"2026010{k // 10}-0000{k % 10}0-abcdef0-test.log"
        old.write_text("old\n")
        os.utime(old, (1_000_000 + k, 1_000_000 + k))
    run(tmp_path, "remat_record demo\n")
    kept = sorted(p.name for p in runs.iterdir())
    assert len(kept) == 30
    assert any(name.endswith("-demo.log") for name in kept)
    # The oldest went first.
    assert "20260100-000000-abcdef0-test.log" not in kept


def test_an_unwritable_cache_leaves_the_run_going(tmp_path: Path) -> None:
    (tmp_path / "remat").write_text("a file where the folder would be\n")
    out = run(tmp_path, 'remat_record test\nstep "still running"\n')
    assert untimed(out.stdout) == "== still running\n"
