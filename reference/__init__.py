"""Reference implementation: fused Triton conv+norm (forward and backward) and the block on it.

Set ``TRITON_INTERPRET=1`` before importing this package to run the kernels on CPU tensors.
"""

from reference.plans import Plan, plan_for

__all__ = ["Plan", "plan_for"]
