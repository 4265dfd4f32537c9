"""Shared helpers of the Python package's tests."""

import copy
import os
import warnings
import weakref
from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import remat

# Deterministic cuBLAS for the CUDA tests: read when cuBLAS starts, so set before any test runs.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Blocks of exactly the rounded size on CUDA, for plain training as for remat, whose profiler
# turns them on at its first measurement anyway (remat::exact_cuda_blocks): torch reads the
# variable when it first configures its allocator, no earlier than the first CUDA use.
if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


# Whether the CUDA tests can run: a GPU, and remat built with CUDA.
CUDA_AVAILABLE = torch.cuda.is_available() and remat._C.WITH_CUDA
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason="no CUDA GPU, or remat built without CUDA")


@pytest.fixture
def deterministic():
    """Deterministic algorithms (cuDNN and cuBLAS: CUBLAS_WORKSPACE_CONFIG is set above, before
    cuBLAS starts) for the test, so that nondeterministic kernels do not hide a difference."""
    torch.use_deterministic_algorithms(True)
    benchmark, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, False
    yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = benchmark


def weighted_loss(out: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient differs for every output column: the sum of the squares of the
    output weighted from -1 to 1 along its last dimension."""
    return (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).square().sum()


def step_peak(step: Callable[[], Any]) -> int:
    """Peak bytes of CPU memory allocated during `step()` above what was live before it, as
    remat's CPU tracker counts them (every allocation through LibTorch's CPU allocator)."""
    return remat._C.peak_during(step, "cpu")


def cuda_step_peak(step: Callable[[], Any]) -> int:
    """Peak bytes of CUDA memory allocated during `step()` above what was live before it, by the
    caching allocator's own statistics (independent of remat's tracker)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


class _StoragePeak(TorchDispatchMode):
    """Counts the storages that operators create, from their creation to their release, and
    keeps the peak of their sum. Written for the tests, independently of remat's tracker: it
    sees every operator the step dispatches (Python, remat's C++ runtime and autograd's
    backward alike), and counts an output only if it is new memory: not a view, an in-place or
    out= result by the operator's schema, and not on the storage of an argument or of a tensor
    counted already (``_unsafe_view`` returns a view its schema does not declare). It does not
    see a kernel's scratch memory, which never becomes a tensor, so it counts the activations
    and may count less than the allocator does, never more."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs = []
        self._counted = {}  # data pointer -> bytes, of the live storages counted

    def _freed(self, pointer: int, nbytes: int, _ref: Any) -> None:
        self.live -= nbytes
        del self._counted[pointer]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        values = (out,) if len(returns) == 1 else tuple(out)
        arguments = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                     if isinstance(t, torch.Tensor)}
        for ret, value in zip(returns, values):
            if ret.alias_info is not None:
                continue  # a view of, or a write into, an argument
            for t in tree_flatten(value)[0]:
                if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                    continue
                storage = t.untyped_storage()
                pointer, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes == 0 or pointer in arguments or pointer in self._counted:
                    continue
                self._counted[pointer] = nbytes
                self._refs.append(weakref.ref(storage, lambda ref, p=pointer, n=nbytes: self._freed(p, n, ref)))
                self.live += nbytes
                self.peak = max(self.peak, self.live)
        return out


def assert_same_training(plain: nn.Module, ours: nn.Module) -> None:
    """Every parameter gradient and every buffer of `ours` equals `plain`'s, bit for bit."""
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), f"gradient of {name}"
    for (name, u), v in zip(plain.named_buffers(), ours.buffers()):
        assert torch.equal(u, v), f"buffer {name}"


def _autocast_enabled(device: str) -> bool:
    try:
        return torch.is_autocast_enabled(device)
    except TypeError:  # before torch 2.4: no device argument, a function for the CPU
        return torch.is_autocast_cpu_enabled() if device == "cpu" else torch.is_autocast_enabled()


def check_autocast_training(device: str, dtype: torch.dtype) -> None:
    """Two steps whose forward runs under torch.autocast(device, dtype) and whose backward does
    not, as torch's documentation has users write them, at the least budget: the output (in
    `dtype`), the gradients and the dropout masks equal plain autocast training's, so the
    recomputations ran in `dtype` too; nothing of autocast leaks into the caller's state."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Dropout(0.2), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 128), nn.LayerNorm(128), nn.Linear(128, 10)).to(device)
    ours = copy.deepcopy(plain)
    x = torch.randn(16, 32, device=device)
    chk = remat.Checkpointable(ours, progress=False)
    with torch.autocast(device, dtype=dtype):
        chk.measure(x)  # measured under autocast: the activations are in `dtype`
    solution = chk.compute_sequence(chk.min_budget())
    assert "Fn" in solution.sequence or "CF" in solution.sequence  # something is recomputed
    weights = torch.linspace(-1, 1, 10, device=device)
    for seed in (1, 2):
        outs = []
        for model in (plain, chk):
            torch.manual_seed(seed)
            with torch.autocast(device, dtype=dtype):
                out = model(x)
            assert out.dtype == dtype
            (out.float() * weights).square().mean().backward()
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        assert_same_training(plain, ours)
    assert not _autocast_enabled(device)


def _storages_keep_their_python_object() -> bool:
    t = torch.zeros(1)
    return t.untyped_storage() is t.untyped_storage()


# The count above needs one Python object per storage, alive while the storage is, to know when
# it is freed: torch 2.0 makes a new one at each untyped_storage() call (its weak references
# then tell nothing, and crashed CPython's garbage collector in a test that failed).
STORAGE_PEAK_AVAILABLE = _storages_keep_their_python_object()


def storage_peak(step: Callable[[], Any]) -> Optional[int]:
    """Peak bytes of the CPU tensor storages created during `step()` and alive at once, measured
    by the tests' own dispatch mode (not by remat's tracker). None, with a warning, where torch
    cannot give that count (STORAGE_PEAK_AVAILABLE); the step still runs."""
    if not STORAGE_PEAK_AVAILABLE:
        warnings.warn(f"torch {torch.__version__} gives each untyped_storage() call a new Python object: "
                      "the tests' independent count of live storages is left out")
        step()
        return None
    with _StoragePeak() as mode:
        step()
    return mode.peak


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes of a tensor's elements (Tensor.nbytes, which torch 2.0 lacks)."""
    return t.numel() * t.element_size()


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
