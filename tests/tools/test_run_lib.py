"""scripts/run-lib.sh's remat_ccache_misses: the run's output and record name the sources
whose compilation missed ccache, read from ccache's log (run by scripts/run.sh with pytest)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_names_the_sources_that_missed(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    # Two compilations at once, their lines interleaved as ccache writes them: one hit, one
    # miss; a third misses a source outside the clone; the miss of a source compiled twice is
    # named once; a source given relative to its build folder is named with that folder.
    log = tmp_path / "ccache.log"
    log.write_text(
        f"[2026-12-01T08:02:09.0 99] Working directory: {clone}/build-asan\n"
        "[2026-12-01T08:02:09.1 99] Source file: ../cli/main.cpp\n"
        "[2026-12-01T08:02:09.2 99] Result: cache_miss\n"
        f"[2026-12-01T08:02:10.1 100] Source file: {clone}/solver/src/chain.cpp\n"
        f"[2026-12-01T08:02:10.2 101] Source file: {clone}/tests/remat_cli_tests_paths.cpp\n"
        "[2026-12-01T08:02:10.3 100] Result: direct_cache_hit\n"
        "[2026-12-01T08:02:10.4 100] Result: local_storage_hit\n"
        "[2026-12-01T08:02:10.5 101] Result: cache_miss\n"
        "[2026-12-01T08:02:11.0 102] Source file: /usr/share/cmake/CMakeCXXCompilerABI.cpp\n"
        "[2026-12-01T08:02:11.1 102] Result: cache_miss\n"
        f"[2026-12-01T08:02:12.0 103] Source file: {clone}/tests/remat_cli_tests_paths.cpp\n"
        "[2026-12-01T08:02:12.1 103] Result: cache_miss\n")
    record = tmp_path / "record.log"
    record.write_text("run.sh test\n")
    script = (f"source {ROOT}/scripts/run-lib.sh\n"
              f"remat_record_file={record}\n"
              f"remat_ccache_misses {log}\n")
    printed = subprocess.run(["bash", "-c", script], cwd=clone, check=True, timeout=60,
                             capture_output=True, text=True).stdout
    missed = ["ccache missed 3 sources:",
              "  /usr/share/cmake/CMakeCXXCompilerABI.cpp",
              "  build-asan/../cli/main.cpp",
              "  tests/remat_cli_tests_paths.cpp"]
    assert record.read_text().splitlines() == ["run.sh test"] + missed
    assert printed.splitlines() == missed


def test_nothing_is_written_without_a_log_or_a_record(tmp_path: Path) -> None:
    record = tmp_path / "record.log"
    record.write_text("run.sh test\n")
    script = (f"source {ROOT}/scripts/run-lib.sh\n"
              f"remat_record_file={record}\n"
              f"remat_ccache_misses {tmp_path}/absent.log\n"
              "remat_record_file=\n"
              f"remat_ccache_misses {record}\n")
    printed = subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True, timeout=60,
                             capture_output=True, text=True).stdout
    assert record.read_text() == "run.sh test\n"
    # Without a log nothing is printed either; without a record the list is still printed.
    assert printed.splitlines()[0] == "ccache missed 0 sources:"
