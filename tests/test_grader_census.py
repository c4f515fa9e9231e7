"""The op and kernel census: the parent's rules on summaries (pure, fast), the ledger, and the
child's census on real steps in a subprocess (CPU, small shapes; the GPU kernel path on a GPU)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from census_fakes import Trace

from grader.census import (
    CENSUS_TAMPERED,
    HOST_COPY,
    MIN_LENGTH,
    NO_TRITON_KERNEL,
    TORCH_OP_ON_PATH,
    BlockDims,
    CensusLedger,
    gemm_dims,
    is_reduction,
    judge_message,
    judge_step,
    rules,
)
from grader.census_trace import KernelRecord, OpRecord, StepSummary
from grader.child.census import MARKER_PREFIX

REPO = Path(__file__).resolve().parent.parent
DIMS = BlockDims(batch=2, length=64, channels=8, expansion=2)  # M 128, C 8, H 16, activation 1024
M, C, H = DIMS.rows, DIMS.channels, DIMS.hidden
X = (2, 64, 8)


def op(name: str, *shapes: tuple[int, ...], function: str = "", within: str = "",
       count: int = 1) -> OpRecord:  # fmt: skip
    return OpRecord(name, tuple(shapes), function, within, count)


def summary(label: str, *ops: OpRecord, kernels: tuple[KernelRecord, ...] | None = None,
            host_copy_bytes: int = 0, tampered: tuple[str, ...] = (), marker: str | None = None,
            events: int = 50, raised: bool = False) -> StepSummary:  # fmt: skip
    return StepSummary(label=label, marker=f"{MARKER_PREFIX}{label}#00" if marker is None else marker,
                       device="cpu" if kernels is None else "cuda", events=events,
                       raised=raised, ops=ops,
                       functions=("_ConvNorm",), kernels=kernels, host_copy_bytes=host_copy_bytes,
                       tampered=tampered)  # fmt: skip


# The honest step: allocation and copies inside the Function, the MLP in PyTorch outside.
HONEST_FORWARD = (
    op("aten::empty", (), (), function="_ConvNorm", count=3),
    op("aten::copy_", X, X, (), function="_ConvNorm"),
    op("aten::set_", (0,), function="_ConvNorm", count=9),
    op("aten::linear", X, (H, C), ()),
    op("aten::matmul", X, (C, H)),
    op("aten::mm", (M, C), (C, H)),
    op("aten::gelu", (2, 64, H), ()),
    op("aten::mm", (M, H), (H, C)),
    op("aten::mul", X, ()),
    op("aten::add", X, X, ()),
)
HONEST_BACKWARD = (
    op("aten::mm", (M, C), (C, H)),
    op("aten::mm", (C, M), (M, H)),
    op("aten::gelu_backward", (2, 64, H), (2, 64, H), ()),
    op("aten::mm", (M, H), (H, C)),
    op("aten::mm", (H, M), (M, C)),
    op("aten::copy_", X, X, (), function="_ConvNormBackward"),
    op("aten::sum", (16, 24), (), (), function="_ConvNormBackward"),  # dw partials: weight-sized
)


def test_an_honest_step_has_no_finding() -> None:
    assert judge_step(summary("forward:c", *HONEST_FORWARD), DIMS, gpu=False) == []
    assert judge_step(summary("backward:c", *HONEST_BACKWARD), DIMS, gpu=False) == []


def test_forbidden_ops_are_found_nested_in_custom_ops_and_functions() -> None:
    found = judge_step(summary("forward:c",
                               op("aten::conv1d", X, (C, 1, 3), within="lib::conv_norm",
                                  function="_F"),
                               op("aten::_convolution", X, (C, 1, 3), within="lib::conv_norm",
                                  function="_F"),
                               op("aten::var_mean", X, (2, 64, 1))), DIMS, gpu=False)  # fmt: skip
    assert rules(found) == {TORCH_OP_ON_PATH}
    texts = sorted(f.message for f in found)
    assert len(texts) == 2, texts  # one finding per place, nested conv ops together
    assert any("inside custom op lib::conv_norm" in t and "aten.conv1d, aten._convolution" in t
               for t in texts), texts  # fmt: skip


def test_reductions_over_the_activation_are_found_small_ones_are_not() -> None:
    big = judge_step(summary("backward:c", op("aten::mse_loss", X, X, ())), DIMS, gpu=False)
    assert rules(big) == {TORCH_OP_ON_PATH}
    assert "1024 elements" in big[0].message
    small = judge_step(summary("backward:c", op("aten::sum", (2, 64), ())), DIMS, gpu=False)
    assert small == []
    tiny = BlockDims(batch=1, length=2, channels=3, expansion=2)
    assert judge_step(summary("forward:c", op("aten::sum", (1, 2, 3), ())), tiny, gpu=False) == []


def test_tap_gradient_partials_at_a_few_positions_per_example_are_not_the_activation() -> None:
    """The reference's backward sums per-program partials of the conv taps' gradient, (B·group,
    3, C), inside its Function: at L=1 that is three times the activation (seen on an H200 at
    B=3, L=1, C=128); from `MIN_LENGTH` positions on a sum over the activation's size is
    judged, inside the Function or not."""
    def judged(length: int, shape: tuple[int, ...]) -> set[str]:
        dims = BlockDims(batch=3, length=length, channels=128, expansion=4)
        step = summary("backward:c", op("aten::sum", shape, (), function="ConvNormFunction"))
        return rules(judge_step(step, dims, gpu=False))

    # (B·group, 3, C), one program per example: 3·B·C values, the activation B·L·C.
    assert judged(1, (3, 3, 128)) == set() and judged(MIN_LENGTH - 1, (3, 3, 128)) == set()
    assert judged(MIN_LENGTH, (3, MIN_LENGTH, 128)) == {TORCH_OP_ON_PATH}



@pytest.mark.parametrize("shapes", [((2, 512), (512, 1)), ((M, C), (C, 1)), ((1, M), (M, C)),
                                    ((2, 1, 512), (2, 512, 1))])  # fmt: skip
def test_products_with_other_dims_than_the_mlps_are_reductions(shapes: tuple) -> None:
    name = "aten::bmm" if len(shapes[0]) == 3 else "aten::mm"
    found = judge_step(summary("forward:c", op(name, *shapes)), DIMS, gpu=False)
    assert rules(found) == {TORCH_OP_ON_PATH}
    assert "not the MLP's" in found[0].message


def test_more_products_than_the_mlp_runs_are_found_even_with_its_dims() -> None:
    # y^T (C, M) @ P (M, H): a per-example sum with the MLP's dims; two of them in a forward.
    disguised = (op("aten::mm", (C, M), (M, H), count=2),)
    found = judge_step(summary("forward:c", *HONEST_FORWARD, *disguised), DIMS, gpu=False)
    assert [f.rule for f in found] == [TORCH_OP_ON_PATH]
    assert "4 matrix products" in found[0].message
    assert judge_step(summary("backward:c", *HONEST_BACKWARD), DIMS, gpu=False) == []


def test_only_memory_ops_touch_the_activation_inside_a_function() -> None:
    found = judge_step(summary("forward:c", op("aten::add", X, X, (), function="_ConvNorm"),
                               op("aten::mul", (C,), (), function="_ConvNorm")),
                       DIMS, gpu=False)  # fmt: skip
    assert rules(found) == {TORCH_OP_ON_PATH}
    assert len(found) == 1 and "aten.add" in found[0].message and "_ConvNorm" in found[0].message


def test_gemm_dims() -> None:
    assert gemm_dims("mm", ((M, C), (C, H))) == [(C, H, M)] * 3
    assert gemm_dims("addmm", ((H,), (M, C), (C, H)))[0] == (C, H, M)
    assert gemm_dims("linear", (X, (H, C), ())) == [(C, H, M)]
    assert gemm_dims("matmul", (X, (C, H))) == [(C, H, M)]
    assert (C, H, M) in gemm_dims("bmm", ((2, 64, C), (2, C, H)))
    assert gemm_dims("mv", ((M, C), (C,))) == [(1, C, M)]
    assert gemm_dims("dot", ((M,), (M,))) == [(1, 1, M)]
    assert gemm_dims("outer", ((M,), (C,))) == [(1, C, M)]
    assert gemm_dims("einsum", ((), )) is None


def test_reduction_names() -> None:
    for name in ("sum", "mean", "var", "mse_loss", "scatter_add_", "index_add", "avg_pool1d",
                 "_log_softmax", "embedding_bag", "linalg_vector_norm", "cumsum", "col2im"):
        assert is_reduction(name), name
    for name in ("normal_", "gelu", "mm", "add", "copy_", "empty", "mul"):
        assert not is_reduction(name), name


def test_gpu_kernels() -> None:
    triton = KernelRecord("_conv_fwd", "", 1)
    gemm = KernelRecord("ampere_sgemm_128x64_nn", "aten::mm", 2)
    summed = KernelRecord("void at::native::reduce_kernel<512, 1, ReduceOp<float>>()", "aten::sum", 1)
    assert judge_step(summary("forward:c", kernels=(triton, gemm, summed)), DIMS, gpu=True) == []
    cudnn = KernelRecord("void cudnn::engines_precompiled::conv2d_grouped_direct_kernel<float>()",
                         "aten::cudnn_convolution", 1)  # fmt: skip
    hidden = KernelRecord("void at::native::reduce_kernel<512, 1, WelfordOps<float>>()", "", 1)
    found = judge_step(summary("forward:c", kernels=(triton, cudnn, hidden)), DIMS, gpu=True)
    assert rules(found) == {TORCH_OP_ON_PATH} and len(found) == 2
    assert any("no recorded PyTorch op of forward:c accounts for" in f.message for f in found)
    # cuBLAS(Lt) on torch 2.11 launches some GEMMs (and their split-K reductions) where kineto
    # links no op: each matched to a recorded matrix product (two to one: a GEMM, its split-K).
    unlinked = (KernelRecord("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT", "", 1),
                KernelRecord("void cublasLt::splitKreduce_kernel<32, 16, int>()", "", 1))
    mm = op("aten::mm", (M, C), (C, H))
    assert judge_step(summary("forward:c", mm, kernels=(triton, *unlinked)), DIMS,
                      gpu=True) == []
    extra = (*unlinked, KernelRecord("ampere_sgemm_32x32_nn", "", 1))
    found = judge_step(summary("forward:c", mm, kernels=(triton, *extra)), DIMS, gpu=True)
    assert rules(found) == {TORCH_OP_ON_PATH}
    assert "'ampere_sgemm_32x32_nn' ×1" in found[0].message
    # One cuBLASLt call may launch two GEMMs, its main tiles' and its tail's (a bf16 addmm on an
    # H100): one linked, the other is the same op's; a third is not.
    addmm = dataclasses.replace(op("aten::addmm", (M, C), (M, H), (H, C)), launched=1)
    main = KernelRecord("nvjet_sm90_tst_128x288_64x4_1x2_h_badd_coopA_TNT", "aten::addmm", 1)
    tail = KernelRecord("nvjet_sm90_tst_64x8_64x16_2x4_h_badd_TNT", "", 1)
    assert judge_step(summary("forward:c", addmm, kernels=(triton, main, tail)), DIMS,
                      gpu=True) == []
    found = judge_step(summary("forward:c", addmm, kernels=(triton, main, dataclasses.replace(
        tail, count=2))), DIMS, gpu=True)  # fmt: skip
    assert rules(found) == {TORCH_OP_ON_PATH} and "×1" in found[0].message
    # A fill kineto did not link (conv+norm's zeroed counters, the first launch of a step) is
    # its recorded ``fill_``'s; a view or an allocation launches nothing, so it accounts for none.
    fill = KernelRecord("void at::native::vectorized_elementwise_kernel<4, "
                        "at::native::FillFunctor<int>, std::array<char*, 1ul> >()", "", 1, 1)
    filled = op("aten::fill_", (5,), ())
    assert judge_step(summary("forward:c", op("aten::zeros", (), ()), op("aten::zero_", (5,)),
                              filled, kernels=(triton, fill)), DIMS, gpu=True) == []
    for cover in (op("aten::view", X, ()), op("aten::zeros", (), ()), op("aten::empty", ())):
        found = judge_step(summary("forward:c", cover, kernels=(triton, fill)), DIMS, gpu=True)
        assert rules(found) == {TORCH_OP_ON_PATH}, cover
    # One fill accounts for one kernel: a second, hidden, is still unmatched.
    found = judge_step(summary("forward:c", filled, kernels=(triton, dataclasses.replace(
        fill, count=2))), DIMS, gpu=True)  # fmt: skip
    assert rules(found) == {TORCH_OP_ON_PATH} and "×1" in found[0].message
    none = judge_step(summary("forward:c", kernels=(gemm,)), DIMS, gpu=True)
    assert rules(none) == {NO_TRITON_KERNEL}
    copied = judge_step(summary("forward:c", kernels=(triton,), host_copy_bytes=4096), DIMS,
                        gpu=True)  # fmt: skip
    assert rules(copied) == {HOST_COPY}
    # On a CPU grade the kernel rules are silent (nothing recorded kernels).
    assert judge_step(summary("forward:c", kernels=(gemm,)), DIMS, gpu=False) == []


def test_the_census_own_evidence_is_a_finding() -> None:
    for tampered in (summary("forward:c", tampered=("the census's profiler was found stopped",)),
                     summary("forward:c", marker=""), summary("forward:c", events=0)):
        assert rules(judge_step(tampered, DIMS, gpu=False)) == {CENSUS_TAMPERED}
    # A step that raised at once ran nothing: that is a crash, not tampering.
    assert judge_step(summary("forward:c", events=0, raised=True), DIMS, gpu=False) == []


def _commit(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest()


def test_the_ledger_matches_each_summary_to_its_announcement() -> None:
    ledger = CensusLedger()
    assert ledger.announce("forward:c", _commit("abc")) == []
    good = summary("forward:c", marker=f"{MARKER_PREFIX}forward:c#abc")
    assert ledger.settle(good) == []
    assert ledger.announce("backward:c", _commit("abc")) == []
    forged = summary("backward:c", marker=f"{MARKER_PREFIX}backward:c#forged")
    assert rules(ledger.settle(forged)) == {CENSUS_TAMPERED}
    assert rules(ledger.settle(good)) == {CENSUS_TAMPERED}  # never announced (again)
    # Steps stay open until the harness collects (an item's end, an audit); then both count.
    assert ledger.announce("forward:d", _commit("x")) == []
    assert ledger.announce("backward:d", _commit("y")) == []
    assert rules(ledger.announce("backward:d", _commit("z"))) == {CENSUS_TAMPERED}  # twice
    assert len(ledger.close_item("d")) == 2
    assert ledger.unsettled() == []


def test_messages_of_raw_events_build_the_summary_and_garbage_is_tampering() -> None:
    trace = Trace()
    with trace.step("forward:c#1", "abc"), trace.function("_ConvNorm"):
        trace.op("aten::empty", (), ())
        trace.op("aten::add", X, X, ())
    ledger = CensusLedger()
    announce = {"event": "census", "label": "forward:c#1", "commit": _commit("abc")}
    assert judge_message(announce, DIMS, ledger, gpu=False) == []
    events, step = trace.messages("forward:c#1")
    assert judge_message(events, DIMS, ledger, gpu=False) == []
    found = judge_message(step, DIMS, ledger, gpu=False)
    assert rules(found) == {TORCH_OP_ON_PATH} and any("aten.add" in f.message for f in found)
    row = events["events"][0]
    for bad in ({"step": {"label": 3}}, {"step": "x"}, {"label": "a"},
                {"step": {"label": "a", "raised": False, "notes": [1]}},
                {"events": [row[:12]], "first": True}, {"events": [row], "first": 1},
                {"events": [[*row[:8], [[-1]], *row[9:]]], "first": True}):
        assert rules(judge_message(bad, DIMS, ledger, gpu=False)) == {CENSUS_TAMPERED}, bad


# ----------------------------------------------------------------------------- the child census

_CHILD = textwrap.dedent('''
    import importlib.util, json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    import torch
    import torch.nn.functional as F
    from grader.census import FUNCTION_SAFE_OPS, BlockDims, CensusLedger, judge_message
    from grader.census_trace import summarize
    from grader.child.census import Census

    spec = importlib.util.spec_from_file_location("naive_triton", sys.argv[2])
    naive_triton = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(naive_triton)

    device = torch.device(sys.argv[3])
    gpu = device.type == "cuda"
    census = Census(device)
    census.start()
    collect = census.collect  # bound before any submission code, as the harnesses do
    # The pools and autograd's device thread (its first backward starts it), as the harness's
    # warm-up makes them: on an H200 a census test without the backward here saw that thread
    # appear at its first step.
    (torch.ones(1 << 20, device=device, requires_grad=True) + 1).sum().backward()
    threads = len(os.listdir("/proc/self/task"))
    dims = BlockDims(2, 64, 8, 2)
    ledger = CensusLedger()
    out = {}

    def step(label, fn, read=None):
        mark = census.mark(label)
        found = judge_message({"label": label, "commit": mark.commit}, dims, ledger, gpu=gpu)
        with mark:
            fn()
        for message in (read or collect)():
            found += judge_message(json.loads(json.dumps(message)), dims, ledger, gpu=gpu)
        built = summarize(label, False, (), ledger.events, cuda=gpu, safe=FUNCTION_SAFE_OPS)
        out["kernels:" + label] = [k.name for k in built.kernels or ()]
        out[label] = sorted({f.rule + ": " + f.message for f in found})

    torch.manual_seed(0)
    block = naive_triton.DilatedResidualBlock(8, dilation=2).to(device)
    x = torch.randn(2, 64, 8, device=device, requires_grad=True)
    res = {}
    step("forward:honest", lambda: res.update(out=block(x)))
    step("backward:honest", lambda: res["out"].backward(torch.randn_like(res["out"])))

    @torch.library.custom_op("census_test::stats", mutates_args=())
    def stats(y: torch.Tensor) -> torch.Tensor:
        return torch.var(y, dim=(1, 2))
    step("forward:custom-op", lambda: stats(x.detach()))

    def excluded():
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
        with torch._C._ExcludeDispatchKeyGuard(keys), torch._C._DisableTorchDispatch():
            F.conv1d(x.detach().transpose(1, 2), block.conv.weight.detach(), groups=8)
    step("forward:below-python", excluded)

    def silenced():
        torch.autograd._enable_record_function(False)
        torch.var(x.detach())
        torch.autograd._enable_record_function(True)
    step("forward:silenced", silenced)

    step("forward:stopped", lambda: torch.autograd._disable_profiler())

    def forged():
        torch.autograd._disable_profiler()
        census._enable()
        with torch.autograd.profiler.record_function("grader.step:forward:forged#0"):
            torch.ones(3, device=device) + 1
    step("forward:forged", forged)
    # Before the threaded step: a joined thread may linger in /proc for a moment.
    out["threads"] = [threads, len(os.listdir("/proc/self/task"))]

    def threaded():
        t = threading.Thread(target=lambda: torch.var(x.detach()))
        t.start()
        t.join()
        torch.ones(3, device=device) + 1  # the step's own thread does something
    step("forward:thread", threaded)

    # Class 6 of issue 37: the census's summarising replaced on its class by a forger that
    # reports clean steps (here: drops every raw event, and a summariser that forges nothing).
    original = Census.collect
    Census.collect = lambda self, read=True: [m for m in original(self, read) if "events" not in m]
    Census._summarize = lambda self, *args: None

    class ChunkedNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            out = torch.empty_like(y)
            for b in range(y.shape[0]):  # per example: each op below the activation
                centred = y[b] - y[b].mean()
                out[b] = centred * torch.rsqrt(centred.pow(2).mean() + 1e-5)
            return out

    step("forward:forger", lambda: ChunkedNorm.apply(x.detach()))
    step("forward:forger-called", lambda: ChunkedNorm.apply(x.detach()), read=census.collect)
    census.stop()
    print(json.dumps(out))
''')


def _run_child(device: str) -> dict[str, list[str]]:
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    naive = REPO / "tests" / "corpus" / "naive_triton" / "solution.py"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(REPO), str(naive), device],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def child_census() -> dict[str, list[str]]:
    return _run_child("cpu")


def test_child_census_honest_triton_steps_pass(child_census: dict[str, list[str]]) -> None:
    assert child_census["forward:honest"] == []
    assert child_census["backward:honest"] == []


def test_child_census_sees_inside_custom_ops_and_below_python_dispatch(
    child_census: dict[str, list[str]],
) -> None:
    assert any("aten.var" in f and "census_test::stats" in f
               for f in child_census["forward:custom-op"]), child_census["forward:custom-op"]
    assert any("aten.conv1d" in f for f in child_census["forward:below-python"])


def test_child_census_refuses_the_silent_switch(child_census: dict[str, list[str]]) -> None:
    found = child_census["forward:silenced"]
    assert any(f.startswith(CENSUS_TAMPERED) and "_enable_record_function" in f for f in found)
    assert any(f.startswith(TORCH_OP_ON_PATH) and "aten.var" in f for f in found)


def test_child_census_stopped_or_forged_profiler_is_tampering(
    child_census: dict[str, list[str]],
) -> None:
    assert any(f.startswith(CENSUS_TAMPERED) and "found stopped" in f
               for f in child_census["forward:stopped"]), child_census["forward:stopped"]
    forged = child_census["forward:forged"]
    assert forged and all(f.startswith(CENSUS_TAMPERED) for f in forged), forged


def test_child_census_blind_spot_threads_and_no_threads_of_its_own(
    child_census: dict[str, list[str]],
) -> None:
    # A thread's ops are invisible to the profiler's thread-local callbacks (the guard's
    # new-thread rule covers threads); this pins that down so a change is noticed.
    assert child_census["forward:thread"] == []
    before, after = child_census["threads"]
    assert after == before, "the census's restarts must not start threads after start()"


def test_child_census_forged_summaries_change_nothing_the_parent_sees(
    child_census: dict[str, list[str]],
) -> None:
    """The summaries are built in the parent from the raw events: a forger on the census class
    is not what the harness calls (its method is bound before the submission exists), and a
    forger that is called and drops the events leaves the step's range missing."""
    found = child_census["forward:forger"]
    assert any(f.startswith(TORCH_OP_ON_PATH) and "ChunkedNorm" in f and "touched" in f
               for f in found), found  # fmt: skip
    called = child_census["forward:forger-called"]
    assert any(f.startswith(CENSUS_TAMPERED) and "missing" in f for f in called), called


_REFERENCE_CHILD = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from grader.census import BlockDims, CensusLedger, judge_message
    import importlib
    from grader.child.census import Census

    module, name = sys.argv[3].split(":")
    DilatedResidualBlock = getattr(importlib.import_module(module), name)
    device = torch.device(sys.argv[2])
    gpu = device.type == "cuda"
    census = Census(device)
    census.start()
    out = {}
    # 4096 values an example (c1, c2 from the MLP), 136 (the two-pass backward), and W1
    # (8192 values) larger than the activation (4096).
    for batch, length, channels in ((2, 512, 8), (2, 17, 8), (1, 64, 64)):
        dims = BlockDims(batch, length, channels, 2)
        ledger = CensusLedger()
        torch.manual_seed(0)
        block = DilatedResidualBlock(channels, dilation=3).to(device)
        x = torch.randn(batch, length, channels, device=device, requires_grad=True)
        res = {}
        for label, fn in ((f"forward:l{length}", lambda: res.update(out=block(x))),
                          (f"backward:l{length}",
                           lambda: res["out"].backward(torch.randn_like(res["out"])))):
            mark = census.mark(label)
            found = judge_message({"label": label, "commit": mark.commit}, dims, ledger, gpu=gpu)
            with mark:
                fn()
            for message in census.collect():
                found += judge_message(json.loads(json.dumps(message)), dims, ledger, gpu=gpu)
            out[label] = sorted({f.rule + ": " + f.message for f in found})
    census.stop()
    print(json.dumps(out))
''')


@pytest.mark.parametrize("block", ["reference.block:DilatedResidualBlock",
                                   "reference.ceiling:CeilingBlock"])
def test_the_reference_block_keeps_the_rules(block: str) -> None:
    """The reference's steps under the census pass the rules a submission must keep (CONTRACT §2),
    the scoring block's and the ceiling's: for the ceiling, with c1 and c2 from the MLP (`reference.norm_grad`, examples of 4096 values) its GELU runs
    inside an autograd.Function, where no PyTorch arithmetic may touch an activation, and no
    PyTorch reduction may cover a tensor as large as the activation (fc1's weight is, when
    B·L ≤ 2C); and the two-pass backward of a short example."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _REFERENCE_CHILD, str(REPO), "cpu", block],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {f"{way}:l{length}" for way in ("forward", "backward")
                        for length in (512, 17, 64)}, out
    assert all(found == [] for found in out.values()), out


@pytest.mark.gpu
def test_child_census_on_a_gpu() -> None:
    """The kernel path: the honest Triton steps pass with their kernels judged; PyTorch's conv and
    variance are seen (ops and kernels)."""
    out = _run_child("cuda")
    assert out["forward:honest"] == [] and out["backward:honest"] == [], out
    assert "_conv_fwd" in out["kernels:forward:honest"], out["kernels:forward:honest"]
    assert any("aten.conv1d" in f for f in out["forward:below-python"])
    assert any("aten.var" in f for f in out["forward:custom-op"])
    before, after = out["threads"]
    assert after == before, "CUPTI's threads must all exist once the census has started"


def test_an_item_must_report_its_census() -> None:
    ledger = CensusLedger()
    assert rules(ledger.close_item("c#1")) == {CENSUS_TAMPERED}  # nothing reported at all
    ledger.announce("forward:c#1", _commit("n"))
    ledger.settle(summary("forward:c#1", marker=f"{MARKER_PREFIX}forward:c#1#n"))
    ledger.announce("backward:c#1", _commit("m"))
    assert [f.message for f in ledger.close_item("c#1")] == [
        "no census summary came for step backward:c#1"]
    ledger.announce("forward:c#2", _commit("n"))
    ledger.settle(summary("forward:c#2", marker=f"{MARKER_PREFIX}forward:c#2#n"))
    assert ledger.close_item("c#2") == []
