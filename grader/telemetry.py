"""What GPU a grade ran on and what state it was in: identity, clocks, temperature, power.

Read in the trusted parent, which never creates a CUDA context: through NVML (``pynvml``, from the
``nvidia-ml-py`` package) when it imports, else by asking ``nvidia-smi``. When neither answers
(a machine without a GPU, a container without the tools), the fields are None and ``source`` says
so; telemetry never fails a grade. The timing child adds what only CUDA knows (L2 size) and the
parent merges the two (`merge_child`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU and software a grade ran on.

    Attributes:
        name: GPU name, e.g. "NVIDIA H200".
        uuid: GPU UUID ("GPU-…").
        driver: Driver version.
        memory_total_mb: Device memory.
        memory_bus_width_bits: Memory bus width (NVML only).
        max_memory_clock_mhz: Highest memory clock.
        max_sm_clock_mhz: Highest SM clock.
        l2_cache_bytes: L2 size (from the timing child's CUDA properties).
        sm_count: Streaming multiprocessors (from the timing child).
        torch_version: torch in the grader's environment.
        triton_version: triton in the grader's environment.
        source: "nvml", "nvidia-smi" or "none", plus "+child" once merged.
    """

    name: str | None = None
    uuid: str | None = None
    driver: str | None = None
    memory_total_mb: float | None = None
    memory_bus_width_bits: int | None = None
    max_memory_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    l2_cache_bytes: int | None = None
    sm_count: int | None = None
    torch_version: str | None = None
    triton_version: str | None = None
    source: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuSnapshot:
    """The GPU's state at one moment.

    Attributes:
        label: What was about to happen or had just happened ("before float32:8x4096:d1").
        wall_time: Unix time of the reading.
        sm_clock_mhz: Current SM clock.
        memory_clock_mhz: Current memory clock.
        temperature_c: GPU temperature.
        power_w: Power draw.
        memory_used_mb: Device memory in use (all processes).
    """

    label: str
    wall_time: float
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    memory_used_mb: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def software_versions() -> tuple[str | None, str | None]:
    """(torch, triton) versions, read from package metadata so nothing heavy is imported."""
    from importlib import metadata

    out: list[str | None] = []
    for package in ("torch", "triton"):
        try:
            out.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            out.append(None)
    return out[0], out[1]


def _nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None when NVML is not importable or has no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError subclasses, or a missing libnvidia-ml: no NVML here.
        return None
    return pynvml


def _nvml_handle(nvml: Any, uuid: str | None, index: int) -> Any:
    """The device's NVML handle (by UUID if given, else by index); None when NVML cannot say."""
    if uuid:
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByUUID(uuid)
    try:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def _call(fn: Any, *args: Any) -> Any:
    """One NVML query; a query this GPU or driver does not support gives None."""
    try:
        value = fn(*args)
    except Exception:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _smi(fields: str, index: int) -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def device_info(uuid: str | None = None, index: int = 0) -> DeviceInfo:
    """Identify the GPU (by UUID if given, else by index) and the software versions."""
    torch_version, triton_version = software_versions()
    base = DeviceInfo(torch_version=torch_version, triton_version=triton_version)
    nvml = _nvml()
    if nvml is not None:
        h = _nvml_handle(nvml, uuid, index)
        if h is not None:
            mem = _call(nvml.nvmlDeviceGetMemoryInfo, h)
            return replace(
                base,
                name=_call(nvml.nvmlDeviceGetName, h),
                uuid=_call(nvml.nvmlDeviceGetUUID, h),
                driver=_call(nvml.nvmlSystemGetDriverVersion),
                memory_total_mb=mem.total / 2**20 if mem is not None else None,
                memory_bus_width_bits=_call(nvml.nvmlDeviceGetMemoryBusWidth, h),
                max_memory_clock_mhz=_call(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_MEM),
                max_sm_clock_mhz=_call(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
                source="nvml",
            )
    row = _smi("name,uuid,driver_version,memory.total,clocks.max.memory,clocks.max.sm", index)
    if row is not None and len(row) == 6:
        return replace(
            base,
            name=row[0],
            uuid=row[1],
            driver=row[2],
            memory_total_mb=_number(row[3]),
            max_memory_clock_mhz=_number(row[4]),
            max_sm_clock_mhz=_number(row[5]),
            source="nvidia-smi",
        )
    return base


def snapshot(label: str, uuid: str | None = None, index: int = 0) -> GpuSnapshot:
    """Read clocks, temperature, power and memory in use now; None where unreadable."""
    now = time.time()
    nvml = _nvml()
    if nvml is not None:
        h = _nvml_handle(nvml, uuid, index)
        if h is not None:
            power = _call(nvml.nvmlDeviceGetPowerUsage, h)
            mem = _call(nvml.nvmlDeviceGetMemoryInfo, h)
            return GpuSnapshot(
                label=label,
                wall_time=now,
                sm_clock_mhz=_call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                memory_clock_mhz=_call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
                temperature_c=_call(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                power_w=power / 1000.0 if power is not None else None,
                memory_used_mb=mem.used / 2**20 if mem is not None else None,
            )
    row = _smi("clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used", index)
    if row is not None and len(row) == 5:
        return GpuSnapshot(label, now, *(_number(v) for v in row))
    return GpuSnapshot(label=label, wall_time=now)


def merge_child(info: DeviceInfo, child: dict[str, Any]) -> DeviceInfo:
    """Fill what the parent could not read from the timing child's CUDA properties.

    The parent's own readings win: the child's numbers are only claims (it ran submission code).
    """
    def pick(mine: Any, key: str, kind: type) -> Any:
        if mine is not None:
            return mine
        value = child.get(key)
        return kind(value) if isinstance(value, int | float | str) else None

    return replace(
        info,
        name=pick(info.name, "name", str),
        uuid=pick(info.uuid, "uuid", str),
        memory_total_mb=pick(info.memory_total_mb, "memory_total_mb", float),
        memory_bus_width_bits=pick(info.memory_bus_width_bits, "memory_bus_width_bits", int),
        max_memory_clock_mhz=pick(info.max_memory_clock_mhz, "memory_clock_mhz", float),
        l2_cache_bytes=pick(info.l2_cache_bytes, "l2_cache_bytes", int),
        sm_count=pick(info.sm_count, "sm_count", int),
        source=info.source + "+child",
    )


__all__ = [
    "DeviceInfo",
    "GpuSnapshot",
    "device_info",
    "merge_child",
    "snapshot",
    "software_versions",
]
