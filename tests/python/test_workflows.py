"""What users do around a Checkpointable besides training steps: other backward calls,
unfreezing and replacing layers, copies, validation loops, interruptions, rotor's keywords,
checkpoint_sequential's habits. Each was found wrong by a user's trial; each is either exact
or refused with a message."""

import copy
import gc
import inspect
import io
import pickle
import traceback
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


def raising_in_backward(error) -> nn.Module:
    """A stage computing 2x through an autograd.Function whose backward raises error(), or
    returns 2g where error() is None: autograd's engine rethrows what it raises as torch's
    python_error."""

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raised = error()
            if raised is not None:
                raise raised
            return g * 2

    class Stage(nn.Module):
        def forward(self, x):
            return Double.apply(x)

    return Stage()


PARAMETER_EDGES = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 1)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("budget", ["min", "100%"])
def test_grad_of_some_tensors_is_plains_and_create_graph_is_refused(budget):
    """torch.autograd.grad and backward(inputs=...) through the chain: plain autograd's
    gradients, bit for bit, no .grad written (autograd.grad) or only the inputs' (backward);
    the parameters' from torch 2.1. create_graph is refused: the recomputed backward is not
    differentiable again."""
    torch.manual_seed(0)
    model = net()
    plain = copy.deepcopy(model)
    x = torch.randn(16, 8, requires_grad=True)
    chk = remat.Checkpointable(model, x, budget, progress=False)

    def loss(m):
        return m(x).pow(2).sum()

    ours_params, plain_params = list(model.parameters()), list(plain.parameters())
    asked = [([x], [x])]
    if PARAMETER_EDGES:
        asked += [(ours_params, plain_params), ([ours_params[2], x], [plain_params[2], x])]
    for ours_of, plain_of in asked:
        got = torch.autograd.grad(loss(chk), ours_of)
        expected = torch.autograd.grad(loss(plain), plain_of)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert x.grad is None and all(p.grad is None for p in model.parameters())
    if PARAMETER_EDGES:
        loss(chk).backward(inputs=[ours_params[0]])
        loss(plain).backward(inputs=[plain_params[0]])
        assert torch.equal(ours_params[0].grad, plain_params[0].grad)
        assert all(p.grad is None for p in ours_params[1:]) and x.grad is None
        ours_params[0].grad = plain_params[0].grad = None
    with pytest.raises(RuntimeError, match=r"makes a graph of the gradients \(create_graph\)"):
        loss(chk).backward(create_graph=True)
    with pytest.raises(RuntimeError, match=r"makes a graph of the gradients \(create_graph\)"):
        torch.autograd.grad(loss(chk), x, create_graph=True)
    assert all(p.grad is None for p in model.parameters())  # nothing written
    x.grad = None
    loss(chk).backward()
    loss(plain).backward()
    assert same(grads(model), grads(plain))


@pytest.mark.skipif(not PARAMETER_EDGES, reason="post-accumulate hooks: torch 2.1")
def test_a_parameters_hooks_run_once_a_step_and_its_gradient_cannot_be_asked_for():
    """A parameter with a hook (DDP's, an optimizer step in the backward) is left off the
    node's edges: its hook runs once, as in plain training, and torch.autograd.grad of it
    says torch's own "not used in the graph"."""
    torch.manual_seed(0)
    model = net()
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, "min", progress=False)
    calls = []
    hooked = model[0].weight
    hooked.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.clone()))
    model[2].weight.register_hook(lambda g: g * 1)  # a tensor hook, given None would fail
    chk(x).sum().backward()
    assert len(calls) == 1 and torch.equal(calls[0], hooked.grad)
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        torch.autograd.grad(chk(x).sum(), hooked)
    # The others can be.
    assert torch.autograd.grad(chk(x).sum(), model[-1].weight)[0].shape == model[-1].weight.shape


def test_a_layer_unfrozen_after_measuring_is_refused_until_measured_again():
    model = net()
    for p in model[0].parameters():
        p.requires_grad_(False)
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, "100%", progress=False)
    for p in model.parameters():
        p.requires_grad_(True)
    with pytest.raises(ValueError, match=r"stage 0 \(0\)'s parameter 0 is Float 32x8 on cpu, trained, "
                       r"but Float 32x8 on cpu, frozen when the chain was measured"):
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


def test_named_stages_keep_their_names_in_the_state_dict_and_can_be_replaced():
    torch.manual_seed(0)
    layers = [("embed", nn.Linear(8, 16)), ("act", torch.tanh), ("head", nn.Linear(16, 2))]
    chk = remat.Checkpointable(layers, torch.randn(4, 8), progress=False)
    assert list(chk.state_dict()) == ["embed.weight", "embed.bias", "head.weight", "head.bias"]
    assert chk.chain.stage_names == ["embed", "act", "head"]
    # A plain list keeps torch's numbering, modules and callables alike.
    plain_list = remat.Checkpointable([nn.Linear(8, 16), torch.tanh, nn.Linear(16, 2)], progress=False)
    assert list(plain_list.state_dict())[::2] == ["0.weight", "2.weight"]
    # Every stage a module: replacing one by name is seen, and the new one runs.
    modules = [("embed", nn.Linear(8, 16)), ("act", nn.Tanh()), ("head", nn.Linear(16, 2))]
    chk = remat.Checkpointable(modules, torch.randn(4, 8), progress=False)
    chk.module.head = nn.Linear(16, 5)
    assert chk(torch.randn(4, 8)).shape == (4, 5)
    # A chain of another network with as many stages is refused, naming the stage.
    other = remat.Checkpointable([("a", nn.Linear(8, 16)), ("act", nn.Tanh()), ("head", nn.Linear(16, 2))],
                                 torch.randn(4, 8), progress=False)
    with pytest.raises(ValueError, match="stage 0 is named 'a' in the chain but 'embed' in the network"):
        chk.set_chain(other.chain)
    one = remat.Checkpointable([("embed", nn.Linear(8, 2))], torch.randn(4, 8), progress=False)
    with pytest.raises(ValueError, match="the chain has 1 stage but the network 3"):
        chk.set_chain(one.chain)
    with pytest.raises(ValueError, match="the chain has 3 stages but the network 1"):
        one.set_chain(chk.chain)
    with pytest.raises(ValueError, match=r"stage name 'layer1.0' cannot name a module"):
        remat.Checkpointable([("layer1.0", nn.Linear(8, 8))])


def test_a_stage_using_a_parameter_no_stage_has_is_refused():
    outside = nn.Parameter(torch.randn(8, 2))
    with pytest.raises(ValueError, match=r"stage 1 \(1\) uses a tensor that requires grad \(Float \[8, 2\]\) "
                                         "that is not a parameter of any stage.* A function or lambda stage has "
                                         "no parameters of its own: make the stage an nn.Module"):
        remat.Checkpointable([nn.Linear(8, 8), lambda h: h @ outside], torch.randn(4, 8), progress=False)
    assert outside.grad is None

    # A module's tensor attribute that requires grad is not its parameter: said so.
    class Unregistered(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.randn(8, 2, requires_grad=True)

        def forward(self, h):
            return h @ self.weight

    with pytest.raises(ValueError, match=r"Register it on the stage's module: an nn.Parameter attribute"):
        remat.Checkpointable([nn.Linear(8, 8), Unregistered()], torch.randn(4, 8), progress=False)
    # Tied to a stage's parameter (an LM head sharing the embedding's weight): measured.
    embed = nn.Linear(2, 8)
    chk = remat.Checkpointable([("embed", embed), ("head", lambda h: h @ embed.weight)], torch.randn(4, 2),
                               progress=False)
    chk(torch.randn(4, 2)).sum().backward()
    assert embed.weight.grad is not None


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
    # Parameters replaced in place of the old ones are not kept alive by the runtime: set one
    # by one, and by load_state_dict(assign=True) (torch 2.1 and later).
    chk = remat.Checkpointable(net(), torch.randn(4, 8), progress=False)
    old = weakref.ref(chk.module[0].weight)
    chk.module[0].weight = nn.Parameter(chk.module[0].weight.detach().clone())
    gc.collect()
    assert old() is None
    if "assign" in inspect.signature(nn.Module.load_state_dict).parameters:
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


# torch.cuda.OutOfMemoryError: torch.OutOfMemoryError from torch 2.1, the only name in 2.0.
@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), torch.cuda.OutOfMemoryError("out of memory")])
def test_interruptions_while_measuring_pass_through_untouched(error):
    class Raises(nn.Module):
        def forward(self, x):
            raise error

    with pytest.raises(type(error)) as raised:
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8), Raises()), torch.randn(2, 8), progress=False)
    assert raised.value is error
    # So does one from a backward, which autograd's engine rethrows as torch's python_error.
    with pytest.raises(type(error)) as raised:
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8), raising_in_backward(lambda: error)), torch.randn(2, 8),
                             progress=False)
    assert raised.value is error
    # An ordinary exception stays the stage's failure, named.
    class Fails(nn.Module):
        def forward(self, x):
            raise ArithmeticError("bad")

    with pytest.raises(ValueError, match=r"stage 1 \(1\).*forward failed.*bad") as failure:
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8), Fails()), torch.randn(2, 8), progress=False)
    # The stage's own exception is the cause, with its traceback into the stage.
    cause = failure.value.__cause__
    assert isinstance(cause, ArithmeticError) and str(cause) == "bad"
    assert "raise ArithmeticError" in "".join(traceback.format_tb(cause.__traceback__))
    # So is a backward's, raised in autograd's engine.
    with pytest.raises(ValueError, match=r"stage 1 \(1\): backward failed: in backward") as failure:
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8), raising_in_backward(lambda: ZeroDivisionError("in backward"))),
                             torch.randn(2, 8), progress=False)
    assert isinstance(failure.value.__cause__, ZeroDivisionError)
    # So is the loss function's.
    def bad_loss(y):
        raise LookupError("no such class")

    with pytest.raises(ValueError, match="the loss function failed") as failure:
        remat.Checkpointable(nn.Sequential(nn.Linear(8, 8)), torch.randn(2, 8), loss=bad_loss, progress=False)
    assert isinstance(failure.value.__cause__, LookupError)


def test_a_failed_backward_leaves_the_model_as_it_was():
    # torch's autograd engine, called from C++ (by the profiler, and by the runtime within a
    # backward), restores a Python backward's error into the thread before rethrowing it. remat
    # then called Python with that error pending: setting the stages' training flags back failed
    # at the first stage, so measuring left the model in training mode and the random generator
    # where its forwards had moved it, and CPython misbehaved later (new nn.Linear objects
    # lacking their weight, in the next tests).
    fail = [True]
    fails = raising_in_backward(lambda: ZeroDivisionError("in backward") if fail[0] else None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), fails, nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)).eval()
    x = torch.randn(4, 8)
    state = torch.get_rng_state()
    with pytest.raises(ValueError, match="backward failed: in backward"):
        remat.Checkpointable(model, x, progress=False)
    assert not any(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), state)
    assert hasattr(nn.Linear(8, 8), "weight")
    # In training, with the stage recomputed: its backward fails within the runtime's, and the
    # next step is plain training's.
    model.train()
    fail[0] = False
    chk = remat.Checkpointable(model, x, progress=False)
    chk.compute_sequence(chk.min_budget())
    fail[0] = True
    with pytest.raises(ZeroDivisionError, match="in backward"):
        chk(x).sum().backward()
    assert all(m.training for m in model.modules())
    fail[0] = False
    model.zero_grad()
    torch.manual_seed(1)
    chk(x).sum().backward()
    got = grads(model)
    model.zero_grad()
    torch.manual_seed(1)
    model(x).sum().backward()
    assert all(g is not None for g in got) and same(got, grads(model))
    assert hasattr(nn.Linear(8, 8), "weight")


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

    # An nn.Sequential with a forward of its own is a model: captured, not run stage by stage.
    assert isinstance(remat.Checkpointable(Residual(nn.Linear(4, 4))), remat.ModelCheckpointable)
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
    # torch's keyword, as torch's users write it: what to write instead.
    with pytest.raises(TypeError, match=r"a memory budget, not torch's segments=2: .*"
                                        r"checkpoint_sequential\(functions, '50%', input\)"):
        remat.checkpoint_sequential(model, segments=2, input=x)
    with pytest.raises(TypeError, match="needs a budget"):
        remat.checkpoint_sequential(model, input=x)
    with pytest.raises(TypeError, match="needs the input"):
        remat.checkpoint_sequential(model, "50%")
    functions = [model[0], torch.tanh, model[2]]
    out = remat.checkpoint_sequential(functions, "100%", x, use_reentrant=False, determinism_check="default",
                                      debug=False, progress=False)
    assert torch.equal(out, model[2](torch.tanh(model[0](x))))


def test_parameters_changed_after_measuring_are_refused_a_frozen_one_runs():
    # A user's trial: a stage partly unfrozen went 65% over the budget, and .double() 43%,
    # without a word. Freezing more (fine-tuning) needs less than planned: it runs.
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 8)), nn.Tanh(),
                          nn.Linear(8, 4))
    model[0][2].weight.requires_grad_(False)
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, "100%", progress=False)
    model[0][2].weight.requires_grad_(True)
    with pytest.raises(ValueError, match=r"stage 0 \(0\)'s parameter 2 is Float 8x64 on cpu, trained, but "
                       r"Float 8x64 on cpu, frozen when the chain was measured"):
        chk(x)
    model[0][2].weight.requires_grad_(False)
    model[2].weight.requires_grad_(False)
    chk(x).sum().backward()
    model[2].weight.requires_grad_(True)
    chk.double()
    with pytest.raises(ValueError, match=r"parameter 0 is Double 64x8 on cpu, trained, but Float 64x8"):
        chk(x)  # the input as measured; the parameters are not


def test_a_recomputation_reads_the_buffer_its_stage_updates():
    class AverageScale(nn.Module):  # updates its buffer, then reads it
        def __init__(self):
            super().__init__()
            self.register_buffer("average", torch.ones(8))

        def forward(self, h):
            with torch.no_grad():
                self.average.mul_(0.5).add_(h.mean(0), alpha=0.5)
            return h * self.average

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(8, 8), AverageScale(), nn.Tanh())])
    plain = copy.deepcopy(model)
    x = torch.randn(5, 8)
    chk = remat.Checkpointable(model, x, progress=False)
    chk.compute_sequence(chk.min_budget())
    for _ in range(2):
        chk(x).sum().backward()
        plain(x).sum().backward()
    assert same(grads(model), grads(plain))
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), plain.buffers()))


def test_an_infeasible_budget_is_a_solution_that_says_so():
    model = net()
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, 10, progress=False)  # 10 bytes: nothing fits
    assert chk.solution is not None and not chk.solution.ok
    assert chk.solution.budget_bytes == 10 and chk.solution.min_feasible_budget_bytes > 10
    with pytest.raises(ValueError, match="no schedule fits the budget"):
        chk(x)


def test_an_input_changed_in_place_before_the_backward_is_refused_as_plain_autograd_does():
    model = net()
    x = torch.randn(16, 8)
    chk = remat.Checkpointable(model, x, progress=False)
    chk.compute_sequence(chk.min_budget())
    xx = x.clone()
    loss = chk(xx).sum()
    xx.fill_(0.5)
    with pytest.raises(RuntimeError, match="the input was modified by an inplace operation"):
        loss.backward()
    chk(x).sum().backward()  # the next step runs


def test_a_chains_state_dict_has_the_wrapped_modules_keys_alone_and_nested():
    """A checkpoint of the plain network loads into the wrapped one and back, the wrapper alone
    or inside a larger model; one saved with the wrapper's former "module." keys loads too."""

    def body():
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 4))

    class Model(nn.Module):
        def __init__(self, wrapped):
            super().__init__()
            self.stem = nn.Linear(4, 8)
            self.body = remat.Checkpointable(body(), progress=False) if wrapped else body()

    def randomized(module):
        with torch.no_grad():
            for t in module.state_dict().values():
                if t.is_floating_point():
                    t.copy_(torch.randn_like(t))
        return module

    def same(a, b):
        assert list(a) == list(b)
        assert all(torch.equal(a[k], b[k]) for k in a)

    torch.manual_seed(0)
    for wrapped_model, plain_model in ((lambda: remat.Checkpointable(body(), progress=False), body),
                                       (lambda: Model(True), lambda: Model(False))):
        plain, wrapped = randomized(plain_model()), wrapped_model()
        assert list(wrapped.state_dict()) == list(plain.state_dict())
        wrapped.load_state_dict(plain.state_dict())  # strict: every key, none unexpected
        same(wrapped.state_dict(), plain.state_dict())
        back = plain_model()
        back.load_state_dict(randomized(wrapped).state_dict())
        same(back.state_dict(), wrapped.state_dict())
        # Saved before the keys were the module's own: "module." after the wrapper's name.
        old = {(k.replace("body.", "body.module.", 1) if k.startswith("body.") else
                k if isinstance(wrapped, Model) else "module." + k): v
               for k, v in randomized(plain_model()).state_dict().items()}
        wrapped.load_state_dict(old)
        new = wrapped.state_dict()
        assert all(torch.equal(new[k.replace("module.", "", 1)], t) for k, t in old.items())
