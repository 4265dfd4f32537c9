"""torch.compile: stages compiled one by one train through remat exactly as the same compiled
stages run plainly (gradients, dropout masks), and the step's peak is the prediction, as for
eager stages. The Checkpointable itself is not compiled: Dynamo runs remat's C++ step as a
graph break, eagerly (docs/python.md, "torch.compile"). The CUDA case (Triton kernels) runs in
the GPU check; on the CPU, Inductor's C++ kernels."""

import copy

import pytest
import torch
from torch import nn

import remat
from conftest import assert_same_training, cuda_step_peak, requires_cuda, step_peak, tensor_bytes


def _why_compile_cannot_run() -> str:
    """Empty where torch.compile runs here, else why not."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:  # torch 2.0 refuses Python 3.11, for one; a machine may lack Inductor's C++ compiler
        torch.compile(lambda t: t * 2)(torch.ones(2))
        return ""
    except Exception as error:  # noqa: BLE001 - whatever stops torch.compile, the tests cannot run
        return f"torch.compile does not run here: {type(error).__name__}: {str(error).splitlines()[0][:200]}"


_WHY_NOT = _why_compile_cannot_run()
pytestmark = pytest.mark.skipif(bool(_WHY_NOT), reason=_WHY_NOT)


@pytest.fixture
def compiled_stages_kept_compiled():
    """Every stage is compiled twice (with and without autograd: remat's forwards without it),
    and torch.compile of a module compiles one function for all modules: past Dynamo's limit of
    8 it would run the rest eagerly, and the test would compare eager with eager."""
    import torch._dynamo

    torch._dynamo.reset()
    config = torch._dynamo.config
    # recompile_limit from torch 2.6 (cache_size_limit, its old name, is an alias there).
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    with config.patch(**{name: 64}):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_compiled_stages_train_as_plain_compiled_stages(compiled_stages_kept_compiled, device):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Dropout(0.2), nn.Linear(128, 128), nn.GELU(),
                         nn.Dropout(0.2), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10)).to(device)
    plain_modules, our_modules = copy.deepcopy(base), copy.deepcopy(base)
    plain = nn.Sequential(*[torch.compile(m) for m in plain_modules])
    x = torch.randn(32, 64, device=device)
    chk = remat.Checkpointable([torch.compile(m) for m in our_modules], x, progress=False)
    solution = chk.compute_sequence(chk.min_budget())
    assert solution.ok and ("Fn" in solution.sequence or "CF" in solution.sequence)
    reserve = remat._C.runtime_reserve_bytes(device)
    x0 = remat._C.counted_bytes(device, tensor_bytes(x))
    for p in (*our_modules.parameters(), *plain_modules.parameters()):  # not activations (docs/python.md)
        p.grad = torch.zeros_like(p)
    for seed in (1, 2):
        torch.manual_seed(seed)
        plain(x).square().mean().backward()

        def step():
            torch.manual_seed(seed)
            out = chk(x)  # kept to the step's end, as the chain has it (output_held, the default)
            out.square().mean().backward()

        measured = (step_peak if device == "cpu" else cuda_step_peak)(step) + x0 + reserve
        # Inductor's dropout draws its seed from torch's generator: replayed, the same masks.
        assert_same_training(plain_modules, our_modules)
        if device == "cpu":  # every byte; the loss's two scalars (8 bytes) are outside the chain
            assert measured == solution.peak_bytes + 8, (measured, solution.sequence)
        else:  # the loss's two scalars and the gradient seed, a 512-byte block each
            assert measured <= solution.budget_bytes + 3 * 512, (measured, solution.sequence)
            assert abs(measured - solution.peak_bytes) <= 3 * 512, (measured, solution.peak_bytes)
    from torch._dynamo.utils import counters

    assert counters["stats"]["unique_graphs"] >= len(base)  # the stages did run compiled


def test_a_compiled_checkpointable_runs_its_step_eagerly_and_exactly(compiled_stages_kept_compiled):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Dropout(0.2), nn.Linear(128, 128), nn.Tanh(),
                          nn.Linear(128, 10))
    ours = copy.deepcopy(plain)
    x = torch.randn(32, 64)
    chk = remat.Checkpointable(ours, x, progress=False)
    chk.compute_sequence(chk.min_budget())
    compiled = torch.compile(chk)
    for seed in (1, 2):
        for model in (plain, compiled):
            torch.manual_seed(seed)
            model(x).square().mean().backward()
        assert_same_training(plain, ours)


def test_compiled_batchnorm_stages_train_within_rounding(compiled_stages_kept_compiled):
    """With BatchNorm, what holds is closeness, not identity (docs/python.md, "torch.compile"):
    in some fresh compilations the stages remat recomputes have differed from the same compiled
    stages trained plainly in the last bits. The statistics, which remat updates once per step,
    agree; the gradients agree to float32's rounding."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    plain_modules, our_modules = copy.deepcopy(base), copy.deepcopy(base)
    plain = nn.Sequential(*[torch.compile(m) for m in plain_modules])
    x = torch.randn(4, 3, 8, 8)
    chk = remat.Checkpointable([torch.compile(m) for m in our_modules], x, progress=False)
    solution = chk.compute_sequence(chk.min_budget())
    assert solution.ok and ("Fn" in solution.sequence or "CF" in solution.sequence)
    for seed in (1, 2):
        for model in (plain, chk):
            torch.manual_seed(seed)
            model(x).square().mean().backward()
        for (name, p), q in zip(plain_modules.named_parameters(), our_modules.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=f"gradient of {name}")
        for (name, u), v in zip(plain_modules.named_buffers(), our_modules.buffers()):
            torch.testing.assert_close(v, u, rtol=1e-5, atol=1e-6, msg=f"buffer {name}")
