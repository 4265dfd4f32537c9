"""tools/mutate.py's catalogue against the tree, at every test run: a refactor that moves or
edits a mutated line is named here at once, with where its text most probably went, rather
than when the mutation check next runs (CI skips it for files that passed it before)."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "mutate.py")

spec = importlib.util.spec_from_file_location("mutate", SCRIPT)
mutate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutate)


def test_every_mutation_text_is_found_once_in_its_file():
    stale, moved = mutate.stale_mutations(ROOT, mutate.MUTATIONS + mutate.TORCH_MUTATIONS)
    assert stale == [] and moved == []
    ids = [m[0] for m in mutate.MUTATIONS + mutate.TORCH_MUTATIONS]
    assert len(ids) == len(set(ids))
    assert set(mutate.KILLED_BY) <= {m[0] for m in mutate.MUTATIONS}
    assert set(mutate.EXPLAINED) <= set(ids)


def tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_mutation_survives_rewrapping_and_a_move_to_another_file(tmp_path):
    old = "if (budget < peak) return false;"
    # Re-wrapped where it was: found, its span covering the new whitespace.
    base = tree(tmp_path, {"solver/src/a.cpp": "int f() {\n  if (budget <\n      peak) return false;\n}\n"})
    rel, start, end = mutate.locate(base, "solver/src/a.cpp", old)
    text = open(os.path.join(base, rel)).read()
    assert rel == "solver/src/a.cpp" and text[start:end] == "if (budget <\n      peak) return false;"
    assert mutate.mutate(text, start, end, old, "if (true) return false;").count("if (true)") == 1
    # Moved to another file of the component: found there, and said so.
    os.remove(os.path.join(base, "solver/src/a.cpp"))
    tree(tmp_path, {"solver/src/a.cpp": "int f();\n", "solver/src/b.cpp": "  " + old + "\n"})
    assert mutate.locate(base, "solver/src/a.cpp", old)[0] == "solver/src/b.cpp"
    stale, moved = mutate.stale_mutations(base, [("m", "solver/src/a.cpp", old, "x", "why")])
    assert stale == [] and moved == ["mutation m: its text is in solver/src/b.cpp now, not "
                                     "solver/src/a.cpp (update its path)"]


def test_an_edited_or_doubled_text_is_named_with_where_it_most_probably_went(tmp_path):
    old = "if (budget < peak) return false;"
    base = tree(tmp_path, {"solver/src/a.cpp": "int f() {\n  int x = 0;\n  if (budget <= peak_bytes) return false;\n}\n"})
    stale, _ = mutate.stale_mutations(base, [("m", "solver/src/a.cpp", old, "x", "why")])
    assert stale == ["mutation m: its text is not found once in solver/src/a.cpp (update it); "
                     "nearest, line 3: if (budget <= peak_bytes) return false;"]
    # Twice in its file: which one is meant is not guessed.
    tree(tmp_path, {"solver/src/a.cpp": old + "\n" + old + "\n"})
    assert mutate.locate(base, "solver/src/a.cpp", old) is None
    # Nothing alike: no guess.
    tree(tmp_path, {"solver/src/a.cpp": "namespace remat {}\n"})
    stale, _ = mutate.stale_mutations(base, [("m", "solver/src/a.cpp", old, "x", "why")])
    assert stale == ["mutation m: its text is not found once in solver/src/a.cpp (update it)"]


def test_check_passes_here_and_exits_1_naming_every_stale_mutation(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{len(mutate.MUTATIONS) + len(mutate.TORCH_MUTATIONS)} " \
                                    "mutations, each text found once"
    # The script in a tree without the sources: every mutation named, not only the first.
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "mutate.py").write_text(open(SCRIPT).read())
    result = subprocess.run([sys.executable, str(tmp_path / "tools" / "mutate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    lines = result.stderr.strip().split("\n")
    assert len(lines) == len(mutate.MUTATIONS) + len(mutate.TORCH_MUTATIONS)
    assert lines[0] == f"remat: mutation {mutate.MUTATIONS[0][0]}: its text is not found once " \
                       f"in {mutate.MUTATIONS[0][1]} (update it)"
