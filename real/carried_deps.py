"""Python packages carried to a machine with no network, in ``.gpu_deps/`` at the checkout's root.

The H200 image has torch, Triton, numpy, pandas, pyarrow and pytest but not msgspec, which
kvsim's option schemas need (the validation section of ``real.gpu_check`` runs the simulator).
Nothing installs there, so its wheel is unpacked here beforehand (a wheel is a zip of the
package) and put on ``sys.path`` when the check starts; docs/real-backend.md has the command.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

CARRIED = Path(__file__).resolve().parent.parent / ".gpu_deps"
NEEDED = ("msgspec",)


def use_carried_deps(folder: Path = CARRIED) -> bool:
    """Put ``folder`` first on ``sys.path`` when it exists.

    Returns:
        whether it was added (idempotent: a second call adds nothing).
    """
    if not folder.is_dir():
        return False
    entry = str(folder)
    if entry in sys.path:
        return False
    sys.path.insert(0, entry)
    return True


def child_pythonpath(root: str, folder: Path = CARRIED) -> str:
    """``PYTHONPATH`` for a child Python started from the checkout at ``root``: the
    checkout, then ``folder`` when it exists (a child does not inherit this process's
    ``sys.path``, so without it every test that imports kvsim fails on msgspec)."""
    return os.pathsep.join([root, str(folder)] if folder.is_dir() else [root])


def missing_modules(names: tuple[str, ...] = NEEDED) -> list[str]:
    """The modules in ``names`` that cannot be imported here, neither installed nor carried."""
    return [name for name in names if importlib.util.find_spec(name) is None]
