"""Offloading from Python (docs/python.md, "Offload"): a link on the chain, schedules that copy
checkpoints to host memory and back, training with them bit-identical to plain training on the
CPU, the device peak within the budget, the host memory given back, and bad links refused."""

import copy
import json

import pytest
import torch
from torch import nn

import remat
from remat._graph import export_available
from conftest import assert_same_training, step_peak, weighted_loss

# Copies that cost next to nothing against a forward: where memory allows, the optimum offloads.
FAST = remat.Link(1000.0, 1000.0, 0.0001)


def deep_mlp() -> nn.Sequential:
    layers = []
    for k in range(10):
        layers += [nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU()]
        if k == 4:
            layers.append(nn.Dropout(0.25))
    return nn.Sequential(*layers, nn.Linear(64, 10))


def train_step(model, x, seed):
    torch.manual_seed(seed)
    out = model(x)
    weighted_loss(out).backward()
    return out.detach()


def test_link_on_a_chain():
    torch.manual_seed(0)
    chain = remat.profile(deep_mlp(), torch.randn(16, 64), progress=False)
    assert chain.link is None
    linked = chain.with_link(remat.Link(25.0, 26.5, 0.01))
    assert linked.link == remat.Link(25.0, 26.5, 0.01)
    assert chain.link is None  # a copy
    text = linked.to_json()
    assert json.loads(text)["format"] == "remat-chain/3"
    assert remat.Chain.from_json(text).link == linked.link
    assert linked.with_link(None).link is None
    with pytest.raises(ValueError, match="link.d2h_gbps"):
        chain.with_link((0.0, 1.0, 0.0))
    with pytest.raises(ValueError, match="link.latency_ms"):
        chain.with_link((1.0, 1.0, -1.0))
    with pytest.raises(TypeError, match="remat.Link"):
        chain.with_link("fast")


def test_solve_with_offload_needs_a_link_and_reports_its_copies():
    torch.manual_seed(0)
    chain = remat.profile(deep_mlp(), torch.randn(16, 64), progress=False)
    with pytest.raises(ValueError, match="link"):
        remat.solve(chain, "60%", offload=True)
    linked = chain.with_link(FAST)
    offloaded = [remat.solve(linked, f"{p}%", offload=True) for p in (40, 60, 80)]
    assert all(s.ok for s in offloaded)
    assert any(s.offloads > 0 and "O_" in s.sequence for s in offloaded)
    for s in offloaded:
        alone = remat.solve(linked, s.budget_bytes)
        # Keeping, recomputing or offloading: no worse. A tie is the same sum taken in another
        # order, which may differ in its last bits.
        assert s.makespan_ms <= alone.makespan_ms * (1 + 1e-12)
        assert alone.offloads == 0 and alone.host_peak_bytes == 0
        if s.offloads:
            assert s.host_peak_bytes > 0
    assert linked.min_budget(offload=True) <= linked.min_budget()


@pytest.mark.parametrize("fraction", [0.4, 0.6, 0.8])
def test_offloading_training_equals_plain_bit_for_bit(fraction):
    torch.manual_seed(0)
    plain = deep_mlp()
    ours = copy.deepcopy(plain)
    x = torch.randn(16, 64, requires_grad=True)
    chk = remat.Checkpointable(ours, x, progress=False, offload=True, link=FAST)
    assert chk.chain.link == FAST
    budget = max(chk.min_budget(), int(fraction * chk.store_all_peak()))
    solution = chk.compute_sequence(budget)
    assert solution.ok and solution.peak_bytes <= budget
    for seed in (1, 2):
        x_plain = x.detach().clone().requires_grad_(True)
        x_ours = x.detach().clone().requires_grad_(True)
        assert torch.equal(train_step(plain, x_plain, seed), train_step(chk, x_ours, seed))
        assert torch.equal(x_plain.grad, x_ours.grad)
        assert_same_training(plain, ours)
        assert chk.host_memory["in_use_bytes"] == 0
    for m in ours.modules():
        if isinstance(m, nn.BatchNorm1d):
            assert int(m.num_batches_tracked) == 2  # once per step


def test_offloading_steps_stay_within_the_budget_and_reuse_host_memory():
    torch.manual_seed(0)
    model = deep_mlp()
    for p in model.parameters():  # gradients exist before the steps: they are not activations
        p.grad = torch.zeros_like(p)
    x = torch.randn(16, 64)
    chk = remat.Checkpointable(model, x, progress=False, link=FAST)
    solutions = [chk.compute_sequence(int(p * chk.store_all_peak()), offload=True)
                 for p in (0.4, 0.5, 0.6, 0.7)]
    budget = max((s for s in solutions if s.ok), key=lambda s: s.offloads).budget_bytes
    solution = chk.compute_sequence(budget)  # offload=True kept from the last call
    assert solution.offloads > 0, solution.sequence
    blocks = None
    for seed in (1, 2, 3):
        chk.reset_host_peak()
        peak = step_peak(lambda: train_step(chk, x, seed))
        assert peak <= budget
        host = chk.host_memory
        assert host["in_use_bytes"] == 0
        assert 0 < host["peak_bytes"] <= solution.host_peak_bytes
        if blocks is None:
            blocks = host["blocks"]
        assert host["blocks"] == blocks  # the later steps allocate no host memory
    chk.trace_next_step()
    train_step(chk, x, 4)
    kinds = [e["kind"] for e in chk.last_trace]
    assert kinds.count("copy") == 3 * solution.offloads  # O_i, E_i, P_i each
    assert chk.trace_summary["copy"]["operations"] == 3 * solution.offloads
    chk.free_host_memory()
    assert chk.host_memory["held_bytes"] == 0


def test_host_memory_bounds_the_copies_and_training_holds_it():
    torch.manual_seed(0)
    model = deep_mlp()
    x = torch.randn(16, 64)
    chk = remat.Checkpointable(model, x, progress=False, link=FAST)
    free = max((chk.compute_sequence(int(p * chk.store_all_peak()), offload=True)
                for p in (0.4, 0.5, 0.6, 0.7)), key=lambda s: s.offloads)
    assert free.offloads >= 2, free.sequence
    bound = free.host_peak_bytes // 2
    bounded = chk.compute_sequence(free.budget_bytes, offload=True, host_memory=bound)
    assert bounded.ok and bounded.status == "optimal"
    assert 0 < bounded.host_peak_bytes <= bound and bounded.offloads < free.offloads
    # A bound only takes schedules away; a tied optimum's sum, taken in another order, may
    # differ in its last bits (CI, torch 2.0.1: 3.8830820000000004 against ...17).
    assert bounded.makespan_ms >= free.makespan_ms * (1 - 1e-12)
    # The bound given as a size; and remat.solve keeps the bound on the chain too.
    again = chk.compute_sequence(free.budget_bytes, offload=True, host_memory=f"{bound}B")
    assert again.sequence == bounded.sequence
    alone = remat.solve(chk.chain, free.budget_bytes, offload=True, host_memory=bound)
    assert alone.ok and alone.host_peak_bytes <= bound
    # Training keeps the host memory within the bound, and the next solve keeps the bound.
    chk.reset_host_peak()
    train_step(chk, x, 1)
    assert 0 < chk.host_memory["peak_bytes"] <= bound
    assert chk.compute_sequence(free.budget_bytes).sequence == bounded.sequence
    # None: no bound again.
    assert chk.compute_sequence(free.budget_bytes, host_memory=None).sequence == free.sequence
    # From the constructor.
    made = remat.Checkpointable(deep_mlp(), x, progress=False, link=FAST, offload=True,
                                host_memory=bound)
    assert made.compute_sequence(free.budget_bytes).host_peak_bytes <= bound
    assert made.min_budget() >= made.min_budget(host_memory=None)
    # Without offload, the kept bound has nothing to bound.
    assert made.min_budget(offload=False) == made.min_budget(offload=False, host_memory=None)


def test_host_memory_refuses_what_it_cannot_mean():
    torch.manual_seed(0)
    chain = remat.profile(deep_mlp(), torch.randn(16, 64), progress=False).with_link(FAST)
    with pytest.raises(ValueError, match="host_memory=1024 bounds the offloaded copies: it needs "
                                         "offload=True"):
        remat.solve(chain, "60%", host_memory=1024)
    with pytest.raises(ValueError, match=r"host_memory \(-1\) must be at least 0 bytes"):
        remat.solve(chain, "60%", offload=True, host_memory=-1)
    with pytest.raises(ValueError, match="host_memory: "):
        remat.solve(chain, "60%", offload=True, host_memory="lots")
    with pytest.raises(TypeError, match="host_memory: 1.5 is neither bytes"):
        remat.solve(chain, "60%", offload=True, host_memory=1.5)
    with pytest.raises(ValueError, match="needs offload=True"):
        remat.Checkpointable(deep_mlp(), progress=False, host_memory="1GiB")
    # With no host memory at all, the least budget is recomputation's.
    assert chain.min_budget(offload=True, host_memory=0) == chain.min_budget()


def test_set_link_checks_and_applies_to_later_measurements():
    torch.manual_seed(0)
    chk = remat.Checkpointable(deep_mlp(), progress=False)
    with pytest.raises(ValueError, match="link.h2d_gbps"):
        chk.set_link((10.0, 0.0, 0.0))
    chk.set_link(remat.Link(10.0, 10.0, 0.01))
    chain = chk.measure(torch.randn(8, 64))
    assert chain.link == remat.Link(10.0, 10.0, 0.01)
    assert chk.compute_sequence("60%", offload=True).ok
    chk.set_link(None)
    assert chk.chain.link is None
    # Offloading without a link measures the device's, once.
    assert chk.compute_sequence("60%", offload=True).ok
    measured = chk.chain.link
    assert measured is not None and measured.d2h_gbps > 0.001 and measured.latency_ms >= 0
    chk.measure(torch.randn(8, 64))
    assert chk.chain.link == measured


def test_measure_link_on_the_cpu():
    link = remat.measure_link("cpu", nbytes=8 * 2**20, repeat=3)
    assert isinstance(link, remat.Link)
    # memcpy on any machine: more than 0.1 GB/s, a copy of 4 KiB in less than a millisecond.
    assert link.d2h_gbps > 0.1 and link.h2d_gbps > 0.1
    assert 0 <= link.latency_ms < 1
    with pytest.raises(ValueError, match="nbytes"):
        remat.measure_link("cpu", nbytes=1024)


def test_offload_survives_a_copy_of_the_module():
    torch.manual_seed(0)
    chk = remat.Checkpointable(deep_mlp(), torch.randn(16, 64), "60%", progress=False,
                               offload=True, link=FAST)
    twin = copy.deepcopy(chk)
    assert twin.chain.link == FAST
    assert twin.compute_sequence("60%").ok


class Residual(nn.Module):
    """Not a chain: a model as users write it, with skips."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(64, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU())
                                    for _ in range(6))
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


@pytest.mark.skipif(not export_available(), reason="capturing a model needs torch 2.5 or later")
def test_any_model_trains_exactly_with_offloads():
    torch.manual_seed(0)
    plain = Residual()
    ours = copy.deepcopy(plain)
    x = torch.randn(16, 64)
    model = remat.Checkpointable(ours, x, progress=False, offload=True, link=FAST)
    assert isinstance(model, remat.ModelCheckpointable)
    offloads = 0
    for p in (0.5, 0.7):
        solution = model.compute_sequence(int(p * model.store_all_peak()))
        assert solution.ok
        offloads += solution.offloads
        for seed in (1, 2):
            assert torch.equal(train_step(plain, x, seed), train_step(model, x, seed))
            assert_same_training(plain, ours)
    assert offloads > 0
