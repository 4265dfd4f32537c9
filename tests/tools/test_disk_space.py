"""scripts/disk-space.sh, which scripts/run.sh sources to refuse a run the disk has no room for:
the need is summed per filesystem, compared with what `df` says is free there, and a shortage
fails with the filesystem and both figures named. `df` is a stand-in that reports the mounts
each test sets (run by scripts/run.sh with pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GB_KB = 1 << 20  # 1 GB in df's 1024-byte blocks

FAKE_DF = """#!{python}
# A stand-in for df -P [-k] PATH: the mount that holds PATH is the longest of FAKE_MOUNTS
# (mount point -> free 1024-byte blocks) that PATH is under.
import json, os, sys
mounts = json.loads(os.environ["FAKE_MOUNTS"])
path = os.path.abspath(sys.argv[-1])
mount = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)
print("Filesystem 1024-blocks Used Available Capacity Mounted on")
print(f"/dev/fake 1000000000 0 {{mounts[mount]}} 0% {{mount}}")
"""


def check(tmp_path: Path, mounts: dict[str, int], takes: list[tuple[int, Path, str]]):
    """Sources scripts/disk-space.sh with the stand-in df on the PATH, names each of `takes`
    (GB, path, what) to remat_will_take, then runs remat_check_disk."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    df = bin_dir / "df"
    df.write_text(FAKE_DF.format(python=sys.executable))
    df.chmod(0o755)
    script = "set -euo pipefail; source scripts/disk-space.sh\n"
    for gb, path, what in takes:
        script += f"remat_will_take {gb} '{path}' '{what}'\n"
    script += "remat_check_disk\n"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_MOUNTS=json.dumps(mounts))
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)


def test_room_enough_passes_and_says_what_is_needed(tmp_path):
    result = check(tmp_path, {"/": 20 * GB_KB},
                   [(6, tmp_path / "cache/remat/venv", "the environment"), (3, tmp_path / "build", "build/")])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "disk: 20 GB free on /, about 11 GB needed " \
                            "(the environment 6 GB, build/ 3 GB, 2 to spare)\n"
    assert result.stderr == ""


def test_too_little_room_fails_naming_the_filesystem_and_both_figures(tmp_path):
    result = check(tmp_path, {"/": 10 * GB_KB}, [(6, tmp_path / "venv", "env"), (3, tmp_path / "build", "build/")])
    assert result.returncode == 1
    assert "remat: not enough disk space on /: 10 GB free, about 11 GB needed." in result.stderr


def test_exactly_the_need_is_enough_and_a_kilobyte_less_is_not(tmp_path):
    takes = [(9, tmp_path / "build", "build/")]
    assert check(tmp_path, {"/": 11 * GB_KB}, takes).returncode == 0
    short = check(tmp_path, {"/": 11 * GB_KB - 1}, takes)
    assert short.returncode == 1
    assert "10 GB free, about 11 GB needed" in short.stderr


def test_each_filesystem_is_checked_for_what_goes_on_it(tmp_path):
    # The environments go to a cache on a small disk of its own, the builds to a large one: the
    # cache's need is not added to the build's, and only the cache is short.
    cache = tmp_path / "cache"
    cache.mkdir()
    result = check(tmp_path, {"/": 100 * GB_KB, str(cache): 12 * GB_KB},
                   [(6, cache / "remat/venv-a", "environment a"), (5, cache / "remat/venv-b", "environment b"),
                    (3, tmp_path / "build", "build/")])
    assert result.returncode == 1
    lines = sorted(result.stdout.splitlines())
    assert lines == sorted([f"disk: 12 GB free on {cache}, about 13 GB needed "
                            "(environment a 6 GB, environment b 5 GB, 2 to spare)",
                            "disk: 100 GB free on /, about 5 GB needed (build/ 3 GB, 2 to spare)"])
    assert f"not enough disk space on {cache}: 12 GB free" in result.stderr
    assert "on /:" not in result.stderr


def test_nothing_to_make_checks_nothing(tmp_path):
    result = check(tmp_path, {"/": 0}, [])
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
