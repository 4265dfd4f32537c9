"""remat.Checkpointable on a CUDA GPU (run by the GPU check; skipped where there is none):
gradients, BatchNorm statistics and dropout masks as plain training with deterministic
algorithms, the caching allocator's peak within the budget and at the prediction, autocast in
float16, and the default budget (the GPU's free memory)."""

import copy

import pytest
import torch
from torch import nn

import remat
from conftest import assert_same_training, check_autocast_training, cuda_step_peak, requires_cuda, tensor_bytes
from test_checkpointable import cnn, train_step

pytestmark = requires_cuda


def cuda_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return cnn().cuda()


@pytest.mark.parametrize("fraction", ["least", 0.5, 1.0])
def test_cuda_training_equals_plain(deterministic, fraction):
    plain = cuda_cnn()
    ours = copy.deepcopy(plain)
    x = torch.randn(8, 3, 32, 32, device="cuda", requires_grad=True)
    chk = remat.Checkpointable(ours, x, progress=False)
    least, full = chk.min_budget(), chk.store_all_peak()
    budget = least if fraction == "least" else least + int(fraction * (full - least))
    assert chk.compute_sequence(budget).ok
    for seed in (1, 2):
        x_plain = x.detach().clone().requires_grad_(True)
        x_ours = x.detach().clone().requires_grad_(True)
        out_plain, loss_plain = train_step(plain, x_plain, seed)
        out_ours, loss_ours = train_step(chk, x_ours, seed)
        assert torch.equal(out_plain, out_ours)
        assert torch.equal(x_plain.grad, x_ours.grad)
        assert_same_training(plain, ours)


def test_cuda_peak_is_within_the_budget_and_at_the_prediction():
    model = cuda_cnn()
    x = torch.randn(8, 3, 32, 32, device="cuda", requires_grad=True)
    chk = remat.Checkpointable(model, x, progress=False)
    least, full = chk.min_budget(), chk.store_all_peak()
    x0 = remat._C.counted_bytes("cuda", tensor_bytes(x))
    reserve = remat._C.runtime_reserve_bytes("cuda")
    # Parameter gradients are outside the budget (docs/runtime.md, "What the budget counts"):
    # allocated before the steps, as a loop whose zero_grad keeps them has them. (Left to the
    # first backward, they were counted in its peak: 13,824 bytes over on an H200.)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for budget in (least, (least + full) // 2, full):
        solution = chk.compute_sequence(budget)
        x.grad = None

        def step():
            torch.manual_seed(0)
            chk(x).sum().backward()

        # The caching allocator's own statistics: independent of remat's tracker. The input x_0
        # (allocated before) and the runtime's reserve are in the prediction; the loss's two
        # scalars (512-byte blocks each) and the gradient seed are not.
        measured = cuda_step_peak(step) + x0 + reserve
        assert measured <= budget + 3 * 512, (budget, measured, solution.sequence)
        assert abs(measured - solution.peak_bytes) <= 3 * 512, (solution.peak_bytes, measured)


def test_cuda_autocast_float16_recomputes_in_float16(deterministic):
    check_autocast_training("cuda", torch.float16)


def test_cuda_default_budget_is_the_free_memory():
    model = cuda_cnn()
    chk = remat.Checkpointable(model, torch.randn(4, 3, 16, 16, device="cuda"), progress=False)
    free, _ = torch.cuda.mem_get_info()
    solution = chk.compute_sequence()
    assert solution.ok
    assert abs(solution.budget_bytes - free) <= free // 10


def test_peak_during_on_cuda_reads_the_caching_allocator():
    device = torch.device("cuda")
    kept = torch.empty(8 << 20, dtype=torch.uint8, device=device)  # allocated before: not counted

    def two_then_one():
        a = torch.empty(1 << 20, dtype=torch.uint8, device=device)
        b = kept.clone()
        del a, b
        return torch.empty(1 << 20, dtype=torch.uint8, device=device)

    assert remat.peak_during(two_then_one, device) == 9 << 20
    assert remat.peak_during(two_then_one, "cuda") == 9 << 20
