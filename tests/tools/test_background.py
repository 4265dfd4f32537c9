"""scripts/run-lib.sh's remat_below: scripts/run.sh's background checks run in a session of
their own at the lowest priority, its scheduling group at nice 19, and the test run's group
keeps its priority (run by scripts/run.sh with pytest). Until 2026-12-01 the test run meant to
nice the checks' group and reniced its own instead (through /proc/$!/autogroup, before the
child's setsid): the test run at nice 19 beside its checks at 0."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"),
                                reason="no scheduling groups by session (autogroup) here")


def autogroup_nice(text: str) -> int:
    """The nice of '/autogroup-N nice K'."""
    return int(text.split()[-1])


def test_the_background_session_is_below_the_caller(tmp_path: Path) -> None:
    # The caller first gets a session and a group of its own, at nice 0, whatever the group
    # pytest runs in.
    script = (
        "set -euo pipefail; source scripts/run-lib.sh\n"
        "echo 0 > /proc/self/autogroup 2>/dev/null || true\n"
        f"remat_below {tmp_path}/log sleep 60\n"
        "child=$!\n"
        "for _ in $(seq 100); do\n"
        "  [ \"$(ps -o comm= -p \"$child\")\" = sleep ] && break\n"
        "  sleep 0.1\n"
        "done\n"
        "sleep 0.2\n"
        "echo \"caller: $(cat /proc/$$/autogroup)\"\n"
        "echo \"child: $(cat /proc/$child/autogroup)\"\n"
        "echo \"child's nice: $(ps -o ni= -p \"$child\" | tr -d ' ')\"\n"
        "echo \"child's session: $(ps -o sid= -p \"$child\" | tr -d ' ') $child\"\n"
        "kill \"$child\"\n")
    # setsid --wait: pytest's process leads no group, but where it did, setsid would fork.
    out = subprocess.run(["setsid", "--wait", "bash", "-c", script], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    caller, child = lines["caller"], lines["child"]
    assert caller.split()[0] != child.split()[0], out  # two groups
    assert autogroup_nice(caller) == 0, out
    assert autogroup_nice(child) == 19, out
    assert lines["child's nice"] == "19", out
    sid, pid = lines["child's session"].split()
    assert sid == pid, out  # a session of its own, led by the process run.sh knows
