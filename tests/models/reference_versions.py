"""Writes the installed versions of some Python packages to a file, only when they differ from
what it holds, so that the build writes the reference files again exactly when torch,
torchvision or transformers change (tests/CMakeLists.txt).

Usage: python3 reference_versions.py OUT_FILE PACKAGE...
"""
import importlib
import importlib.metadata
import os
import sys


def version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # a distribution without its metadata
        return getattr(importlib.import_module(package), "__version__", "unknown")


out, packages = sys.argv[1], sys.argv[2:]
text = "".join(f"{package} {version(package)}\n" for package in packages)
try:
    with open(out) as current:
        if current.read() == text:
            sys.exit(0)
except FileNotFoundError:
    pass
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out + ".tmp", "w") as new:
    new.write(text)
os.replace(out + ".tmp", out)
