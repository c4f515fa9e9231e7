"""The rule guard's snapshot of a child process's global state (`grader.child.rules.Guard`).

`_state` reads everything a submission could change to affect steps it does not own: the RNGs,
backend and precision flags, autograd and module hooks, dispatch and torch-function mode stacks,
trace and profile functions, gc; `_watched_objects` and `_identities` are the functions and
objects whose replacement is a patch; `_dynamo_frames` and `_native_threads` count what Dynamo
compiled and the threads outside Python. Imported only by the guard, inside a sandboxed child.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

import torch
import triton
import triton.runtime.interpreter as triton_interpreter
import triton.runtime.jit as triton_jit

from grader.child.imports import ImportFinder


def _described(value: Any) -> str:
    """A hook, mode or flag as text that changes when it is replaced: a callable or object by
    its qualified name and id(), anything else by repr()."""
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    kind = value if callable(value) and hasattr(value, "__qualname__") else type(value)
    name = f"{getattr(kind, '__module__', None) or '?'}.{getattr(kind, '__qualname__', '?')}"
    return f"{name}@{id(value):#x}"


def _module_global_hooks() -> dict[str, str]:
    """Every ``_global_*`` hook table of ``torch.nn.modules.module`` (forward, pre-forward,
    backward, registration hooks and their flags), as handle id → hook."""
    import torch.nn.modules.module as module

    out = {}
    for name, table in sorted(vars(module).items()):
        if not name.startswith("_global_"):
            continue
        if isinstance(table, dict):
            out[name] = repr(tuple((key, _described(hook)) for key, hook in table.items()))
        else:
            out[name] = _described(table)
    return out


def _saved_tensors_hooks() -> str:
    """The top of autograd's default saved-tensor hooks stack (``saved_tensors_hooks`` entered
    and never left): only the top is readable, and any push changes it."""
    read = torch._C._autograd._top_saved_tensors_default_hooks
    try:
        top = read(False)  # ignore_is_tracing
    except TypeError:  # a torch that takes no argument here
        top = read()
    return repr(None if top is None else tuple(_described(hook) for hook in top))


def _mode_stacks() -> dict[str, str]:
    """Python dispatch modes and torch-function modes on their stacks, bottom first.

    The guard's own op log (`_OpLog`) is never on the stack when this is read: `Guard.phase`
    leaves its ``with mode`` before it calls `Guard.check_after`, so every mode here is
    somebody else's.
    """
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return {
        "dispatch_modes": repr(tuple(map(_described, _get_current_dispatch_mode_stack()))),
        "torch_function_modes": repr(tuple(map(_described, _get_current_function_mode_stack()))),
    }


def _fp32_precision(backend: str, op: str) -> str:
    """The fp32 precision (``ieee``, ``tf32``, ``bf16``) that ``op`` of ``backend`` computes in
    (torch ≥ 2.9's ``torch.backends.*.fp32_precision``): a setting of ``none`` inherits from the
    backend's, then the global one, whose ``none`` is ``ieee``. Resolved, so that a call that
    restates the default (``set_float32_matmul_precision("highest")`` writes ``ieee`` where
    ``none`` was) is no change."""
    read = torch._C._get_fp32_precision_getter
    for setting in ((backend, op), (backend, "all"), ("generic", "all")):
        value = read(*setting)
        if value != "none":
            return value
    return "ieee"


def _digest(rng_state: torch.Tensor) -> str:
    return hashlib.sha256(rng_state.cpu().numpy().tobytes()).hexdigest()[:16]


def _state() -> dict[str, str]:
    """Global state a submission must leave alone, as comparable strings: everything a
    submission can set for the whole process that changes another block's speed or result
    (precision and backend flags, modes, hooks that run inside any block's step, RNG)."""
    import gc

    import torch.utils.deterministic as deterministic

    b = torch.backends
    matmul = b.cuda.matmul
    probes: dict[str, Any] = {
        "default_dtype": torch.get_default_dtype,
        "default_device": torch.get_default_device,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled,
        "deterministic_fill_uninitialized": lambda: deterministic.fill_uninitialized_memory,
        "grad_enabled": torch.is_grad_enabled,
        "inference_mode": torch.is_inference_mode_enabled,
        "anomaly_mode": torch.is_anomaly_enabled,
        "anomaly_check_nan": torch.is_anomaly_check_nan_enabled,
        "num_threads": torch.get_num_threads,
        "num_interop_threads": torch.get_num_interop_threads,
        "cuda.matmul.allow_tf32": lambda: matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced": lambda: matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced": lambda: matmul.allow_bf16_reduced_precision_reduction,
        "cuda.matmul.allow_fp16_accumulation": lambda: matmul.allow_fp16_accumulation,
        "cuda.preferred_blas_library": b.cuda.preferred_blas_library,
        "cuda.preferred_linalg_library": b.cuda.preferred_linalg_library,
        "cuda.flash_sdp": b.cuda.flash_sdp_enabled,
        "cuda.mem_efficient_sdp": b.cuda.mem_efficient_sdp_enabled,
        "cuda.math_sdp": b.cuda.math_sdp_enabled,
        "cuda.cudnn_sdp": b.cuda.cudnn_sdp_enabled,
        "cuda.math_sdp_fp16_bf16_reduction": torch._C._get_math_sdp_allow_fp16_bf16_reduction,
        "cudnn.enabled": lambda: b.cudnn.enabled,
        "cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
        "cudnn.benchmark": lambda: b.cudnn.benchmark,
        "cudnn.benchmark_limit": lambda: b.cudnn.benchmark_limit,
        "cudnn.deterministic": lambda: b.cudnn.deterministic,
        "mkldnn.enabled": lambda: b.mkldnn.enabled,
        "mkldnn.deterministic": lambda: b.mkldnn.deterministic,
        "nnpack.enabled": torch._C._get_nnpack_enabled,
        "opt_einsum": lambda: (b.opt_einsum.enabled, b.opt_einsum.strategy),
        "cpu.allow_fp16_reduced": torch._C._get_cpu_allow_fp16_reduced_precision_reduction,
        "fp32_precision.cuda.matmul": lambda: _fp32_precision("cuda", "matmul"),
        "fp32_precision.cuda.conv": lambda: _fp32_precision("cuda", "conv"),
        "fp32_precision.mkldnn.matmul": lambda: _fp32_precision("mkldnn", "matmul"),
        "fp32_precision.mkldnn.conv": lambda: _fp32_precision("mkldnn", "conv"),
        "autocast.cuda": lambda: (torch.is_autocast_enabled("cuda"),
                                  torch.get_autocast_dtype("cuda")),
        "autocast.cpu": lambda: (torch.is_autocast_enabled("cpu"),
                                 torch.get_autocast_dtype("cpu")),
        "autocast.cache": torch.is_autocast_cache_enabled,
        # Autograd: hooks and switches that act inside every block's backward.
        "saved_tensors_hooks": _saved_tensors_hooks,
        "saved_tensors_hooks_enabled": torch._C._autograd._saved_tensors_hooks_is_enabled,
        "autograd_multithreading": torch._C._is_multithreading_enabled,
        "autograd_view_replay": torch._C._is_view_replay_enabled,
        "forward_ad_level": lambda: torch.autograd.forward_ad._current_level,
        "functorch_level": torch._C._functorch.maybe_current_level,
        "torch_function_enabled": lambda: (torch._C._is_torch_function_enabled(),
                                           torch._C._is_torch_function_mode_enabled()),
        # The interpreter's own hooks: a trace or profile function runs inside every step.
        "python_trace": lambda: _described(sys.gettrace()),
        "python_profile": lambda: _described(sys.getprofile()),
        "gc": lambda: (gc.isenabled(), gc.get_threshold()),
        "cpu_rng": lambda: _digest(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        probes["cuda_rng"] = lambda: _digest(torch.cuda.get_rng_state())
        probes["cuda.memory_fraction"] = lambda: torch.cuda.get_per_process_memory_fraction(0)
    state: dict[str, str] = {}
    for key, probe in probes.items():
        try:
            value = probe()
        # A probe this torch lacks fails the same way at the baseline and after; a submission's
        # mode or hook may raise anything inside one, which reads as a change, never as a crash
        # of the guard.
        except Exception as exc:  # noqa: BLE001
            value = f"unavailable ({type(exc).__name__})"
        state[key] = value if isinstance(value, str) else repr(value)
    state.update(_mode_stacks())
    state.update({f"nn.module.{k}": v for k, v in _module_global_hooks().items()})
    return state


def _watched_objects() -> dict[str, Any]:
    """Modules and classes whose callable attributes a submission must not replace."""
    import builtins
    import time

    import torch.nn.functional as F

    watched: dict[str, Any] = {
        "builtins": builtins,
        "time": time,
        "threading": threading,
        "os": os,
        "sys": sys,
        "torch": torch,
        "torch.Tensor": torch.Tensor,
        "torch._C._TensorBase": torch._C.TensorBase,
        "torch.nn.functional": F,
        "torch.nn.Module": torch.nn.Module,
        "torch.nn.Conv1d": torch.nn.Conv1d,
        "torch.nn.Linear": torch.nn.Linear,
        "torch.autograd": torch.autograd,
        "torch.autograd.Function": torch.autograd.Function,
        "torch.autograd.function": torch.autograd.function,
        "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.backends.cuda": torch.backends.cuda,
        "torch.backends.cudnn": torch.backends.cudnn,
        "torch.random": torch.random,
        "torch.serialization": torch.serialization,
        "torch.utils._python_dispatch": sys.modules["torch.utils._python_dispatch"],
        # Where the global hooks and modes that `_state` reads are installed and looked up.
        "torch.nn.modules.module": sys.modules["torch.nn.modules.module"],
        "torch.autograd.graph": torch.autograd.graph,
        "torch.overrides": torch.overrides,
        "triton": triton,
        "triton.language": triton.language,
        "triton.runtime.jit": triton_jit,
        "triton.runtime.jit.JITFunction": triton_jit.JITFunction,
        "triton.runtime.interpreter": triton_interpreter,
        "triton.runtime.interpreter.InterpretedFunction": triton_interpreter.InterpretedFunction,
        # The import watch's wrappers (installed before the baselines) and its finder's method.
        "importlib": importlib,
        "importlib.util": importlib.util,
        "grader.child.imports.ImportFinder": ImportFinder,
    }
    return watched


def _identities(watched: dict[str, Any]) -> dict[tuple[str, str], int]:
    """id() of every callable, class or module attribute of the watched objects."""
    out: dict[tuple[str, str], int] = {}
    for owner, obj in watched.items():
        try:
            items = list(vars(obj).items())
        except TypeError:
            continue
        for name, value in items:
            if callable(value) or isinstance(value, type | types.ModuleType | property):
                out[(owner, name)] = id(value)
    return out


def _dynamo_frames() -> int:
    """Frames Dynamo has seen so far (0 if Dynamo's utils are not even loaded)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    try:
        return int(counters["frames"]["total"]) + int(counters["stats"]["calls_captured"])
    except (KeyError, TypeError, ValueError):
        return 0


# Native threads that the CUDA driver and torch create on first use of a feature (names as
# /proc shows them); they are the runtime's, not the submission's.
_RUNTIME_THREAD_PREFIXES = ("cuda", "pt_", "nvidia", "NVIDIA")


def _native_threads() -> dict[int, str]:
    """tid → name of every thread of this process."""
    out: dict[int, str] = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
            out[int(tid)] = name
    except OSError:
        pass
    return out
