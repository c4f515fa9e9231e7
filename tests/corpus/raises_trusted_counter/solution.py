"""Known bad: switches the rule guard off through its "trusted" counter, from code named as torch's.

The guard ignores audit events while harness code reads its own files (``Guard.trusted()``, a
counter). This entry compiles its helper under torch's own file name, so every rule that asks
"whose frame is this?" (the introspection rule among them) takes the helper for torch; the
helper walks the frames up to the harness (``sys._getframe``, ``sys`` taken from ``torch.sys``
without an import) and raises the counter by a million: from then on no audit event of the
process is checked. It then imports ``inspect``, which the import list forbids, and runs the
naive control. Before issue 37 one integer silenced the guard for the rest of the process. Now
code compiled under a file name whose contents it is not is a finding by itself
(``foreign-code-name``), and the guard's switches are checked at every step boundary
(``guard-tampered``). Expected: rule_broken, foreign-code-name or guard-tampered.
"""

import torch

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:foreign-code-name|guard-tampered"

_SOURCE = """
def silence():
    frame = torch.sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        guard = getattr(owner, "guard", None)
        if guard is not None and hasattr(guard, "_trusted"):
            guard._trusted += 1_000_000
            return True
        frame = frame.f_back
    return False
"""
_NAMESPACE = {"torch": torch}
exec(compile(_SOURCE, torch.__file__, "exec"), _NAMESPACE)


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        if _NAMESPACE["silence"]():
            __import__("inspect")
        return super().forward(x)
