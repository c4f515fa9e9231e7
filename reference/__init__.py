"""Reference implementation: fused Triton conv+norm (forward and backward) and two blocks on it:
the scoring reference (`reference.block`, the MLP in PyTorch's ops; what a grade times) and the
ceiling (`reference.ceiling`, the whole-step block; information only).

Set ``TRITON_INTERPRET=1`` before importing this package to run the kernels on CPU tensors.
"""

from reference.plans import Plan, plan_for

__all__ = ["Plan", "plan_for"]
