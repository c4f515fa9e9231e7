"""Known bad: installs a global nn.Module forward hook at import, one that does nothing visible.

A global module hook runs inside every module's call in the process, the baselines' too; in a
grader that timed plain PyTorch beside the submission, the same hook could sleep only when the
module is not the submission's (tests/corpus_timing/slows_baselines_via_autograd_hook does so with
autograd's saved-tensor hooks). This one returns None and changes no number, so only the rule
guard's snapshot of global state (nn.Module's ``_global_forward_hooks`` table) can tell.
Expected: rule_broken, global-state.
"""

import torch
from naive_triton import DilatedResidualBlock

EXPECTED = "fail:rule_broken:global-state"


def _watch(module, args, output):
    return None


torch.nn.modules.module.register_module_forward_hook(_watch)
__all__ = ["DilatedResidualBlock"]
