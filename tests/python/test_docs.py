"""The Python examples of the README and docs/python.md run as written."""

import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python_blocks(path: pathlib.Path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("doc", ["README.md", "docs/python.md"])
def test_examples_run(doc, tmp_path, monkeypatch, capsys):
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no Python example"
    monkeypatch.chdir(tmp_path)
    for k, block in enumerate(blocks):
        script = tmp_path / f"example{k}.py"
        script.write_text(block)
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    if doc == "README.md":
        assert "step 2: loss" in out and "remat.Solution(optimal" in out
