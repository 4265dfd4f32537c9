"""remat: train deep networks in less memory.

remat keeps only some of a chain's activations for the backward pass and recomputes the
others, choosing which with a dynamic program that is optimal for a budget in bytes. The
measured peak never exceeds the budget. The solver, profiler and runtime are the C++ library's
(``remat._C``); this package gives them rotor's API::

    import remat
    model = remat.Checkpointable(torch.nn.Sequential(...), budget="700MiB")
    loss = model(x).sum()   # the first call in training mode measures and solves
    loss.backward()

See docs/python.md.
"""

import torch  # loads LibTorch before the extension that links it

from . import _C, models
from ._api import (
    Chain,
    Link,
    Solution,
    Tradeoff,
    keep_freed_memory,
    measure_link,
    parse_budget,
    peak_during,
    profile,
    solve,
    tradeoff,
)
from ._checkpointable import Checkpointable, checkpoint_sequential
from ._graph import CaptureError
from ._model import ModelCheckpointable

__all__ = [
    "CaptureError",
    "Chain",
    "Checkpointable",
    "Link",
    "ModelCheckpointable",
    "Solution",
    "Tradeoff",
    "checkpoint_sequential",
    "keep_freed_memory",
    "measure_link",
    "parse_budget",
    "peak_during",
    "profile",
    "solve",
    "tradeoff",
]
__version__ = "0.1.0"
