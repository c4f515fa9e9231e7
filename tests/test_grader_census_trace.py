"""The census's summaries built in the parent from raw profiler records (`grader.census_trace`)
and the rules that judge them in totals (issue 37, classes 5 and 6): arithmetic chunked below the
activation inside a Function, one-element decoys that bought a kernel budget, a library kernel
no recorded op accounts for, copies to the host whose byte count torch does not give.

No GPU: kernel and copy records are fakes in the profiler's format (tests/census_fakes.py)."""

from __future__ import annotations

import hashlib

from census_fakes import FakeKinetoEvent, FakeResult, Trace

from grader.census import (
    FUNCTION_SAFE_OPS,
    HOST_COPY,
    TORCH_OP_ON_PATH,
    BlockDims,
    CensusFinding,
    CensusLedger,
    function_arithmetic,
    judge_message,
    rules,
)
from grader.census_trace import parse_rows, summarize
from grader.child.census import MARKER_PREFIX, _chunks, _rows

DIMS = BlockDims(batch=2, length=64, channels=8, expansion=2)  # activation 1024
X = (2, 64, 8)
EXAMPLE = (64, 8)  # one example's chunk: x[b]
REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>>, unsigned int, float, 4, 4>>(T3)"  # noqa: E501


def judged(trace: Trace, label: str = "forward:c", *, gpu: bool = False) -> list[CensusFinding]:
    """``trace``'s messages through the parent, as a conversation would judge them."""
    ledger = CensusLedger()
    found = ledger.announce(label, hashlib.sha256(b"n0").hexdigest())
    for message in trace.messages(label):
        found += judge_message(message, DIMS, ledger, gpu=gpu)
    return found


def test_norm_arithmetic_chunked_per_example_inside_a_function_is_found() -> None:
    """Each op on one example (512 elements) is below the activation (1024); the step's total is
    not. On the per-op census this passed with no finding."""
    trace = Trace()
    with trace.step("forward:c"), trace.function("_ChunkedNorm"):
        trace.op("aten::empty_like", X)
        for _ in range(DIMS.batch):
            trace.op("aten::sum", EXAMPLE, ())
            trace.op("aten::sub", EXAMPLE, ())
            trace.op("aten::mul", EXAMPLE, EXAMPLE)
            trace.op("aten::copy_", EXAMPLE, EXAMPLE)  # a copy: memory, not counted
    found = judged(trace)
    assert rules(found) == {TORCH_OP_ON_PATH}, found
    assert "touched 3072 elements" in found[0].message and "_ChunkedNorm 3072" in found[0].message


def test_chunks_are_counted_once_and_weight_sized_work_stays_below() -> None:
    """A composite op (mean = sum, then a division) counts through its nested arithmetic, not
    twice; the reference's partials of the taps' gradient, (B, 3, C), are far below."""
    trace = Trace()
    with trace.step("backward:c"), trace.backward("_ConvNormBackward"):
        with trace.composite("aten::mean", EXAMPLE):
            trace.op("aten::sum", EXAMPLE)
            trace.op("aten::div_", (1,), ())
        trace.op("aten::sum", (2, 3, 8), ())
    summary = summarize("backward:c", False, (), parse_rows(trace.rows), cuda=False,
                        safe=FUNCTION_SAFE_OPS)  # fmt: skip
    assert function_arithmetic(summary.ops) == (512 + 1 + 48, {"_ConvNormBackward": 561})
    assert judged(trace, "backward:c") == []


def test_arithmetic_on_tensor_lists_inside_a_function_is_found() -> None:
    """RecordFunction records no shapes for a TensorList: on a GPU ``_foreach_mul`` over the
    examples is one op of unreadable size (on a CPU its per-tensor muls are recorded inside)."""
    trace = Trace()
    with trace.step("forward:c"), trace.function("_ListNorm"):
        with trace._range("aten::_foreach_mul", "cpu_op", shapes=((), ()),
                          dtypes=("TensorList", "Scalar")):  # fmt: skip
            pass
        with trace._range("aten::cat", "cpu_op", shapes=((), ()),
                          dtypes=("TensorList", "Scalar")):  # fmt: skip
            pass
    found = judged(trace)
    assert rules(found) == {TORCH_OP_ON_PATH} and len(found) == 1, found
    assert "aten._foreach_mul on a list of tensors" in found[0].message


def test_one_element_decoys_buy_no_kernel_for_a_hidden_reduction() -> None:
    """The old budget let each recorded reduction account for two unlinked library reductions:
    five ``x[:1].sum()`` decoys bought ten. Each decoy launched its own, linked, kernel: none is
    left for the redispatched sum's kernel."""
    trace = Trace()
    with trace.step("forward:c"):
        for _ in range(5):
            decoy = trace.op("aten::sum", (1,))
            trace.kernel(REDUCE, linked=decoy, grid=(1, 1, 1))
        trace.kernel("_normalize")  # the submission's Triton
        trace.kernel(REDUCE, grid=(8, 1, 1))  # OpOverload.redispatch: no op recorded
    found = judged(trace, gpu=True)
    assert rules(found) == {TORCH_OP_ON_PATH}, found
    assert "no recorded PyTorch op of forward:c accounts for" in found[0].message
    assert "(8 blocks)" in found[0].message


def test_decoys_that_launch_nothing_are_too_small_for_the_kernel_grid() -> None:
    """A decoy on a host tensor launches no kernel; where CUPTI gives the grid, one element
    cannot account for eight blocks. An op as large as the kernel's grid can (kineto's unlinked
    cuBLAS kernels on torch 2.11)."""
    trace = Trace()
    with trace.step("forward:c"):
        trace.op("aten::sum", (1,))
        trace.kernel("_normalize")
        trace.kernel(REDUCE, grid=(8, 1, 1))
    assert rules(judged(trace, gpu=True)) == {TORCH_OP_ON_PATH}
    honest = Trace()
    with honest.step("forward:c"):
        honest.op("aten::mm", (128, 8), (8, 16))
        honest.kernel("_normalize")
        honest.kernel("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT", grid=(2, 1, 1))
        honest.kernel("void cublasLt::splitKreduce_kernel<32, 16, int>()", grid=(1, 1, 1))
    assert judged(honest, gpu=True) == []


def test_a_linked_product_accounts_for_one_more_kernel_only() -> None:
    """cuBLASLt's GEMM linked to its ``aten::mm``, its split-K reduction or its tail's GEMM not
    (torch 2.11; two GEMMs for one bf16 addmm on an H100): that op accounts for one of them, not
    for two; a persistent GEMM's grid (the GPU's SMs) may exceed a small product's elements."""
    def step(*unlinked: tuple[str, int]) -> list[CensusFinding]:
        trace = Trace()
        with trace.step("forward:c"):
            mm = trace.op("aten::mm", (4, 3), (3, 6))
            trace.kernel("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT", linked=mm, grid=(132, 1, 1))
            for name, blocks in unlinked:
                trace.kernel(name, grid=(blocks, 1, 1))
            trace.kernel("_normalize")
        return judged(trace, gpu=True)

    assert step(("void cublasLt::splitKreduce_kernel<32, 16, int>()", 1)) == []
    assert step(("nvjet_sm90_tst_64x8_64x16_2x4_h_badd_TNT", 132)) == []
    assert rules(step(("nvjet_sm90_tst_64x8_64x16_2x4_h_badd_TNT", 132),
                      ("void cublasLt::splitKreduce_kernel<32, 16, int>()", 1))) == {TORCH_OP_ON_PATH}


def test_a_library_kernel_no_recorded_op_launched_breaks_the_rule() -> None:
    """Not only reductions and products: any library kernel needs an op (an elementwise
    redispatch too); linked kernels are their ops'."""
    trace = Trace()
    with trace.step("forward:c"):
        add = trace.op("aten::add", X, X)
        trace.kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>()",
                     linked=add)  # fmt: skip
        trace.kernel("_normalize")
        trace.kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>()")
    found = judged(trace, gpu=True)
    assert rules(found) == {TORCH_OP_ON_PATH}, found
    assert "MulFunctor" in found[0].message and "AddFunctor" not in found[0].message


def test_a_kernel_linked_straight_to_a_custom_op_needs_an_aten_op() -> None:
    """A decoy custom op whose Python implementation redispatches a sum: its kernel links to the
    custom op's range, which launches nothing itself; its implementation's own ops have their
    own kernels, so nothing accounts for it."""
    trace = Trace()
    with trace.step("forward:c"):
        with trace.composite("decoy::tiny", (1,)) as custom:
            decoy = trace.op("aten::sum", (1,))
            trace.kernel(REDUCE, linked=decoy, grid=(1, 1, 1))
            trace.kernel(REDUCE, linked=custom, grid=(8, 1, 1))
        trace.kernel("_normalize")
    found = judged(trace, gpu=True)
    assert rules(found) == {TORCH_OP_ON_PATH} and "(8 blocks)" in found[0].message, found


def _copy_trace(metadata: str) -> Trace:
    trace = Trace()
    with trace.step("forward:c"):
        trace.kernel("_normalize")
        with trace.composite("aten::to", X):
            with trace.composite("aten::_to_copy", X):
                copy = trace.op("aten::copy_", X, X)
                trace.device("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", copy, metadata)
    return trace


def test_the_host_copy_rule_reads_the_bytes_from_the_op() -> None:
    """torch 2.11's kineto events (the grading image's) carry no byte count: the old rule read
    ``nbytes`` there and got 0. The copy's bytes come from the op that launched it (4096 bytes
    of fp32 here), with CUPTI's metadata where a torch hands it out."""
    for metadata in ("", '"bytes": 4096, "memory bandwidth (GB/s)": 2.1'):
        found = judged(_copy_trace(metadata), gpu=True)
        assert rules(found) == {HOST_COPY}, (metadata, found)
        assert found[0].message.startswith("4096 bytes went from the GPU to the host")


def _fake_events(modern: bool) -> FakeResult:
    """One step with a copy to the host, as torch 2.13 (``modern``) or 2.11 hands it out."""
    label = f"{MARKER_PREFIX}forward:c#n0"
    return FakeResult([
        FakeKinetoEvent(label, cpu=True, start=100, duration=900, kind="user_annotation",
                        correlation=1, modern=modern),
        FakeKinetoEvent("aten::copy_", cpu=True, start=200, duration=100, kind="cpu_op",
                        shapes=[[2, 64, 8], [2, 64, 8]], dtypes=["float", "float"],
                        correlation=2, modern=modern),
        FakeKinetoEvent("_normalize", cpu=False, start=150, duration=10, kind="kernel",
                        linked=1, modern=modern),
        FakeKinetoEvent("Memcpy DtoH (Device -> Pageable)", cpu=False, start=250, duration=10,
                        kind="gpu_memcpy", linked=2, modern=modern),
    ])  # fmt: skip


def test_the_childs_rows_from_both_torch_versions_keep_the_host_copy() -> None:
    """The child's reading (`_rows`) of kineto events shaped like torch 2.11's (no activity
    type, no metadata) and 2.13's: the same rows, and the copy found from the op."""
    for modern in (False, True):
        rows = _rows(_fake_events(modern))
        assert [r[1] for r in rows] == ["user_annotation", "cpu_op", "kernel", "gpu_memcpy"]
        summary = summarize("forward:c", False, (), parse_rows(rows), cuda=True,
                            safe=FUNCTION_SAFE_OPS)  # fmt: skip
        assert summary.host_copy_bytes == 4096, modern
        assert [k.name for k in summary.kernels or ()] == ["_normalize"]


def test_rows_go_in_messages_a_frame_holds() -> None:
    rows = [["aten::add", "cpu_op", True, i, i + 1, 1, 0, -1, [[4096]], ["float"], i, 0, ""]
            for i in range(20_000)]  # fmt: skip
    chunks = _chunks(rows)
    assert len(chunks) > 1 and sum(len(c) for c in chunks) == len(rows)
    assert _chunks([]) == [[]]
