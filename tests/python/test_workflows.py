"""What users do around a Checkpointable besides training steps: other backward calls,
unfreezing and replacing layers, copies, validation loops, interruptions, rotor's keywords,
checkpoint_sequential's habits. Each was found wrong by a user's trial; each is either exact
or refused with a message."""

import copy
import gc
import io
import pickle
import weakref

import pytest
import torch
from torch import nn

import remat


def net() -> nn.Sequential:
    """Deep enough that its least budget is about half of store-all's peak."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), *[m for _ in range(6) for m in (nn.Tanh(), nn.Linear(32, 32))],
                         nn.Tanh(), nn.Linear(32, 2))


def grads(module: nn.Module) -> list:
    return [p.grad.clone() if p.grad is not None else None for p in module.parameters()]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y)) for x, y in zip(a, b))


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_backward_calls_it_cannot_serve_are_refused_and_a_whole_backward_stays_exact():
    model = net()
    plain = copy.deepcopy(model)
    x = torch.randn(16, 8, requires_grad=True)
    chk = remat.Checkpointable(model, x, progress=False)
    chk.compute_sequence(chk.min_budget())
    with pytest.raises(RuntimeError, match="torch.autograd.grad and backward\\(inputs=...\\) are not supported"):
        torch.autograd.grad(chk(x).sum(), x)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        chk(x).sum().backward(create_graph=True)
    assert all(p.grad is None for p in model.parameters())  # nothing written by either
    chk(x).sum().backward()
    plain(x).sum().backward()
    assert same(grads(model), grads(plain))


def test_a_layer_unfrozen_after_measuring_is_refused_until_measured_again():
    model = net()
    for p in model[0].parameters():
        p.requires_grad_(False)
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, "100%", progress=False)
    for p in model.parameters():
        p.requires_grad_(True)
    with pytest.raises(ValueError, match="requires grad, but it did not when the chain was measured"):
        chk(x)
    chk.measure(x)
    plain = copy.deepcopy(model)
    chk(x).sum().backward()
    plain(x).sum().backward()
    assert model[0].weight.grad is not None and same(grads(model), grads(plain))


def test_context_given_only_to_forward_is_refused():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(16, 16)

        def forward(self, x, mask=None):
            h = self.l(x)
            return (h if mask is None else h * mask).tanh()

    chk = remat.Checkpointable(nn.Sequential(Block(), Block()), budget="100%", progress=False)
    for mode in (chk.train, chk.eval):
        mode()
        with pytest.raises(ValueError, match="context given, but this Checkpointable was built without one"):
            chk(torch.randn(8, 16), context=torch.zeros(8, 16))


def test_a_replaced_stage_is_the_one_that_runs():
    model = net()
    x = torch.randn(4, 8)
    chk = remat.Checkpointable(model, x, progress=False)
    model[-1] = nn.Linear(32, 3)  # a new head
    plain = copy.deepcopy(model)
    out = chk(x)
    assert out.shape == (4, 3)
    out.sum().backward()
    plain(x).sum().backward()
    assert model[-1].weight.grad is not None and same(grads(model), grads(plain))
    chk.eval()
    assert torch.equal(chk(x), plain(x))


def test_copies_pickles_and_saves_train_as_the_original():
    model = net()
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, "60%", progress=False)
    twin = copy.deepcopy(chk)
    assert twin.chain == chk.chain and twin.module is not chk.module
    restored = pickle.loads(pickle.dumps(chk))
    buffer = io.BytesIO()
    torch.save(chk, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (twin, restored, loaded):
        for m in (chk, other):
            m.zero_grad(set_to_none=True)
            m(x).sum().backward()
        assert same(grads(chk), grads(other))
    # checkpoint_sequential's cache does not make the user's network uncopyable.
    seq = net()
    remat.checkpoint_sequential(seq, "100%", torch.randn(4, 8), progress=False).sum().backward()
    copy.deepcopy(seq)
    torch.save(seq, io.BytesIO())
    t = remat.tradeoff(chk.chain, points=3)
    assert copy.copy(t).budgets == t.budgets
    assert pickle.loads(pickle.dumps(chk.chain)) == chk.chain


def test_cycles_through_the_runtime_are_freed():
    mods = [nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 2)]
    remat.checkpoint_sequential(mods, "100%", torch.randn(4, 8), progress=False).sum().backward()
    freed = weakref.ref(mods[2])
    del mods
    gc.collect()
    assert freed() is None

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(8, 64), nn.Linear(64, 2)
            self.chk = remat.Checkpointable([self.l1, self.act, self.l2], progress=False)

        def act(self, t):
            return torch.tanh(t)

    m = Model()
    m.chk(torch.randn(4, 8)).sum().backward()
    freed = weakref.ref(m)
    del m
    gc.collect()
    assert freed() is None
    # Parameters replaced in place of the old ones are not kept alive by the runtime.
    chk = remat.Checkpointable(net(), torch.randn(4, 8), progress=False)
    old = weakref.ref(chk.module[0].weight)
    chk.load_state_dict({k: v.clone() for k, v in chk.state_dict().items()}, assign=True)
    gc.collect()
    assert old() is None


def test_measuring_in_a_validation_loop_works():
    model = net()
    x = torch.randn(16, 8)
    with torch.no_grad():
        chk = remat.Checkpointable(model, x, "70%", progress=False)
    with torch.inference_mode():
        chk.measure(x)
    chk(x).sum().backward()
    model.eval()
    y = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(remat.checkpoint_sequential(model, "50%", y), model(y))
    assert "_remat_checkpoint_sequential" not in model.__dict__  # nothing measured in eval
    model.train()
    # Alternating shapes (a smaller last batch) are measured once each, not at every call.
    for batch in (16, 15, 16, 15):
        remat.checkpoint_sequential(model, "70%", torch.randn(batch, 8), progress=False).sum().backward()
    assert len(model.__dict__["_remat_checkpoint_sequential"]) == 2


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), torch.OutOfMemoryError("out of memory")])
def test_interruptions_while_measuring_pass_through_untouched(error):
    class Raises(nn.Module):
        def forward(self, x):
            raise error

    with pytest.raises(type(error)):
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8), Raises()), torch.randn(2, 8), progress=False)
    # An ordinary exception stays the stage's failure, named.
    class Fails(nn.Module):
        def forward(self, x):
            raise ArithmeticError("bad")

    with pytest.raises(ValueError, match=r"stage 1 \(1\).*forward failed.*bad"):
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8), Fails()), torch.randn(2, 8), progress=False)


def test_the_default_budget_and_the_chosen_algorithm_hold_across_measurements():
    model = net()
    chk = remat.Checkpointable(model, torch.randn(16, 8), progress=False)
    chk(torch.randn(16, 8)).sum().backward()
    assert chk.budget is None  # the default, worked out again at each solve
    chk.double()
    chk.measure(torch.randn(16, 8, dtype=torch.float64))
    chk(torch.randn(16, 8, dtype=torch.float64)).sum().backward()
    assert chk.solution.peak_bytes == chk.store_all_peak()
    s = chk.compute_sequence(chk.min_budget(), "periodic", segments=2)
    if not s.ok:
        with pytest.raises(ValueError, match="periodic needs at least"):
            chk(torch.randn(16, 8, dtype=torch.float64))
    chk.compute_sequence("100%", "periodic", segments=2)
    chk.measure(torch.randn(16, 8, dtype=torch.float64))
    chk(torch.randn(16, 8, dtype=torch.float64)).sum().backward()
    assert chk.solution.algorithm == "periodic"


def test_containers_and_properties():
    class Residual(nn.Sequential):
        def forward(self, x):
            return x + super().forward(x)

    with pytest.raises(TypeError, match="Residual is an nn.Sequential with a forward of its own"):
        remat.Checkpointable(Residual(nn.Linear(4, 4)))
    layers = nn.ModuleList([nn.Linear(4, 4), nn.Tanh()])
    chk = remat.Checkpointable(layers, progress=False)
    assert chk.chain is None and chk.solution is None and not hasattr(chk.solution, "ok")
    chk.measure(torch.randn(2, 4))
    assert chk.chain is not None and chk.module is layers


def test_rotor_keywords():
    model = net()
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, custom_input=x, mem_limit="90%", verbosity=0)
    assert chk.solution.budget_bytes == chk.store_all_peak() * 90 // 100
    chk.measure(custom_input=x)
    s = chk.compute_sequence(custom_mem_limit="100%", mem_slots=200)
    assert s.ok
    with pytest.raises(TypeError, match="budget and mem_limit"):
        remat.Checkpointable(model, x, "50%", mem_limit="60%")


def test_checkpoint_sequential_habits():
    model = net()
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="not torch's number of segments"):
        remat.checkpoint_sequential(model, 2, x)
    functions = [model[0], torch.tanh, model[2]]
    out = remat.checkpoint_sequential(functions, "100%", x, use_reentrant=False, determinism_check="default",
                                      debug=False, progress=False)
    assert torch.equal(out, model[2](torch.tanh(model[0](x))))
