"""rotor's ``rotor.models``: the networks of torchvision, as they come.

rotor shipped its own copies of torchvision's ResNet, VGG, Inception and DenseNet, rewritten
as sequences of stages. remat needs no rewrite: ``remat.Checkpointable`` captures and splits
any model (docs/python.md, "Any model"), so ``remat.models.resnet18()`` is torchvision's own
``resnet18()``, and rotor's complete example runs with ``import remat as rotor``::

    net = remat.models.resnet18()
    chk = remat.Checkpointable(net)
    chk.measure(sample)
    chk.compute_sequence(mem_limit=700 * 1024 * 1024)

Every model builder of ``torchvision.models`` is here by the same name (torchvision is needed).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    try:
        import torchvision.models
    except ImportError as error:
        raise ImportError(f"remat.models.{name} is torchvision's: install torchvision "
                          "(pip install torchvision)") from error
    try:
        return getattr(torchvision.models, name)
    except AttributeError:
        raise AttributeError(f"remat.models has no {name!r}: it has torchvision.models' "
                             "builders (resnet18, vgg16, inception_v3, densenet121, ...)") from None


def __dir__() -> list:
    try:
        import torchvision.models
    except ImportError:
        return []
    return sorted(n for n in dir(torchvision.models) if not n.startswith("_"))
