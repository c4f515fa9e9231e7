"""The op and kernel census of a child process: the profiler's raw record of each marked step.

A ``TorchDispatchMode`` sees only what reaches the Python dispatch key: not the aten ops inside a
``torch.library`` custom op's implementation, not ops run under an excluded Python key, and its
presence is visible to the code it watches. The census uses RecordFunction instead, the
dispatcher's own observer, through the PyTorch profiler (kineto, CPU activity with input shapes,
plus CUPTI's kernels on a GPU). It sees every op that goes through the dispatcher, nested ones too,
whatever the dispatch keys, and the ranges PyTorch opens for custom ``torch.autograd.Function``s
(forward: the class name, from ``THPFunction_apply``; backward: the node ``<Name>Backward``).

This side only records and reads: it stops the profiler, reads every event's raw fields and sends
them (`Census.collect`'s messages). The summaries are built and judged in the parent
(`grader.census_trace`, `grader.census`), where the submission's Python cannot replace them: a
summarising method here was one class attribute away from a forger.

Use (one per process, started before any submission code is imported)::

    census = Census(device)
    census.start()                      # always on from here
    collect = census.collect            # bound now, before the submission exists
    mark = census.mark("forward:case")  # a fresh nonce; send mark.commit to the parent first
    with mark:                          # the step's range: 'grader.step:<label>#<nonce>'
        out = block(x)
    for message in collect():           # at fixed points (between items): stop, read, restart
        send("census", **message)

Always on: the profiler runs from `Census.start` on, through the warm-up, the import and every
step, and `Census.collect` stops and restarts it at the same fixed points (the gate: between
items, every few items; timing: at every audit, in both processes), so nothing the submission can
observe tells one step from another (the kineto profiler hands out its events only when stopped;
a stop at fixed points is the price).

Tamper evidence, not tamper proof (the submission shares this process): the census reports, in
each step's ``notes``, a profiler found stopped or restarted, and any call of the profiler
switches that would silence it without stopping it (`SILENT_SWITCHES`, replaced at
`Census.start` by refusals that note the call); the parent adds a step's range missing or
repeated and a step that returned with no events at all. The range's nonce exists only inside
the profiler once the step runs; the parent holds its SHA-256 (`Marker.commit`, sent before the
step), so a range forged after a restart does not match.

Blind spots, said plainly: an op run on a thread the submission starts (the profiler's callbacks
are thread-local; new threads are the guard's rule), a kernel called past RecordFunction through
``OpOverload.redispatch`` (on a GPU its kernel still shows, with no op above it: the parent
matches every library kernel to an op), work done outside PyTorch (numpy on the host; on a GPU its
copy to the host shows), and this module's own reading, rewritten in place by code in the process.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
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

MAX_MESSAGE_CHARS = 256 * 1024
"""Raw events go to the parent in messages of about this many characters of JSON (a frame holds
at most 1 MiB)."""

# Kineto's clock and time.time_ns() agree to microseconds; a restart is seen only outside this.
_TRACE_START_SLACK_NS = 2_000_000
# CUPTI's metadata of a device event is kept up to this many characters (grid, block, bytes).
_METADATA_CHARS = 2000


def _autograd_api() -> Any:
    return torch._C._autograd


# ----------------------------------------------------------------------------- the profiler


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

    def collect(self, read: bool = True) -> list[dict[str, Any]]:
        """The ``census`` messages of the steps marked since the last call: the raw events of
        this read (``events``: rows, see `grader.census_trace`; the first message says
        ``first``), then one ``step`` per step marked, in order (its label, whether it raised,
        the census's notes); the parent builds and judges the summaries.

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
            chunks = _chunks(_rows(result) if result is not None else [])
        except Exception as exc:  # noqa: BLE001 - a malformed trace is a finding, not a crash
            notes.append(f"the census could not read the profiler's events: {exc!r}")
            chunks = [[]]
        messages: list[dict[str, Any]] = [{"events": rows, "first": index == 0}
                                          for index, rows in enumerate(chunks)]  # fmt: skip
        messages += [{"step": {"label": label, "raised": label in raised, "notes": notes}}
                     for label in pending]  # fmt: skip
        return messages

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

def _rows(result: Any) -> list[list[Any]]:
    """Every event of a stopped profiler, as the rows the parent reads (`grader.census_trace`):
    each field read once (each accessor is a C++ call), nothing decided."""
    cpu_type = torch.autograd.DeviceType.CPU
    rows = []
    for e in result.events():
        cpu = e.device_type() == cpu_type
        start = int(e.start_ns())
        kind = _activity(e, cpu)
        op = cpu and kind == "cpu_op"
        shapes = [[int(d) for d in s] if all(isinstance(d, int) for d in s) else []
                  for s in e.shapes()] if op else []  # fmt: skip
        dtypes = [str(d) for d in e.dtypes()] if op else []
        meta = getattr(e, "metadata_json", None)
        metadata = str(meta())[:_METADATA_CHARS] if meta is not None and not cpu else ""
        rows.append([e.name(), kind, cpu, start, start + int(e.duration_ns()),
                     int(e.start_thread_id()), int(e.scope()), int(e.sequence_nr()), shapes,
                     dtypes, int(e.correlation_id()), int(e.linked_correlation_id()), metadata])
    return rows


def _chunks(rows: list[list[Any]]) -> list[list[list[Any]]]:
    """``rows`` cut into messages of about `MAX_MESSAGE_CHARS` of JSON (one at least)."""
    chunks: list[list[list[Any]]] = [[]]
    size = 0
    for row in rows:
        length = len(json.dumps(row))
        if chunks[-1] and size + length > MAX_MESSAGE_CHARS:
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += length
    return chunks


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
    "Marker",
]
