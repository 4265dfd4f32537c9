"""PyTorch's own tests of checkpoint_sequential (test/test_utils.py, class TestCheckpoint),
each re-expressed with a budget in place of the segment count: what each checks, asked of
remat.checkpoint_sequential. The part that cannot pass (create_graph, in
test_checkpoint_valid) is kept as what remat says instead, and why."""

import pytest
import torch
from torch import nn

import remat


def mlp():
    return nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(),
                         nn.Linear(20, 5), nn.ReLU())


def check_against_plain(model, modules_to_compare, budget, input):
    """torch's _check_checkpoint_sequential: the output, the input's gradient and every
    parameter's gradient of each way of passing the chain, against the model run plainly
    (here bit for bit: torch compares within tolerances)."""
    out = model(input)
    plain_out = out.detach().clone()
    model.zero_grad()
    out.sum().backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    plain_input_grad = input.grad.clone()
    for functions in modules_to_compare:
        x = input.detach().requires_grad_(True)
        out = remat.checkpoint_sequential(functions, budget, x, progress=False)
        model.zero_grad()
        out.sum().backward()
        assert torch.equal(out.detach(), plain_out)
        assert torch.equal(x.grad, plain_input_grad)
        for name, p in model.named_parameters():
            assert torch.equal(p.grad, plain_grads[name]), name


@pytest.mark.parametrize("budget", ["min", "50%+", "100%"])
def test_checkpoint(budget):
    torch.manual_seed(0)
    model = mlp()
    check_against_plain(model, [list(model.children()), model], budget,
                        torch.randn(1, 100, requires_grad=True))


@pytest.mark.parametrize("budget", ["min", "100%"])
def test_checkpoint_module_list(budget):
    class ModuleListNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.module_list = nn.ModuleList(list(mlp().children()))

        def forward(self, x):
            for layer in self.module_list:
                x = layer(x)
            return x

    torch.manual_seed(0)
    model = ModuleListNet()
    check_against_plain(model, [list(model.module_list.children()), model.module_list], budget,
                        torch.randn(1, 100, requires_grad=True))


def test_checkpoint_trigger():
    """torch's: with 2 segments, the first half's forwards run twice in a step, the rest once.
    With a budget, each stage's forward runs as often as the schedule has forwards of it: once
    at store-all, and more for some at the least budget."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.counter = 0

        def forward(self, x):
            self.counter += 1
            return x * torch.tensor(2.0)

    for budget in ("100%", "min"):
        modules = [Net() for _ in range(10)]
        x = torch.randn(3, 4, requires_grad=True)
        remat.checkpoint_sequential(modules, budget, x, progress=False).sum().backward()  # measures
        chk = next(iter(modules[0].__dict__["_remat_checkpoint_sequential"].values()))
        operations = chk.solution.operations
        for m in modules:
            m.counter = 0
        out = remat.checkpoint_sequential(modules, budget, x, progress=False)
        forwards = [sum(1 for op in operations if op.startswith(("F", "CF")) and
                        int(op.split("_")[1]) == k) for k in range(10)]
        before = [m.counter for m in modules]
        out.sum().backward()
        assert [m.counter for m in modules] == forwards
        assert all(b >= 1 for b in before)  # the forward pass ran each at least once
        if budget == "100%":
            assert forwards == [1] * 10
        else:
            assert max(forwards) > 1


def test_checkpoint_valid():
    """torch's: torch.autograd.grad(..., create_graph=True) through the reentrant checkpoint
    is refused, and through the non-reentrant one gives plain autograd's gradients. Through
    remat, without create_graph: plain autograd's gradients, bit for bit. With it (the part
    that cannot pass), refused, saying why: the recomputed backward is not differentiable
    again."""
    torch.manual_seed(0)
    model = mlp()
    x = torch.randn(1, 100, requires_grad=True)
    modules = list(model.children())
    out = remat.checkpoint_sequential(modules, "min", x, progress=False)
    plain = model(x)
    assert torch.equal(out, plain)
    ones = torch.ones(1, 5)
    expected = torch.autograd.grad(outputs=[plain], grad_outputs=[ones], inputs=[x])
    got = torch.autograd.grad(outputs=[out], grad_outputs=[ones], inputs=[x])
    assert torch.equal(got[0], expected[0])
    out = remat.checkpoint_sequential(modules, "min", x, progress=False)
    with pytest.raises(RuntimeError, match=r"makes a graph of the gradients \(create_graph\)"):
        torch.autograd.grad(outputs=[out], grad_outputs=[ones], inputs=[x], create_graph=True)


def test_checkpoint_sequential_deprecated_multiple_args():
    class Two(nn.Module):
        def forward(self, a, b):
            return a, b

    a = torch.randn(1, 100, requires_grad=True)
    b = torch.randn(1, 100, requires_grad=True)
    with pytest.raises(TypeError):
        remat.checkpoint_sequential(nn.Sequential(Two()), "min", a, b)


def test_checkpoint_sequential_deprecated_no_args():
    class Noop(nn.Module):
        def forward(self):
            pass

    with pytest.raises(TypeError, match="needs the input"):
        remat.checkpoint_sequential(nn.Sequential(Noop()), "min")
