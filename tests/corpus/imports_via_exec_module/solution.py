"""Known bad: imports a module by running its code itself (``find_spec`` + ``exec_module``).

``importlib`` is not on the import list, so it is taken from ``torch.importlib`` (an attribute,
no import). ``PathFinder.find_spec`` finds the standard library's ``colorsys`` (not on the list
either) without asking the import system by name, and ``exec_module`` runs its code into a module
object of the entry's own: no import statement, no ``__import__``, no finder call that the import
watch wraps. The guard sees the module's code run outside the import system (an ``exec`` audit
event whose code is a module's top level, with no ``_load_unlocked`` frame of the import system
above it, asked for from the submission's file). Expected: rule_broken, forbidden-import.
"""

import torch

from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:forbidden-import"

_machinery = torch.importlib.machinery
_spec = _machinery.PathFinder.find_spec("colorsys")
_module = torch.importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

__all__ = ["DilatedResidualBlock"]
