"""Modules loaded from a file path rather than imported by name: the bench scripts (not a
package) and test files whose frames must carry their own file name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(path: Path, name: str, *, register: bool = False) -> ModuleType:
    """The module in ``path``, executed under ``name``.

    Args:
        path: The file.
        name: The module's name.
        register: Also put it in ``sys.modules`` under ``name`` before it runs (a module whose
            dataclasses look their module up there needs it).
    """
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path} as {name}"
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


__all__ = ["load_module"]
