"""Shared helpers of the Python package's tests."""

import pytest
import torch

import remat


def step_peak(step) -> int:
    """Peak bytes of CPU memory allocated during `step()` above what was live before it, as
    remat's CPU tracker counts them (every allocation through LibTorch's CPU allocator)."""
    return remat._C.peak_during(step, "cpu")


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
