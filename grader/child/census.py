"""The op and kernel census of a child process: what each marked step ran, below Python dispatch.

A ``TorchDispatchMode`` sees only what reaches the Python dispatch key: not the aten ops inside a
``torch.library`` custom op's implementation, not ops run under an excluded Python key, and its
presence is visible to the code it watches. The census uses RecordFunction instead, the
dispatcher's own observer, through the PyTorch profiler (kineto, CPU activity with input shapes,
plus CUPTI's kernels on a GPU). It sees every op that goes through the dispatcher, nested ones too,
whatever the dispatch keys, and the ranges PyTorch opens for custom ``torch.autograd.Function``s
(forward: the class name, from ``THPFunction_apply``; backward: the node ``<Name>Backward``).

Use (one per process, started before any submission code is imported)::

    census = Census(device)
    census.start()                      # always on from here
    mark = census.mark("forward:case")  # a fresh nonce; send mark.commit to the parent first
    with mark:                          # the step's range: 'grader.step:<label>#<nonce>'
        out = block(x)
    for summary in census.collect():    # at fixed points (between items): stop, read, restart
        send(summary.to_json())

Always on: the profiler runs from `Census.start` on, through the warm-up, the import and every
step, and `Census.collect` stops and restarts it at the same fixed points (the gate: between
items, every few items; timing: at every audit, in both processes), so nothing the submission can
observe tells one step from another (the kineto profiler hands out its events only when stopped;
a stop at fixed points is the price).

Tamper evidence, not tamper proof (the submission shares this process): the census reports in
`StepSummary.tampered` a profiler found stopped or restarted, a step's range missing or repeated,
and any call of the profiler switches that would silence it without stopping it
(`SILENT_SWITCHES`, replaced at `Census.start` by refusals that note the call); the parent
(`grader.census`) adds a step that returned with no events at all. The range's nonce exists only
inside the profiler once the step runs; the parent holds its SHA-256 (`Marker.commit`, sent
before the step), so a range forged after a restart does not match.

Blind spots, said plainly: an op run on a thread the submission starts (the profiler's callbacks
are thread-local; new threads are the guard's rule), a kernel called past RecordFunction through
``OpOverload.redispatch`` (on a GPU its kernel still shows, with no op above it), and work done
outside PyTorch (numpy on the host; on a GPU its copy to the host shows).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch._C._profiler import ProfilerState, _ExperimentalConfig
from torch.autograd import ProfilerActivity, ProfilerConfig

# aten ops (overload packet names) that are PyTorch convolutions, normalizations or variances.
FORBIDDEN_OPS = frozenset(
    {
        "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
        "convolution_backward", "_convolution_double_backward", "convolution_overrideable",
        "cudnn_convolution", "cudnn_convolution_transpose", "mkldnn_convolution",
        "miopen_convolution", "miopen_depthwise_convolution", "_conv_depthwise2d",
        "conv_depthwise3d", "slow_conv_dilated2d", "slow_conv_dilated3d", "_slow_conv2d_forward",
        "_slow_conv2d_backward", "slow_conv3d_forward", "thnn_conv2d",
        "_nnpack_spatial_convolution",
        "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
        "var", "var_mean", "std", "std_mean",
        "layer_norm", "native_layer_norm", "native_layer_norm_backward",
        "group_norm", "native_group_norm", "native_group_norm_backward",
        "batch_norm", "native_batch_norm", "native_batch_norm_backward", "_batch_norm_impl_index",
        "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "_batch_norm_with_update", "batch_norm_backward", "cudnn_batch_norm",
        "cudnn_batch_norm_backward", "miopen_batch_norm", "instance_norm", "rms_norm",
        "_fused_rms_norm", "_fused_rms_norm_backward",
    }
)  # fmt: skip

# Reductions that, over a tensor as large as the block's activation, are a normalization (or
# its backward) done in PyTorch. The MLP needs none: its weight gradients are matmuls.
# `is_reduction` adds the families of `_REDUCTION_FAMILY` (losses, pools, scatter-adds...).
REDUCTION_OPS = frozenset(
    {"sum", "mean", "nansum", "nanmean", "prod", "norm", "linalg_vector_norm", "logsumexp",
     "cumsum", "amax", "amin", "aminmax", "max", "min", "var", "std", "var_mean", "std_mean"}
)  # fmt: skip

MARKER_PREFIX = "grader.step:"
"""Every marked step is a profiler range named ``grader.step:<label>#<nonce>``."""
NONCE_SEPARATOR = "#"

SILENT_SWITCHES = ("_enable_record_function", "_toggle_collection_dynamic", "_clear_callbacks")
"""Profiler switches of ``torch._C._autograd`` that make RecordFunction skip ops (thread-locally,
or by removing its callbacks) while the profiler still looks on: nobody needs them in a training
step, so `Census.start` replaces every reference to them by a refusal."""

MAX_RECORDS = 4000
"""Distinct op records per step beyond which a summary is cut (a frame holds at most 1 MiB)."""

# Kineto's clock and time.time_ns() agree to microseconds; a restart is seen only outside this.
_TRACE_START_SLACK_NS = 2_000_000

_SCOPE_FUNCTION = int(torch._C._profiler.RecordScope.FUNCTION)
_SCOPE_BACKWARD = int(torch._C._profiler.RecordScope.BACKWARD_FUNCTION)
# Ops whose nested ops are judged but who are not judged themselves: everything outside these
# namespaces is a custom op (its Python implementation's ops are recorded inside it).
_JUDGED_NAMESPACES = ("aten", "prims")
_OP_NAME = re.compile(r"^[A-Za-z_][\w.]*::[\w.]+$")


def _autograd_api() -> Any:
    return torch._C._autograd


@dataclass(frozen=True)
class OpRecord:
    """One kind of op a step ran, with how often.

    Attributes:
        name: The dispatcher's name (``aten::var``, ``mylib::conv_norm``).
        shapes: Input shapes in argument order (``()`` for a non-tensor or a 0-d tensor).
        function: The innermost custom ``torch.autograd.Function`` range around it (forward: the
            class name; backward: ``<Name>Backward``), ``""`` outside every Function.
        within: The innermost custom op (outside aten/prims) around it, ``""`` if none.
        count: How many times.
    """

    name: str
    shapes: tuple[tuple[int, ...], ...]
    function: str
    within: str
    count: int


@dataclass(frozen=True)
class KernelRecord:
    """One kind of GPU kernel a step launched.

    Attributes:
        name: The kernel's name as CUPTI reports it.
        launched_by: The dispatcher op whose range the launch lies in (``aten::mm``); ``""`` when
            no op was recorded above it (a Triton launch from Python, or an op hidden from the
            census).
        count: How many times.
    """

    name: str
    launched_by: str
    count: int


@dataclass(frozen=True)
class StepSummary:
    """What one marked step ran: the message a child sends its parent, as `to_json`.

    Attributes:
        label: The step's label (``forward:<item>``, ``backward:<item>``).
        marker: The full name of the step's range (``grader.step:<label>#<nonce>``), ``""`` when
            the range was not found.
        device: ``cpu`` or ``cuda``: whether kernels were recorded at all.
        events: Profiler events inside the step's range (0 is tampering, unless it raised).
        raised: The step ended by an exception (it may then have run nothing at all).
        ops: The dispatcher ops, aggregated.
        functions: Names of the custom autograd.Function ranges in the step.
        kernels: GPU kernels, aggregated (None on a CPU).
        host_copy_bytes: Bytes copied from the GPU to the host in the step.
        tampered: What the census found done to itself (each a sentence).
    """

    label: str
    marker: str
    device: str
    events: int
    raised: bool
    ops: tuple[OpRecord, ...]
    functions: tuple[str, ...]
    kernels: tuple[KernelRecord, ...] | None
    host_copy_bytes: int
    tampered: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "marker": self.marker,
            "device": self.device,
            "events": self.events,
            "raised": self.raised,
            "ops": [[o.name, [list(s) for s in o.shapes], o.function, o.within, o.count]
                    for o in self.ops],  # fmt: skip
            "functions": list(self.functions),
            "kernels": None if self.kernels is None
            else [[k.name, k.launched_by, k.count] for k in self.kernels],
            "host_copy_bytes": self.host_copy_bytes,
            "tampered": list(self.tampered),
        }

    @classmethod
    def from_json(cls, data: Any) -> StepSummary:
        """Parse what a child sent; `ValueError` (saying what is wrong) for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"a census summary is a JSON object, not {type(data).__name__}")
        ops = tuple(
            OpRecord(_str(o[0]), tuple(_shape(s) for s in _list(o[1])), _str(o[2]), _str(o[3]),
                     _count(o[4]))
            for o in (_list(row, 5) for row in _list(data.get("ops")))
        )  # fmt: skip
        raw_kernels = data.get("kernels")
        kernels = None if raw_kernels is None else tuple(
            KernelRecord(_str(k[0]), _str(k[1]), _count(k[2]))
            for k in (_list(row, 3) for row in _list(raw_kernels))
        )  # fmt: skip
        return cls(
            label=_str(data.get("label")),
            marker=_str(data.get("marker")),
            device=_str(data.get("device")),
            events=_count(data.get("events")),
            raised=_bool(data.get("raised")),
            ops=ops,
            functions=tuple(_str(f) for f in _list(data.get("functions"))),
            kernels=kernels,
            host_copy_bytes=_count(data.get("host_copy_bytes")),
            tampered=tuple(_str(t) for t in _list(data.get("tampered"))),
        )


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r:.80}")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a count, got {value!r:.80}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r:.80}")
    return value


def _list(value: Any, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        want = "a list" if length is None else f"a list of {length}"
        raise ValueError(f"expected {want}, got {value!r:.80}")
    return value


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(_count(v) for v in _list(value))


# ----------------------------------------------------------------------------- the profiler


@dataclass
class _Event:
    """The parts of one kineto event the census reads (read once: each accessor is a C++ call)."""

    name: str
    kind: str  # kineto's activity type: cpu_op, user_annotation, kernel, gpu_memcpy...
    start: int
    end: int
    thread: int
    cpu: bool
    raw: Any


def _activity(event: Any, cpu: bool) -> str:
    """Kineto's activity type of ``event``. torch ≥ 2.12 says it (``activity_type``); torch 2.11
    (the grading image's) does not, and it is read from what it does say: a host event is an op
    unless it is a user annotation (the census's own ranges), a device event a copy, a fill or a
    kernel by its name (CUPTI names copies ``Memcpy ...`` and fills ``Memset ...``)."""
    read = getattr(event, "activity_type", None)
    if read is not None:
        return str(read())
    if cpu:
        annotation = getattr(event, "is_user_annotation", None)
        return "user_annotation" if annotation is not None and annotation() else "cpu_op"
    name = event.name()
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "kernel"


def _nbytes(event: Any) -> int:
    """A copy's bytes (0 where this torch's events do not carry them: torch 2.11's)."""
    read = getattr(event, "nbytes", None)
    return int(read()) if read is not None else 0


def _read_events(result: Any) -> list[_Event]:
    cpu_type = torch.autograd.DeviceType.CPU
    out = []
    for e in result.events():
        start = int(e.start_ns())
        cpu = e.device_type() == cpu_type
        out.append(_Event(e.name(), _activity(e, cpu), start, start + int(e.duration_ns()),
                          int(e.start_thread_id()), cpu, e))  # fmt: skip
    return out


def _is_op(name: str) -> bool:
    return bool(_OP_NAME.match(name)) and not name.startswith(("autograd::", "torch::"))


def _namespace(name: str) -> str:
    return name.split("::", 1)[0]


def _is_function(event: _Event) -> bool:
    """A custom autograd.Function's range: forward, the class name (no namespace, a sequence
    number); backward, its node ``<Name>Backward`` (PyTorch's own nodes end in a digit or have a
    namespace)."""
    if event.kind != "cpu_op" or "::" in event.name or event.name.startswith(MARKER_PREFIX):
        return False
    scope = int(event.raw.scope())
    if scope == _SCOPE_FUNCTION:
        return int(event.raw.sequence_nr()) >= 0
    return scope == _SCOPE_BACKWARD and event.name.endswith("Backward")


def _shapes(event: _Event) -> tuple[tuple[int, ...], ...]:
    out = []
    for shape in event.raw.shapes():
        dims = tuple(int(d) for d in shape) if all(isinstance(d, int) for d in shape) else ()
        out.append(dims)
    return tuple(out)


class Marker:
    """One marked step (see `Census.mark`): a context manager around the step's code.

    Attributes:
        label: The step's label.
        commit: SHA-256 (hex) of the nonce in the range's name: the parent gets it before the
            step runs and checks the name the summary reports against it.
    """

    def __init__(self, census: Census, label: str) -> None:
        # A label may hold '#' (item names do): the nonce is what follows the last one.
        self.label = label
        self._census = census
        self._nonce = os.urandom(16).hex()
        self.commit = hashlib.sha256(self._nonce.encode()).hexdigest()
        self._handle: Any = None

    def __enter__(self) -> Marker:
        self._census._pending.append(self.label)
        # The nonce leaves Python here: from now on only the profiler's range holds it.
        self._handle = self._census._enter(
            f"{MARKER_PREFIX}{self.label}{NONCE_SEPARATOR}{self._nonce}"
        )
        self._nonce = ""
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        handle, self._handle = self._handle, None
        if handle is not None:
            self._census._exit(handle)
        if kind is not None:
            self._census._raised.add(self.label)


class Census:
    """The profiler-based census of one child process (see the module docstring).

    Args:
        device: The device the steps run on; on ``cuda`` CUPTI's kernels are recorded too.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        activities = {ProfilerActivity.CPU}
        if self.cuda:
            activities.add(ProfilerActivity.CUDA)
        self._activities = activities
        self._config = ProfilerConfig(ProfilerState.KINETO, True, False, False, False, False,
                                      _ExperimentalConfig())  # fmt: skip
        self._enabled_at = 0  # time.time_ns() right after the census last started the profiler
        self._pending: list[str] = []
        self._raised: set[str] = set()
        self._notes: list[str] = []
        self._started = False
        self._enter_op = torch.ops.profiler._record_function_enter_new
        self._exit_op = torch.ops.profiler._record_function_exit._RecordFunction

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Disarm the silent switches, start the profiler and run one marked step of the census's
        own, so its first-use threads and imports exist before any baseline is taken."""
        if self._started:
            return
        self._started = True
        # Kineto prints a line to stderr at every start and stop (level 5, "USDT"): read at its
        # first use, so set here; the child's stderr tail must stay the submission's.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        _disarm_silent_switches(self._note)
        atexit.register(self.stop)  # a profiler left on crashes the interpreter at exit
        self._enable()
        with self.mark("census-warm-up"):
            (torch.ones(4, device=self.device) + 1).sum()
        self.collect()

    def stop(self) -> None:
        """Stop the profiler for good (idempotent; also registered with atexit)."""
        api = _autograd_api()
        if self._started and api._profiler_enabled():
            try:
                api._disable_profiler()
            except RuntimeError:
                pass  # stopped by someone else in between: nothing left to stop
        self._started = False

    def mark(self, label: str) -> Marker:
        """A new marked step for ``label`` (enter it around the step's code; see `Marker`)."""
        return Marker(self, label)

    def collect(self, read: bool = True) -> list[StepSummary]:
        """The summaries of the steps marked since the last call, in order.

        Call it at the same fixed points for every step (the gate: between items; timing: at
        each audit), so every step sees the profiler stopped and restarted alike. It
        synchronizes the GPU first (the step's kernels are then recorded), stops the profiler,
        restarts it and reads the events; it never raises for what it finds (that is reported).
        With ``read`` false (a census kept only for what it costs the steps) the events are
        dropped unread and nothing is returned.
        """
        pending, self._pending = self._pending, []
        raised, self._raised = self._raised, set()
        notes, self._notes = self._notes, []
        result = None
        if self.cuda:
            try:
                torch.cuda.synchronize(self.device)
            except Exception as exc:  # noqa: BLE001 - a poisoned context is reported, not raised
                notes.append(f"could not synchronize the GPU before reading: {exc}")
        api = _autograd_api()
        if not api._profiler_enabled():
            notes.append("the census's profiler was found stopped")
        else:
            try:
                result = api._disable_profiler()
            except Exception as exc:  # noqa: BLE001 - a profiler replaced by another kind
                notes.append(f"the census's profiler could not be stopped: {exc}")
        if result is not None:
            # A session that began after the census started its own was started by someone
            # else, in between (only later is evidence: clocks may differ a little).
            began = int(result.trace_start_ns())
            if began > self._enabled_at + _TRACE_START_SLACK_NS:
                notes.append(
                    f"the profiler's session began {(began - self._enabled_at) / 1e6:.1f} ms "
                    "after the census started it: it was stopped and restarted in between"
                )
        try:
            self._enable()
        except Exception as exc:  # noqa: BLE001
            notes.append(f"the census's profiler could not be restarted: {exc}")
        if not read:
            return []
        try:
            events = _read_events(result) if result is not None else []
            return [self._summarize(label, label in raised, events, notes) for label in pending]
        except Exception as exc:  # noqa: BLE001 - a malformed trace is a finding, not a crash
            note = f"the census could not read the profiler's events: {exc!r}"
            return [_empty_summary(label, label in raised, self.cuda, (*notes, note))
                    for label in pending]  # fmt: skip

    # ------------------------------------------------------------------ internals

    def _note(self, text: str) -> None:
        self._notes.append(text)

    def _enable(self) -> None:
        api = _autograd_api()
        api._prepare_profiler(self._config, self._activities)
        api._enable_profiler(self._config, self._activities)
        self._enabled_at = time.time_ns()

    def _enter(self, name: str) -> Any:
        return self._enter_op(name, None)

    def _exit(self, handle: Any) -> None:
        self._exit_op(handle)

    def _summarize(self, label: str, raised: bool, events: list[_Event], notes: list[str]
                   ) -> StepSummary:  # fmt: skip
        tampered = list(notes)
        # CPU ranges only: on a GPU kineto mirrors each range onto the device's timeline too.
        markers = [e for e in events if e.cpu and e.name.startswith(MARKER_PREFIX)
                   and e.name[len(MARKER_PREFIX):].rpartition(NONCE_SEPARATOR)[0] == label]
        if not markers:
            tampered.append(f"the range of step {label} is missing from the profile")
            return _empty_summary(label, raised, self.cuda, tampered)
        if len(markers) > 1:
            tampered.append(f"step {label} has {len(markers)} ranges; the harness opened one")
        marker = markers[0]
        inside = [e for e in events
                  if e is not marker and e.cpu and marker.start <= e.start <= marker.end]
        ops, functions, truncated = _ops_of(inside)
        if truncated:
            tampered.append(f"step {label} ran more than {MAX_RECORDS} distinct ops")
        kernels, host_bytes = (_kernels_of(events, inside, marker) if self.cuda else (None, 0))
        return StepSummary(
            label=label,
            marker=marker.name,
            device=self.device.type,
            events=len(inside),
            raised=raised,
            ops=ops,
            functions=functions,
            kernels=kernels,
            host_copy_bytes=host_bytes,
            tampered=tuple(tampered),
        )


def _empty_summary(label: str, raised: bool, cuda: bool, tampered: Any) -> StepSummary:
    return StepSummary(label, "", "cuda" if cuda else "cpu", 0, raised, (), (),
                       () if cuda else None, 0, tuple(tampered))  # fmt: skip


def _ops_of(inside: list[_Event]) -> tuple[tuple[OpRecord, ...], tuple[str, ...], bool]:
    """Aggregate the step's ops with their innermost Function and custom op, per thread by time
    nesting (a range contains what starts and ends inside it on its thread)."""
    counts: Counter[tuple[str, tuple[tuple[int, ...], ...], str, str]] = Counter()
    functions: dict[str, None] = {}
    by_thread: dict[int, list[_Event]] = {}
    for e in inside:
        by_thread.setdefault(e.thread, []).append(e)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.start, -e.end))
        # (end, function name or "", custom op name or "") of each open range
        stack: list[tuple[int, str, str]] = []
        for e in thread_events:
            while stack and stack[-1][0] < e.start:
                stack.pop()
            function = next((f for _, f, _ in reversed(stack) if f), "")
            within = next((c for _, _, c in reversed(stack) if c), "")
            if _is_function(e):
                functions[e.name] = None
                stack.append((e.end, e.name, ""))
            elif e.kind == "cpu_op" and _is_op(e.name):
                counts[(e.name, _shapes(e), function, within)] += 1
                custom = _namespace(e.name) not in _JUDGED_NAMESPACES
                stack.append((e.end, "", e.name if custom else ""))
            else:
                stack.append((e.end, "", ""))
    records = [OpRecord(n, s, f, w, c) for (n, s, f, w), c in counts.items()]
    return tuple(records[:MAX_RECORDS]), tuple(functions), len(records) > MAX_RECORDS


def _kernels_of(events: list[_Event], inside: list[_Event], marker: _Event
                ) -> tuple[tuple[KernelRecord, ...], int]:  # fmt: skip
    """The step's kernels, each with the op it was launched under, and its bytes to the host.

    A kernel belongs to the step when the CPU range it is linked to (kineto's external
    correlation: the innermost range open at the launch) is in the step; unlinked, when it began
    after the step's range did (the collect after the step synchronized first). A kernel linked
    to a range outside the step is the harness's or another phase's."""
    # Kernels link to the external id of a CPU range (cuda_runtime events have CUPTI's own ids).
    by_correlation = {int(e.raw.correlation_id()): e for e in events
                      if e.cpu and e.kind in ("cpu_op", "user_annotation")}
    in_step = {id(e) for e in inside}
    counts: Counter[tuple[str, str]] = Counter()
    host_bytes = 0
    for e in events:
        if e.cpu or e.kind not in ("kernel", "gpu_memcpy"):
            continue
        parent = by_correlation.get(int(e.raw.linked_correlation_id()))
        if parent is not None and id(parent) not in in_step:
            continue
        if parent is None and e.start < marker.start:
            continue
        if e.kind == "gpu_memcpy":
            if "DtoH" in e.name:
                host_bytes += _nbytes(e.raw)
            continue
        launched_by = parent.name if parent is not None and _is_op(parent.name) else ""
        counts[(e.name, launched_by)] += 1
    return tuple(KernelRecord(n, b, c) for (n, b), c in counts.items()), host_bytes


def _disarm_silent_switches(note: Callable[[str], None]) -> None:
    """Replace every module attribute that holds one of `SILENT_SWITCHES` by a refusal that notes
    the call; the originals are kept nowhere, so nothing can reach them afterwards."""
    api = _autograd_api()
    originals = {name: getattr(api, name) for name in SILENT_SWITCHES if hasattr(api, name)}
    refusals = {name: _refusal(name, note) for name in originals}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            for name, original in originals.items():
                if value is original:
                    namespace[key] = refusals[name]
    originals.clear()


def _refusal(name: str, note: Callable[[str], None]) -> Callable[..., None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        note(f"torch._C._autograd.{name}{_short(args)} was called (it would hide ops from the "
             "census); the call was ignored")  # fmt: skip

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = [
    "MARKER_PREFIX",
    "NONCE_SEPARATOR",
    "SILENT_SWITCHES",
    "Census",
    "KernelRecord",
    "Marker",
    "OpRecord",
    "StepSummary",
]
