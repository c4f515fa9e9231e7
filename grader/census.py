"""Judges the census of a step (CONTRACT §2, §6): trusted, parent side; pure functions of a summary.

The child's census (`grader.child.census`) sends, per read, the profiler's raw events and the
steps marked; `grader.census_trace` builds here, in the parent, one summary per step: every
dispatcher op with its input shapes and the custom op and ``torch.autograd.Function`` around it,
and on a GPU every kernel with the op it was launched under. Here that summary is held against the
rule that the convolution and the normalization run in the workspace's own Triton kernels, forward
and backward, inside an autograd.Function, while the MLP may stay in PyTorch:

(a) no PyTorch convolution, normalization or variance op anywhere in the step, nested inside a
    custom op or an autograd.Function included (`FORBIDDEN_OPS`);
(b) no reduction over an activation-sized tensor (`is_reduction`): the MLP needs none;
(c) no matrix product over an activation-sized operand whose problem dims are not the MLP's
    (`gemm_dims`): the MLP's six GEMMs have dims that are a permutation of (M, C, H) with
    M = batch·length, C = channels, H = expansion·channels; anything else ((B, L·C, 1),
    (M, C, 1)...) is a sum done as a product; and no more of them than the MLP runs
    (`MLP_GEMMS`: two forward, four backward);
(d) inside the submission's own autograd.Function ranges, only allocation, views, copies, casts
    and fills (`FUNCTION_SAFE_OPS`) on activation-sized tensors, and, in totals, PyTorch
    arithmetic there touches less than one activation's worth of elements per step
    (`function_arithmetic`: each op's largest input, summed over the step's innermost
    arithmetic ops; an arithmetic op on a list of tensors, whose shapes are not recorded, is
    found on its own): the conv and the norm's arithmetic must be Triton's, however finely it is
    chunked (per example, per row: each chunk is below the activation, their sum is not);
(e) on a GPU: no PyTorch/cuDNN convolution or normalization kernel; every library kernel
    (PyTorch's, cuBLAS's...) matched to a recorded op of the step (`match_kernels`): its own
    when kineto links it to one, else a distinct recorded op of its kind that launched nothing
    linked and is large enough for the kernel's grid; a kernel nothing recorded accounts for is
    an op hidden from the census (``redispatch``, a native thread); no activation-sized copy to
    the host (its bytes read from the op that copied); and at least one kernel that is not
    PyTorch's or a library's (a Triton kernel) in every step;
and the census's own tamper evidence (`census-tampered`): a step whose profiler range is missing,
forged (its nonce does not match the commitment sent before the step), empty although it
returned (a step that raised may have run nothing), or whose profiler was stopped, restarted or
switched off; a step announced but never reported; an item that reported no step at all.

Sizes: a tensor is activation-sized when it has at least batch·length·channels elements. Rules
(b)-(d) and the host-copy rule stay silent (rule (a) and the kernel rules always apply) where
honest designs hold tensors as large as the activation: below `MIN_ACTIVATION` elements (the
weights are as large), and below `MIN_LENGTH` positions per example (per-program partials of the
conv taps' gradient, 3·C values for each of at least one program per example, are as large:
the reference sums such partials with ``aten.sum``, 1152 values at B=3, L=1, C=128). Such steps
are launch-bound; nothing done in PyTorch there makes a timed shape faster.

The totals' threshold, one activation: a normalization's statistics alone read every element of
the activation once (a per-example sum of the chunks is exactly one activation), so any PyTorch
share of the norm's statistics or of its application reaches it. Honest Functions do
weight-sized arithmetic: the reference's sum of the taps' per-program partials, (B·group, 3, C),
is 3/L of the activation at one program per example (0.75 at L = `MIN_LENGTH`, measured on its
CI and test shapes: 0.02-0.75), and rule (b) already keeps each such sum below one activation.
"""

from __future__ import annotations

import hashlib
import math
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from grader.census_trace import (
    MAX_EVENTS,
    KernelRecord,
    OpRecord,
    RawEvent,
    StepSummary,
    parse_rows,
    summarize,
)
from grader.child.census import FORBIDDEN_OPS, MARKER_PREFIX, NONCE_SEPARATOR, REDUCTION_OPS
from grader.report import RuleFinding, Severity

TORCH_OP_ON_PATH = "torch-op-on-path"
NO_TRITON_KERNEL = "no-triton-kernel"
CENSUS_TAMPERED = "census-tampered"
HOST_COPY = "host-copy"

# The op lists the child's rule guard needs too live with the child's census (grader/child/ imports
# nothing of the parent's): `FORBIDDEN_OPS`, `REDUCTION_OPS`.
_REDUCTION_FAMILY = re.compile(
    r"(^|_)(sum|nansum|mean|nanmean|prod|norm|var|std|softmax|logsumexp|cumsum|cumprod|"
    r"logcumsumexp|amax|amin|aminmax|dist|cdist|pdist|avg_pool\dd|max_pool\dd|lp_pool\dd|loss|"
    r"bincount|histc|histogram|trace|col2im)(_|\d|$)"
    r"|scatter_(add|reduce)|index_(add|reduce)|segment_reduce|embedding_bag|cosine_similarity|"
    r"pairwise_distance|^renorm_?$"
)

# Matrix products: dims read from the operands (`gemm_dims`); `_COMPOSITE_GEMMS` run one of the
# others inside (recorded too), so only the others count towards `MLP_GEMMS`.
_GEMM_FAMILY = re.compile(
    r"(mm|mv|dot|addr|ger|outer|inner|matmul|linear|einsum|tensordot|bilinear|attention|"
    r"linear_combination)(_|\d|$)"
)
_COMPOSITE_GEMMS = frozenset(
    {"matmul", "linear", "einsum", "tensordot", "chain_matmul", "linalg_multi_dot", "inner",
     "linalg_vecdot", "linalg_matmul", "bilinear"}
)  # fmt: skip
# Products that are never one of the MLP's: weighted sums by construction.
_NEVER_MLP = re.compile(r"attention|bilinear|linear_combination")
# The MLP's matrix products over activation-sized operands, by the step's kind (its label's
# prefix): fc1 and fc2 forward; each layer's input and weight gradients backward; both for a step
# that marks a whole training step. A count, not only dims: y^T (C, M) @ P (M, H), with P
# selecting each example's rows, sums every example per channel with dims (C, M, H), the MLP's.
MLP_GEMMS = {"forward": 2, "backward": 4}
MLP_GEMMS_PER_STEP = 6

# What may touch an activation-sized tensor inside the submission's autograd.Function: memory,
# not arithmetic (the Triton interpreter itself allocates, sets and copies its arguments).
FUNCTION_SAFE_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
        "new_empty_strided", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones",
        "full", "full_like", "new_full", "scalar_tensor",
        "fill_", "fill", "zero_", "masked_fill", "masked_fill_",
        "view", "view_as", "reshape", "reshape_as", "_reshape_alias", "_unsafe_view",
        "as_strided", "as_strided_", "expand", "expand_as", "permute", "transpose",
        "transpose_", "t", "t_", "unsqueeze", "unsqueeze_", "squeeze", "squeeze_", "flatten",
        "unflatten", "narrow", "slice", "select", "split", "split_with_sizes", "chunk",
        "unbind", "movedim", "moveaxis", "swapaxes", "alias", "detach", "detach_", "lift_fresh",
        "unfold", "contiguous", "resolve_conj", "resolve_neg",
        "copy_", "clone", "to", "_to_copy", "_copy_from", "_copy_from_and_resize", "type_as",
        "cat", "stack", "constant_pad_nd", "pad", "flip", "roll", "index_select", "gather",
        "narrow_copy", "repeat", "tile", "set_", "resize_", "resize_as_", "record_stream",
        "item", "_local_scalar_dense", "is_nonzero", "_has_compatible_shallow_copy_type",
    }
)  # fmt: skip

MIN_ACTIVATION = 256
MIN_LENGTH = 4

# GPU kernel names. Library kernels (PyTorch's, cuBLAS's, cuDNN's, CUTLASS's) are C++ names or
# carry a vendor prefix; a Triton kernel is its Python function's plain name.
_LIBRARY_KERNEL = re.compile(
    r"::|<|\(|^void |^(sm\d+_|ampere_|volta_|turing_|maxwell_|hopper_|blackwell_|cutlass|nvjet|"
    r"xmma|cublas|cudnn|Memcpy|Memset)", re.IGNORECASE,
)  # fmt: skip
_CONV_NORM_KERNEL = re.compile(
    r"cudnn|conv(?!ert)|fprop|dgrad|wgrad|(layer|group|batch|instance|rms)_?norm|"
    r"RowwiseMoments|ComputeFusedParams|GammaBeta", re.IGNORECASE,
)  # fmt: skip
# Library kernels that reduce or multiply: fine under an op the census judged, a hidden op's
# work when no op was recorded above them.
_SUM_KERNEL = re.compile(r"reduce|welford|gemm|gemv|dot_kernel|nvjet|xmma|cutlass|scan",
                         re.IGNORECASE)  # fmt: skip
# The ops that launch a library matrix product themselves (linear, matmul, einsum... call one of
# these, so counting them too would count one product several times).
_LEAF_GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
                         "_addmm_activation", "_int_mm", "_scaled_mm"})
# Of those, the ones a matrix product launches (cuBLASLt's split-K reduction included).
_PRODUCT_KERNEL = re.compile(r"gemm|gemv|dot_kernel|nvjet|xmma|cutlass|splitKreduce",
                             re.IGNORECASE)  # fmt: skip


@dataclass(frozen=True)
class BlockDims:
    """What the rules need to know of the item a step ran.

    Attributes:
        batch: Examples per step.
        length: Positions per example.
        channels: C.
        expansion: The MLP's width factor (H = expansion·C).
    """

    batch: int
    length: int
    channels: int
    expansion: int

    @property
    def rows(self) -> int:
        return self.batch * self.length

    @property
    def hidden(self) -> int:
        return self.expansion * self.channels

    @property
    def activation(self) -> int:
        return self.rows * self.channels

    @property
    def mlp(self) -> tuple[int, int, int]:
        """The MLP's GEMM dims, sorted."""
        return _sorted((self.rows, self.channels, self.hidden))

    @classmethod
    def of_case(cls, case: Any) -> BlockDims:
        """From a `grader.config.Case`."""
        return cls(case.batch, case.length, case.channels, case.expansion)


@dataclass(frozen=True)
class CensusFinding:
    """One rule broken, as the census shows it."""

    rule: str
    message: str


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _split(name: str) -> tuple[str, str]:
    namespace, _, packet = name.partition("::")
    return namespace, packet.split(".")[0]


def is_reduction(packet: str) -> bool:
    """True for an aten op (overload packet name) that sums, averages or otherwise reduces."""
    return packet in REDUCTION_OPS or bool(_REDUCTION_FAMILY.search(packet))


def is_gemm(packet: str) -> bool:
    """True for a matrix-product aten op (mm, addmm, bmm, linear, einsum, attention...)."""
    return bool(_GEMM_FAMILY.search(packet)) and not packet.startswith("upsample")


def gemm_dims(packet: str, shapes: tuple[tuple[int, ...], ...]
              ) -> list[tuple[int, int, int]] | None:  # fmt: skip
    """The (m, k, n) problem dims a matrix product could be read as, sorted each; several when
    batch dims may fold into any of the three; None when they cannot be read from the shapes."""
    tensors = [s for s in shapes if s]
    if packet.startswith(("add", "baddbmm", "_addmm", "sspaddmm", "_sparse_addmm")):
        tensors = tensors[1:]  # the term added to the product
    if len(tensors) < 2:
        return None
    a, b = tensors[0], tensors[1]
    if packet in ("outer", "ger", "addr"):
        return [_sorted((_numel(a), 1, _numel(b)))]
    if packet == "linear":
        return [_sorted((_numel(a[:-1]), a[-1], b[0]))] if len(b) == 2 else None
    if len(a) == 1 and len(b) == 1:
        return [_sorted((1, a[0], 1))]
    if len(a) == 2 and len(b) == 1:
        return [_sorted((a[0], a[1], 1))]
    if len(a) == 1 and len(b) >= 2:
        return _folded(_numel(b[:-2]), (1, a[0], b[-1]))
    if len(a) > 2 and len(b) == 2:
        return [_sorted((_numel(a[:-1]), a[-1], b[-1]))]  # a batch of rows times one matrix
    if len(a) >= 2 and len(b) >= 2:
        batch = max(_numel(a[:-2]), _numel(b[:-2]))
        return _folded(batch, (a[-2], a[-1], b[-1]))
    return None


def _sorted(dims: tuple[int, int, int]) -> tuple[int, int, int]:
    return tuple(sorted(dims))  # type: ignore[return-value]


def _folded(batch: int, dims: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    m, k, n = dims
    return [_sorted((batch * m, k, n)), _sorted((m, batch * k, n)), _sorted((m, k, batch * n))]


def _where(op: OpRecord) -> str:
    parts = []
    if op.within:
        parts.append(f"inside custom op {op.within}")
    if op.function:
        parts.append(f"inside torch.autograd.Function {op.function}")
    return f" ({', '.join(parts)})" if parts else ""


def _shapes_text(op: OpRecord) -> str:
    return ", ".join(str(list(s)) for s in op.shapes if s) or "no tensors"


def judge_step(summary: StepSummary, dims: BlockDims | None, *, gpu: bool
               ) -> list[CensusFinding]:  # fmt: skip
    """Every rule of the module docstring on one step's summary (``dims`` None: the size rules
    stay silent; ``gpu``: the step ran on a GPU, so its kernels are judged)."""
    found: dict[tuple[str, str], None] = {}

    def add(rule: str, message: str) -> None:
        found[(rule, message)] = None

    step = summary.label
    for note in summary.tampered:
        add(CENSUS_TAMPERED, note)
    if not summary.marker and not summary.tampered:
        add(CENSUS_TAMPERED, f"the census found no range for step {step}")
    elif summary.marker and summary.events == 0 and not summary.raised:
        add(CENSUS_TAMPERED, f"the census recorded no events in step {step}, which returned")
    big = (dims is not None and dims.activation >= MIN_ACTIVATION
           and dims.length >= MIN_LENGTH)
    gemms = 0
    in_function = False  # an activation-sized op inside a Function was found on its own
    # Forbidden ops by where they ran: one conv is conv1d, convolution, _convolution and a
    # backend's op nested, one finding.
    forbidden: dict[str, dict[str, None]] = {}
    for op in summary.ops:
        namespace, packet = _split(op.name)
        if namespace not in ("aten", "prims"):
            continue  # a custom op: its implementation's ops are recorded inside it
        if packet in FORBIDDEN_OPS:
            forbidden.setdefault(_where(op), {})[f"{namespace}.{packet}"] = None
            continue
        if (op.function and op.lists and not op.composite and packet not in FUNCTION_SAFE_OPS
                and big):
            # On a GPU a _foreach_ op is one fused kernel over its list, whose shapes
            # RecordFunction does not record (on a CPU its per-tensor ops are recorded nested).
            add(TORCH_OP_ON_PATH,
                f"{namespace}.{packet} on a list of tensors inside torch.autograd.Function "
                f"{op.function} in {step}: its size cannot be read, and inside the conv+norm "
                "Function PyTorch may only allocate, view, copy and cast")  # fmt: skip
        largest = max((_numel(s) for s in op.shapes if s), default=0)
        if not big or dims is None or largest < dims.activation:
            continue
        flagged = False
        if is_reduction(packet):
            add(TORCH_OP_ON_PATH,
                f"{namespace}.{packet} reduced a tensor of {largest} elements (the activation "
                f"has {dims.activation}) in {step}{_where(op)}: the normalization must run in "
                "Triton")  # fmt: skip
            flagged = True
        elif is_gemm(packet):
            counted, flagged = _judge_gemm(add, op, packet, dims, step)
            gemms += counted
        if op.function and packet not in FUNCTION_SAFE_OPS and not flagged:
            in_function = True
            add(TORCH_OP_ON_PATH,
                f"{namespace}.{packet} on an activation-sized tensor ({_shapes_text(op)}) "
                f"inside torch.autograd.Function {op.function} in {step}: inside the conv+norm "
                "Function only allocation, views, copies and fills may touch the activation; "
                "its arithmetic must be the workspace's Triton")  # fmt: skip
    for where, names in forbidden.items():
        add(TORCH_OP_ON_PATH, f"PyTorch convolution/normalization ops ran in {step}{where}: "
                              f"{', '.join(names)}")
    if big and dims is not None and not in_function:
        total, by_function = function_arithmetic(summary.ops)
        if total >= dims.activation:
            names = ", ".join(f"{f} {n}" for f, n in sorted(by_function.items()))
            add(TORCH_OP_ON_PATH,
                f"PyTorch arithmetic inside the submission's torch.autograd.Function(s) touched "
                f"{total} elements in {step} ({names}), at least the activation's {dims.activation}"
                ": inside the conv+norm Function PyTorch may only allocate, view, copy and cast, "
                "whatever the size of each op (chunks per example count in total); its "
                "arithmetic must be the workspace's Triton")  # fmt: skip
    kind = step.split(":", 1)[0]
    allowed = MLP_GEMMS.get(kind, MLP_GEMMS_PER_STEP)
    if gemms > allowed:
        add(TORCH_OP_ON_PATH,
            f"{gemms} matrix products over activation-sized operands in {step}; the MLP runs "
            f"{allowed} there: the others are sums done as products")  # fmt: skip
    if gpu and summary.kernels is not None:
        _judge_kernels(add, summary, dims, big)
    return [CensusFinding(rule, message) for rule, message in found]


def _judge_gemm(add: Any, op: OpRecord, packet: str, dims: BlockDims, step: str
                ) -> tuple[int, bool]:  # fmt: skip
    """Rule (c) on one activation-sized matrix product: how many of it count towards the MLP's
    products, and whether it was found."""
    if _NEVER_MLP.search(packet):
        add(TORCH_OP_ON_PATH,
            f"aten.{packet} over an activation-sized operand ({_shapes_text(op)}) in {step}"
            f"{_where(op)}: a weighted sum done as a product")  # fmt: skip
        return op.count, True
    candidates = gemm_dims(packet, op.shapes)
    flagged = candidates is not None and dims.mlp not in candidates
    if flagged:
        m, c, h = dims.rows, dims.channels, dims.hidden
        add(TORCH_OP_ON_PATH,
            f"aten.{packet} with operands {_shapes_text(op)} in {step}{_where(op)}: its dims "
            f"{list(candidates[0])} are not the MLP's (M={m}, C={c}, H={h}); a product over the "
            "activation with other dims is a reduction done as a matrix product")  # fmt: skip
    counted = 0 if packet in _COMPOSITE_GEMMS or candidates is None else op.count
    return counted, flagged


def function_arithmetic(ops: Iterable[OpRecord]) -> tuple[int, dict[str, int]]:
    """Rule (d)'s totals: the elements PyTorch arithmetic touched inside custom
    autograd.Functions (each op's largest input, times how often; composite ops, whose nested
    arithmetic is counted itself, and memory ops do not count), and the same per Function."""
    by_function: dict[str, int] = {}
    for op in ops:
        namespace, packet = _split(op.name)
        if (not op.function or namespace not in ("aten", "prims") or op.composite
                or packet in FUNCTION_SAFE_OPS or packet in FORBIDDEN_OPS):
            continue
        largest = max((_numel(s) for s in op.shapes if s), default=1)
        by_function[op.function] = by_function.get(op.function, 0) + largest * op.count
    return sum(by_function.values()), by_function


def is_library_kernel(name: str) -> bool:
    """Whether a kernel's name is PyTorch's or a library's (cuBLAS, cuDNN, CUTLASS), not one a
    submission compiled (a Triton kernel's name is its Python function's)."""
    return bool(_LIBRARY_KERNEL.search(name))


def _kernel_kind(name: str) -> str:
    if _PRODUCT_KERNEL.search(name):
        return "product"
    return "reduction" if _SUM_KERNEL.search(name) else "other"


def _op_kind(packet: str) -> str:
    if packet in _LEAF_GEMMS:
        return "product"
    return "reduction" if is_reduction(packet) else "other"


# How many library kernels one recorded op may account for: a matrix product two (one cuBLASLt
# call launches a GEMM and its split-K reduction, or two GEMMs, its main tiles' and its tail's:
# ``nvjet_*_128x288_*_badd`` and ``nvjet_*_64x8_*_badd`` for one bf16 ``addmm`` on an H100,
# 2026-12-06; on torch 2.11 with CUDA 13 kineto links some of them, 1 per step for the plain
# block on the H200 of 2026-12-01), any other op one. A linked kernel uses one of them.
_CAPACITY = {"product": 2, "reduction": 1, "other": 1}
# The memory ops of `FUNCTION_SAFE_OPS` that launch a kernel of their own (a fill, a copy, a
# gather), not through another recorded op: where kineto links none of their kernels (the first
# launch of a step often goes unlinked: conv+norm's zeroed counters, ``aten::fill_`` in the
# scoring reference's forward on an H100, 2026-12-06), each still accounts for one. The others
# (views, allocations, ``zeros`` around its ``fill_``) launch nothing themselves: a hidden kernel
# is never theirs.
KERNEL_SAFE_OPS = frozenset({"fill_", "fill", "masked_fill_", "copy_", "_copy_from",
                             "index_select", "gather", "flip", "roll", "narrow_copy"})
# Grids up to this many blocks are matched by kind and count only for products: cuBLAS's
# persistent kernels launch waves of the GPU's SMs (132 on an H200) whatever the problem's size,
# so a small product may launch more blocks than it has elements. PyTorch's own kernels
# (TensorIterator, reductions) launch no block without elements, which the size test uses.
PERSISTENT_GRID_BLOCKS = 1024


def match_kernels(summary: StepSummary) -> list[KernelRecord]:
    """Rule (e)'s one-to-one matching: the library kernels of ``summary`` that no recorded op
    accounts for (each with the count left unmatched).

    A kernel kineto links to a recorded op is that op's. Every other library kernel needs a
    distinct recorded aten op of the step of its kind (a product kernel a leaf matrix product, a
    reduction kernel a reduction, any other kernel any arithmetic op or a memory op that launches
    its own kernel, `KERNEL_SAFE_OPS`) that (1) launched no kernel linked to it (an op whose
    kernels are all seen is accounted for: a decoy ``x[:1].sum()`` launches its own, linked, so
    it buys nothing; a product with one kernel linked may still account for one more, its
    split-K reduction or its tail's GEMM), (2) is large enough: where CUPTI's record gives the
    kernel's grid, the op's inputs hold at least one element per thread block (PyTorch's kernels
    launch no block without work; a one-element op launches one block), except for products of
    up to `PERSISTENT_GRID_BLOCKS` blocks. Matched greedily, the largest kernels first to the
    largest ops (with capacities per op, `_CAPACITY`)."""
    # Per kind, one entry per recorded op that may still account for a kernel:
    # [elements of its inputs, kernels it may still account for].
    free: dict[str, list[list[int]]] = {"product": [], "reduction": [], "other": []}
    for op in summary.ops:
        namespace, packet = _split(op.name)
        if (namespace not in ("aten", "prims") or op.composite
                or (packet in FUNCTION_SAFE_OPS and packet not in KERNEL_SAFE_OPS)):
            continue
        size = sum(_numel(s) for s in op.shapes if s) or 1
        kind = _op_kind(packet)
        for index in range(op.count):
            if index >= op.launched:
                free[kind].append([size, _CAPACITY[kind]])
            elif kind == "product":
                # One of its kernels is linked to it; the other (a split-K reduction, the tail's
                # GEMM) may still come unlinked.
                free[kind].append([size, _CAPACITY[kind] - 1])
    for ops in free.values():
        ops.sort(key=lambda entry: -entry[0])
    unmatched: list[KernelRecord] = []
    pending = [k for k in summary.kernels or ()
               if is_library_kernel(k.name) and not k.launched_by
               and not _CONV_NORM_KERNEL.search(k.name)]  # fmt: skip
    for kernel in sorted(pending, key=lambda k: -k.blocks):
        kind = _kernel_kind(kernel.name)
        # cuBLAS's persistent GEMMs launch a grid of the GPU's size whatever the problem's.
        any_size = kind == "product" and kernel.blocks <= PERSISTENT_GRID_BLOCKS
        left = kernel.count
        for entry in free[kind]:
            fits = any_size or entry[0] >= kernel.blocks
            while left and entry[1] and fits:
                entry[1] -= 1
                left -= 1
            if not left:
                break
        if left:
            unmatched.append(KernelRecord(kernel.name, "", left, kernel.blocks))
    return unmatched


def _judge_kernels(add: Any, summary: StepSummary, dims: BlockDims | None, big: bool) -> None:
    """Rule (e): the step's GPU kernels and its copies to the host."""
    step = summary.label
    kernels = summary.kernels or ()
    own = [k for k in kernels if not is_library_kernel(k.name)]
    for k in kernels:
        if is_library_kernel(k.name) and _CONV_NORM_KERNEL.search(k.name):
            add(TORCH_OP_ON_PATH,
                f"the PyTorch/cuDNN convolution or normalization kernel {k.name[:160]!r} ran "
                f"{k.count}x in {step}")  # fmt: skip
    unmatched = match_kernels(summary)
    if unmatched:
        names = ", ".join(f"{k.name[:100]!r} ×{k.count}"
                          + (f" ({k.blocks} blocks)" if k.blocks else "")
                          for k in unmatched[:3])  # fmt: skip
        add(TORCH_OP_ON_PATH,
            f"library kernels that no recorded PyTorch op of {step} accounts for ran there "
            f"({names}): each library kernel needs an op of its kind and size, one to one; an "
            "op hidden from the census (record_function switched off, a direct redispatch to "
            "the backend, a native thread)")  # fmt: skip
    if not own:
        add(NO_TRITON_KERNEL,
            f"every kernel of {step} is PyTorch's or a library's "
            f"({sorted({k.name[:60] for k in kernels})[:5]}): no Triton kernel ran")
    if big and dims is not None and summary.host_copy_bytes >= dims.activation:
        add(HOST_COPY,
            f"{summary.host_copy_bytes} bytes went from the GPU to the host in {step} (the "
            f"activation has {dims.activation} elements): the conv or the norm computed off "
            "the GPU")  # fmt: skip


# ----------------------------------------------------------------------------- the ledger


@dataclass
class CensusLedger:
    """The parent's record of the steps a child announced (label → SHA-256 of the nonce of the
    step's range) until each one's summary settles it."""

    open: dict[str, str] = field(default_factory=dict)
    settled_in_item: int = 0
    # The raw events of the child's current read (`judge_message`'s ``events`` messages), from
    # which each ``step`` message's summary is built; ``cut``: more came than `MAX_EVENTS`.
    events: list[RawEvent] = field(default_factory=list)
    cut: bool = False
    # Steps stay open until the harness collects: the gate's after each item, the timing
    # harness's at each audit (`grader.interleave`); `close_item` then finds any left open.

    def announce(self, label: str, commit: str) -> list[CensusFinding]:
        """A step is about to run. A label announced twice is tampering."""
        findings: list[CensusFinding] = []
        if label in self.open:
            findings.append(CensusFinding(CENSUS_TAMPERED, f"step {label} was announced twice"))
        if not re.fullmatch(r"[0-9a-f]{64}", commit):
            findings.append(CensusFinding(CENSUS_TAMPERED,
                                          f"step {label} was announced with no valid commitment"))
        else:
            self.open[label] = commit
        return findings

    def settle(self, summary: StepSummary) -> list[CensusFinding]:
        """A step's summary arrived: its range must carry the nonce committed to."""
        commit = self.open.pop(summary.label, None)
        if commit is None:
            return [CensusFinding(CENSUS_TAMPERED,
                                  f"a census summary for step {summary.label}, which was never "
                                  "announced")]  # fmt: skip
        self.settled_in_item += 1
        if not summary.marker:
            return []  # judge_step reports the missing range
        head, _, nonce = summary.marker.rpartition(NONCE_SEPARATOR)
        if head != f"{MARKER_PREFIX}{summary.label}" or (
            hashlib.sha256(nonce.encode()).hexdigest() != commit
        ):
            return [CensusFinding(CENSUS_TAMPERED,
                                  f"the range of step {summary.label} is not the one the harness "
                                  "opened (its nonce does not match): the profiler was restarted "
                                  "and the range forged")]  # fmt: skip
        return []

    def close_item(self, item: str) -> list[CensusFinding]:
        """An item ended (``item_done``): every step it announced must have been reported, and it
        must have reported one at least (a forward always runs). A harness whose census messages
        are dropped on their way out (its channel writer wrapped) is caught only here."""
        findings = self.unsettled()
        if not self.settled_in_item:
            findings.append(CensusFinding(CENSUS_TAMPERED,
                                          f"item {item} ended with no census of any step"))
        self.settled_in_item = 0
        return findings

    def unsettled(self) -> list[CensusFinding]:
        """Findings for every announced step with no summary; forgets them."""
        findings = [CensusFinding(CENSUS_TAMPERED,
                                  f"no census summary came for step {label}")
                    for label in self.open]  # fmt: skip
        self.open.clear()
        return findings


_LEDGERS: weakref.WeakKeyDictionary[Any, CensusLedger] = weakref.WeakKeyDictionary()


def ledger_for(owner: Any) -> CensusLedger:
    """The ledger of one conversation with a child (kept as long as ``owner`` lives)."""
    ledger = _LEDGERS.get(owner)
    if ledger is None:
        ledger = _LEDGERS[owner] = CensusLedger()
    return ledger


def judge_message(message: dict[str, Any], dims: BlockDims | None, ledger: CensusLedger, *,
                  gpu: bool, rules: bool = True) -> list[CensusFinding]:  # fmt: skip
    """One ``census`` channel message: an announcement (``label``, ``commit``), raw events of a
    read (``events``, ``first``: the read's first, which starts a new one), or a step of that read
    (``step``: ``label``, ``raised``, ``notes``), whose summary is built here from the read's
    events (`grader.census_trace.summarize`) and judged with ``dims``. A malformed message is
    tampering. ``rules`` false: a step of the harness's own block (its ops are PyTorch's by
    design), kept in the ledger, not judged."""
    if "events" in message:
        try:
            events = parse_rows(message["events"])
            first = message.get("first")
            if not isinstance(first, bool):
                raise ValueError(f"'first' is {first!r:.40}, not true or false")
        except ValueError as exc:
            return [CensusFinding(CENSUS_TAMPERED, f"malformed census events: {exc}")]
        if first:
            ledger.events, ledger.cut = [], False
        room = MAX_EVENTS - len(ledger.events)
        ledger.cut = ledger.cut or len(events) > room
        ledger.events.extend(events[:max(room, 0)])
        return []
    if "step" not in message:
        label, commit = message.get("label"), message.get("commit")
        if not isinstance(label, str) or not isinstance(commit, str):
            return [CensusFinding(CENSUS_TAMPERED, f"a malformed census message: {message!r:.200}")]
        return ledger.announce(label, commit)
    step = message["step"]
    label = step.get("label") if isinstance(step, dict) else None
    raised = step.get("raised") if isinstance(step, dict) else None
    notes = step.get("notes") if isinstance(step, dict) else None
    if (not isinstance(label, str) or not isinstance(raised, bool) or not isinstance(notes, list)
            or not all(isinstance(n, str) for n in notes)):
        return [CensusFinding(CENSUS_TAMPERED, f"a malformed census step: {step!r:.200}")]
    if ledger.cut:
        notes = [*notes, f"the read of step {label} brought more than {MAX_EVENTS} events"]
    summary = summarize(label, raised, tuple(notes), ledger.events, cuda=gpu,
                        safe=FUNCTION_SAFE_OPS)  # fmt: skip
    return [*ledger.settle(summary), *(judge_step(summary, dims, gpu=gpu) if rules else ())]


def is_step(message: dict[str, Any]) -> bool:
    """Whether a ``census`` message reports a step (its dims are needed now, and no more)."""
    return "step" in message


def message_label(message: dict[str, Any]) -> str:
    """The step a ``census`` message is about (for the findings' phase), ``?`` if it says none."""
    step = message.get("step")
    label = step.get("label") if isinstance(step, dict) else message.get("label")
    return label if isinstance(label, str) else "?"


def rule_findings(findings: Iterable[CensusFinding], phase: str) -> list[RuleFinding]:
    """As the report's run-time violations, seen in ``phase``."""
    return [RuleFinding(rule=f.rule, severity=Severity.VIOLATION, source="runtime",
                        message=f.message, phase=phase) for f in findings]  # fmt: skip


def rules(findings: Iterable[CensusFinding]) -> set[str]:
    """The rule names among ``findings`` (for tests and reports)."""
    return {f.rule for f in findings}


__all__ = [
    "CENSUS_TAMPERED",
    "FORBIDDEN_OPS",
    "FUNCTION_SAFE_OPS",
    "HOST_COPY",
    "MLP_GEMMS",
    "MIN_ACTIVATION",
    "MIN_LENGTH",
    "NO_TRITON_KERNEL",
    "PERSISTENT_GRID_BLOCKS",
    "REDUCTION_OPS",
    "TORCH_OP_ON_PATH",
    "BlockDims",
    "CensusFinding",
    "CensusLedger",
    "function_arithmetic",
    "gemm_dims",
    "is_gemm",
    "is_step",
    "is_reduction",
    "judge_message",
    "judge_step",
    "ledger_for",
    "match_kernels",
    "message_label",
    "rule_findings",
]
