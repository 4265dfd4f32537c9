"""scripts/check-commits.sh: CONTRIBUTING.md's commit-message convention, on messages and on a
repository's history."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check-commits.sh")


def check_message(tmp_path, text):
    path = tmp_path / "message"
    path.write_text(text)
    return subprocess.run(["bash", SCRIPT, "--message", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("text", [
    "Build through ccache\n",
    "Build through ccache\n\nWhy, with the figures.\n",
    "s" * 72 + "\n\nbody\n",
    "Subject\n\nbody\n# a comment git strips, longer than the limit " + "x" * 80 + "\n",
])
def test_a_message_that_follows_it_passes(tmp_path, text):
    result = check_message(tmp_path, text)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("text, complaint", [
    ("s" * 73 + "\n", "73 characters, more than 72"),
    ("Subject\nbody on the second line\n", "second line is not blank"),
    ("\n\n", "subject is empty"),
])
def test_a_message_that_does_not_is_named(tmp_path, text, complaint):
    result = check_message(tmp_path, text)
    assert result.returncode == 1
    assert complaint in result.stderr


def test_a_wrong_call_exits_2(tmp_path):
    result = subprocess.run(["bash", SCRIPT, "--message", str(tmp_path / "missing")],
                            capture_output=True, text=True)
    assert result.returncode == 2
