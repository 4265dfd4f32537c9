"""The Python examples of the README and docs/python.md run as written."""

import importlib.util
import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python_blocks(path: pathlib.Path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def missing_requirement(block: str):
    """What a block's first line `# requires: a, b` names that this environment lacks
    (torchvision, transformers, torch.export), or None."""
    first = block.splitlines()[0] if block else ""
    if not first.startswith("# requires:"):
        return None
    for name in (n.strip() for n in first[len("# requires:"):].split(",")):
        if name == "torch.export":
            from remat._graph import export_available
            if not export_available():
                return "torch 2.5 or later (torch.export)"
        elif importlib.util.find_spec(name) is None:
            return name
    return None


@pytest.mark.parametrize("doc", ["README.md", "docs/python.md"])
def test_examples_run(doc, tmp_path, monkeypatch, capsys):
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no Python example"
    monkeypatch.chdir(tmp_path)
    skipped = [missing_requirement(b) for b in blocks]
    if all(skipped):
        pytest.skip(f"every example of {doc} needs what is missing here: {skipped[0]}")
    blocks = [b for b, missing in zip(blocks, skipped) if not missing]
    for k, block in enumerate(blocks):
        script = tmp_path / f"example{k}.py"
        script.write_text(block)
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    if doc == "README.md":
        assert "step 2: loss" in out and "remat.Solution(optimal" in out
