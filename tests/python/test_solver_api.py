"""remat.profile, solve, tradeoff and Chain: the CLI's JSON, results as values, the pictures."""

import json
import time

import pytest
import torch
from torch import nn

import remat


@pytest.fixture(scope="module")
def chain():
    torch.manual_seed(0)
    net = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(128, 128), nn.ReLU())])
    return remat.profile(net, torch.randn(32, 128, requires_grad=True), repeat=2, progress=False)


def test_profile_gives_a_chain_in_the_cli_format(chain, tmp_path):
    assert len(chain) == 10
    assert chain.stage_names == [str(i) for i in range(10)]
    assert chain.input_bytes == 32 * 128 * 4
    assert all(b == 32 * 128 * 4 for b in chain.output_bytes)
    doc = json.loads(chain.to_json())
    assert doc["format"] == "remat-chain/2" and len(doc["stages"]) == 10
    path = tmp_path / "chain.json"
    chain.save(path)
    again = remat.Chain.load(path)
    assert again.to_json() == chain.to_json()
    assert remat.Chain.from_json(chain.to_json()).store_all_peak() == chain.store_all_peak()


def test_counts_read_in_the_singular_where_there_is_one():
    # A chain of one stage, and the Checkpointable of one: "1 stage", as the CLI says.
    one = nn.Sequential(nn.Linear(8, 8))
    x = torch.randn(4, 8)
    chain = remat.profile(one, x, repeat=1, progress=False)
    assert "1 stage," in repr(chain) and "1 stages" not in repr(chain)
    chk = remat.Checkpointable(one, x, progress=False, repeat=1)
    assert "1 stage, no sequence yet" in repr(chk)
    chk.compute_sequence("100%")
    assert "1 stage, budget " in repr(chk) and "1 stages" not in repr(chk)


def test_profile_times_within_whole_passes_on_request():
    # The C++ profiler's Timing::kPasses through Python stages: every stage timed, the sizes
    # those of each stage timed alone (tests/profiler has the rest).
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    x = torch.randn(16, 64)
    passes = remat.profile(net, x, repeat=1, progress=False, timing="passes")
    alone = remat.profile(net, x, repeat=1, progress=False, timing="stages")
    doc, ref = json.loads(passes.to_json()), json.loads(alone.to_json())
    for stage, other in zip(doc["stages"], ref["stages"]):
        assert stage["fwd_ms"] > 0 and stage["bwd_ms"] > 0
        assert {k: v for k, v in stage.items() if not k.endswith("_ms")} == \
            {k: v for k, v in other.items() if not k.endswith("_ms")}


def test_bad_chain_files_name_the_field(chain, tmp_path):
    doc = json.loads(chain.to_json())
    doc["stages"][0]["fwd_ms"] = -1
    with pytest.raises(ValueError, match=r"stages\[0\]\.fwd_ms"):
        remat.Chain.from_json(json.dumps(doc), "mine.json")
    with pytest.raises(ValueError, match="nothing.json"):
        remat.Chain.load(tmp_path / "nothing.json")
    # Bytes that are not UTF-8: a ValueError naming the file, not a UnicodeDecodeError of the
    # message that quotes them.
    latin = tmp_path / "latin.json"
    latin.write_bytes(chain.to_json().replace('"name"', '"name\xff"', 1).encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.json: is not valid JSON.*ill-formed UTF-8"):
        remat.Chain.load(latin)


def test_solve_is_a_result_with_a_status(chain):
    full = chain.store_all_peak()
    best = remat.solve(chain, "100%")
    assert best.ok and best.status == "optimal" and best.peak_bytes == full
    assert best.solved_budget_bytes == best.budget_bytes  # no carried members
    least = chain.min_budget()
    s = remat.solve(chain, least)
    assert s.ok and s.peak_bytes <= least and s.makespan_ms > best.makespan_ms
    none = remat.solve(chain, least - 1)
    assert not none.ok and none.status == "infeasible" and none.min_feasible_budget_bytes == least
    assert "needs at least" in repr(none)
    for algorithm in ("store-all", "recompute-all", "periodic", "revolve"):
        h = remat.solve(chain, full, algorithm)
        assert h.ok and h.makespan_ms >= best.makespan_ms - 1e-9
        assert h.status == "feasible", algorithm  # as the CLI says: only the DP's is optimal
        assert f"remat.Solution(feasible, {algorithm}," in repr(h)
        assert "-0.0%" not in repr(h)
    # Too few slots for any budget: no least budget (None, as the CLI's JSON null), said so.
    starved = remat.solve(chain, full, slots=1)
    assert not starved.ok and starved.status == "infeasible"
    assert starved.min_feasible_budget_bytes is None
    assert "no budget is enough for optimal" in repr(starved) and "-1" not in repr(starved)
    # min and 50%+ as the solve's options put them: none where no budget is enough.
    at_min = remat.solve(chain, "min")
    assert at_min.ok and at_min.budget_bytes == chain.min_budget() == least
    assert remat.solve(chain, "min", "periodic").budget_bytes == chain.min_budget("periodic")
    assert remat.solve(chain, "1%+").budget_bytes == least
    assert remat.solve(chain, "100%+").budget_bytes == full
    starved_min = remat.solve(chain, "min", slots=1)
    assert not starved_min.ok and starved_min.min_feasible_budget_bytes is None
    assert remat.solve(chain, "50%+", slots=1).budget_bytes == full // 2
    with pytest.raises(ValueError, match="algorithm"):
        remat.solve(chain, full, "fastest")
    with pytest.raises(ValueError, match="negative"):
        remat.solve(chain, -5)


def test_pictures(chain, tmp_path):
    s = remat.solve(chain, "85%")
    for svg in (chain.svg(), s.svg(), remat.tradeoff(chain, points=5).svg(), chain._repr_svg_(), s._repr_svg_()):
        assert svg.lstrip().startswith("<") and "<svg" in svg and svg.rstrip().endswith("</svg>")
    path = tmp_path / "schedule.svg"
    s.save_svg(path)
    assert path.read_text() == s.svg()
    # The CLI's writer: no temporary left, a directory or a symbolic link refused as OSError.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["schedule.svg"]
    with pytest.raises(OSError, match="it is a directory"):
        s.save_svg(tmp_path)
    (tmp_path / "link.svg").symlink_to(path)
    with pytest.raises(OSError, match="it is a symbolic link"):
        chain.save_svg(tmp_path / "link.svg")
    assert path.read_text() == s.svg()
    t = remat.tradeoff(chain, points=5)
    assert len(t.budgets) == 5 and t.budgets[-1] == chain.store_all_peak()
    assert all(p.feasible for p in t.optimal)
    infeasible = remat.solve(chain, 1)
    assert infeasible._repr_svg_() is None
    with pytest.raises(ValueError, match=r"no schedule to draw: optimal needs at least .* bytes\), budget 1 B"):
        infeasible.svg()


def test_bad_arguments_are_named_before_they_reach_cpp(chain, tmp_path):
    """Each is refused in Python's terms, naming the argument, never as pybind11's
    'incompatible function arguments' nor silently ignored."""
    full = chain.store_all_peak()
    with pytest.raises(ValueError, match=r"budget \(9223372036854775808 bytes\) must be at most 2\^63-1"):
        remat.solve(chain, 2**63)
    np = pytest.importorskip("numpy")
    assert remat.solve(chain, np.int64(full)).peak_bytes == full  # NumPy integers are bytes too
    # Options an algorithm would ignore are refused, as the CLI refuses them.
    with pytest.raises(ValueError, match=r"slots \(8\) apply to algorithm 'optimal' only, not 'revolve'"):
        remat.solve(chain, full, "revolve", slots=8)
    with pytest.raises(ValueError, match=r"segments \(2\) apply to algorithm 'periodic' only, not 'optimal'"):
        remat.solve(chain, full, segments=2)
    assert remat.solve(chain, full, "periodic", segments=2).ok
    for kwargs, message in (({"slots": -1}, r"slots \(-1\) must be at least 0"),
                            ({"threads": 5000}, r"threads \(5000\) must be at most 1024"),
                            ({"segments": 2**40}, r"segments \(1099511627776\) must be at most")):
        with pytest.raises(ValueError, match=message):
            remat.solve(chain, full, "periodic" if "segments" in kwargs else "optimal", **kwargs)
    with pytest.raises(TypeError, match="slots must be a whole number, not float"):
        remat.solve(chain, full, slots=1.5)
    with pytest.raises(ValueError, match=r"points \(1\) must be at least 2"):
        remat.tradeoff(chain, points=1)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"repeat \(0\) must be at least 1"):
        remat.profile(net, x, repeat=0, progress=False)
    with pytest.raises(ValueError, match=r"warmup \(-1\) must be at least 0"):
        remat.profile(net, x, warmup=-1, progress=False)
    with pytest.raises(ValueError, match=r"timing must be one of 'auto', 'stages', 'passes', not 'fast'"):
        remat.profile(net, x, timing="fast", progress=False)
    with pytest.raises(ValueError, match=r"repeat \(0\) must be at least 1"):
        remat.Checkpointable(net, repeat=0)
    # Every count bounded, refused before any work (issue 66): not a run until killed, nor a
    # table that grows until memory runs out, nor 4 minutes of profiling before the refusal.
    with pytest.raises(ValueError, match=r"repeat \(2000000000\) must be at most 1000"):
        remat.profile(net, x, repeat=2_000_000_000, progress=False)
    with pytest.raises(ValueError, match=r"measure_steps \(1000000000.0\) must be at most 1000"):
        remat.Checkpointable(net, measure_steps=1e9)
    # The limits docs/reliability.md gives, as the package reads them from the core.
    assert (remat._C.MAX_STAGES, remat._C.MAX_THREADS, remat._C.MAX_PROFILE_REPEAT,
            remat._C.MAX_TRADEOFF_POINTS) == (10000, 1024, 1000, 10000)
    with pytest.raises(ValueError, match=r"points \(1000000000\) must be at most 10000"):
        remat.tradeoff(chain, points=10**9)
    # What a chain's member cannot be, named: not "Cannot access storage of SparseTensorImpl",
    # nor "Internal error ... Please file an issue".
    with pytest.raises(ValueError, match=r"the sample input is a tensor of layout Sparse .*dense"):
        remat.profile(net, x.to_sparse(), progress=False)
    nested = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)])
    with pytest.raises(ValueError, match=r"the sample input is a nested tensor: .*dense"):
        remat.profile(net, nested, progress=False)

    class Sparse(nn.Module):
        def forward(self, x):
            return x.to_sparse()

    with pytest.raises(ValueError, match=r"stage 1 \(1\) returned a tensor of layout Sparse"):
        remat.profile(nn.Sequential(nn.Linear(4, 4), Sparse(), nn.Identity()), x, progress=False)

    class Nested(nn.Module):
        def forward(self, x):
            return torch.nested.as_nested_tensor([x[:1], x])

    with pytest.raises(ValueError, match=r"stage 1 \(1\) returned a nested tensor: a stage "
                                         r"returns dense \(strided\) tensors only"):
        remat.profile(nn.Sequential(nn.Linear(4, 4), Nested(), nn.Identity()), x, progress=False)
    long = nn.Sequential(*[nn.Identity() for _ in range(10001)])
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"10001 stages, more than remat handles \(10000\)"):
        remat.profile(long, x, progress=False)
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="lots"):
        remat.Checkpointable(net, budget="lots")  # at once, not at the first step
    with pytest.raises(TypeError, match=r"sample must be a tensor .* not numpy.ndarray \(torch.from_numpy"):
        remat.profile(net, np.zeros((2, 4), dtype=np.float32), progress=False)
    with pytest.raises(TypeError, match=r"sample\[1\] must be a tensor, not builtins.int"):
        remat.profile(net, (x, 3), progress=False)
    with pytest.raises(TypeError, match=r"context must be a tensor"):
        remat.profile(net, x, context="mask", progress=False)
    # Both writers fail alike: OSError, naming the path.
    for save in (chain.save, chain.save_svg):
        with pytest.raises(OSError, match="it is a directory"):
            save(tmp_path)


def test_tradeoff_says_what_it_holds(chain):
    t = remat.tradeoff(chain, points=3)
    text = repr(t)
    assert text.startswith(f"remat.Tradeoff({chain.name!r}, 3 budgets from ")
    assert "against store-all: optimal +" in text and "revolve " in text and "periodic " in text
    assert t.warning == "" and t.unit_bytes >= 1
