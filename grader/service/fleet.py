"""The fleet: the service's grades run as Ray tasks on the GPUs of a Ray cluster (issue 16).

    python -m grader fleet --store DIR --address auto|HOST:PORT|ray://HOST:PORT [--once]
    python -m grader fleet node-resources [--class NAME]      # on each GPU node, for `ray start`
    python -m grader fleet gpus --address ADDR                # the GPUs the dispatcher would use

**Every GPU is named in the cluster.** A node is started with custom resources (what
`node_resources` computes from NVML):

    {"H200": 2,                                   # its class: what a grade needs one of
     "gpu:GPU-aaaa": 1, "gpu:GPU-bbbb": 1,        # each GPU by UUID: the one a grade runs on
     "gpuinfo:GPU-aaaa:H200:NVIDIA H200": 1, …}   # which class and name that UUID has

The ``gpuinfo:`` resource is never requested; it is how the dispatcher learns, from the cluster's
node table alone, the class and the name (as NVML and the grader's report spell it) of each UUID.

**The store stays the single writer.** One `Dispatcher` (a Ray driver on the store's host) lists
the cluster's live GPUs and, for each GPU without a grade of its own, claims a job from the store
*as that GPU* (worker ``ray:<UUID>``, device ``Device(<name>, <UUID>)``): the store's rules, the
final's other-UUID rule included, decide what each GPU may take, exactly as for a local worker.
The grade then runs as a Ray task that needs ``{<class>: 1, "gpu:<UUID>": 1}`` (and one of Ray's
GPUs where the node declares them), with the archive in Ray's object store; the dispatcher renews
the lease while it runs and records the outcome once: `Store.finish` with the report, or
`Store.fail` (queued again, at most ``max_attempts`` times in all) when the task failed.

**Retries: the store's, not Ray's** (``max_retries=0`` by default). A task is pinned to one GPU's
resource, so Ray's retry of a task whose node died waits, unplaceable, until that very node comes
back (measured: it stays pending; `ray.get` times out). A grade's retry must go elsewhere, and
where is the store's decision: the final may not go back to a UUID that graded the submission, and
the grade records the device it ran on. So Ray *detects* the failure (with no retries left, the
task's result becomes `NodeDiedError` at once) and the dispatcher `fail`s the attempt: queued
again, taken by another free GPU, every attempt's reason in the grade's history. The dispatcher
also watches the node table, so a node that died while a retried task waits is settled all the
same. Exactly once: a report is stored only by the dispatcher, only for the attempt it claimed
(the store fences a late one), and a killed dispatcher takes its tasks with it (Ray ends a dead
driver's tasks; the grade's process dies with its Ray worker), its successor settles what it held.
``--ray-retries N`` lets Ray also rerun a task whose worker process died on a live node: on the
same GPU, inside the same store attempt (the lease is renewed throughout), so still one record.

**On the node** the task finds the claimed UUID's index with NVML and grades with ``--gpu
INDEX`` (Ray counts GPUs, and the ``CUDA_VISIBLE_DEVICES`` it sets names one of its own choosing,
so it is dropped: the grader confines its children to the index itself).

Ray is the ``fleet`` extra of pyproject.toml; it is imported only when a dispatcher connects, so
the rest of the service never needs it. Every node runs the same Ray, Python and grader.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

from grader.service import presence
from grader.service.executors import Executor, ExecutorError, GradeRequest
from grader.service.store import Device, Job, Store, StoreError

GPU_PREFIX = "gpu:"  # gpu:<UUID> = 1: that one GPU
INFO_PREFIX = "gpuinfo:"  # gpuinfo:<UUID>:<class>:<name> = 1: what it is (never requested)
# Words of NVML's names that say nothing of the class (NVIDIA GeForce RTX 4090 -> RTX4090).
_NOT_CLASS = {"NVIDIA", "GEFORCE", "TESLA", "QUADRO"}

ExecutorFactory = Callable[[], Executor]


class FleetError(RuntimeError):
    """The fleet cannot run: Ray is missing, the cluster is unreachable, or a node is misnamed."""


# ----------------------------------------------------------------------------- naming the GPUs


def gpu_class(name: str) -> str:
    """The class of a GPU, from its NVML name: ``NVIDIA H200`` -> ``H200``, ``NVIDIA L4`` ->
    ``L4``, ``NVIDIA H100 80GB HBM3`` -> ``H100``, ``NVIDIA A100-SXM4-80GB`` -> ``A100``."""
    words = [w for w in name.replace("-", " ").split() if w.upper() not in _NOT_CLASS]
    if not words:
        raise ValueError(f"no GPU class in the name {name!r}; give one with --class")
    if words[0].upper() in ("RTX", "GTX") and len(words) > 1:
        return words[0] + words[1]
    return words[0]


def node_resources(gpus: Iterable[tuple[str, str]], cls: str | None = None) -> dict[str, int]:
    """The custom resources of a node with ``gpus`` (UUID, NVML name): its class(es), each GPU,
    what each GPU is. ``cls`` names the class of every GPU instead of `gpu_class`."""
    out: dict[str, int] = {}
    for uuid, name in gpus:
        if ":" in uuid or not uuid.strip():
            raise ValueError(f"not a GPU UUID: {uuid!r}")
        kind = cls or gpu_class(name)
        if ":" in kind:
            raise ValueError(f"a GPU class has no ':' ({kind!r})")
        out[kind] = out.get(kind, 0) + 1
        out[f"{GPU_PREFIX}{uuid}"] = 1
        out[f"{INFO_PREFIX}{uuid}:{kind}:{name}"] = 1
    return out


def local_gpus() -> list[tuple[int, str, str]]:
    """This host's GPUs as (NVML index, UUID, name): NVML, else ``nvidia-smi``; [] without."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
                out.append((index, _text(uuid), _text(name)))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no bindings or no driver: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    done = subprocess.run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    rows = [[c.strip() for c in line.split(",", 2)] for line in done.stdout.splitlines()]
    return [(int(r[0]), r[1], r[2]) for r in rows if done.returncode == 0 and len(r) == 3]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class FleetGpu:
    """One GPU of the cluster, as the node table names it."""

    uuid: str
    cls: str  # the class resource a grade on it needs one of
    name: str  # as NVML and the report name it: the store's device name (the final's kind)
    node: str  # Ray's node id (a restarted node has a new one)
    ray_gpus: bool  # the node declares Ray GPUs (real ones, or logical ones in a test cluster)

    @property
    def worker(self) -> str:
        return f"ray:{self.uuid}"

    @property
    def device(self) -> Device:
        # Index 0 until the node resolves the UUID to its own CUDA index (`_grade_on_node`).
        return Device(name=self.name, uuid=self.uuid, index=0)


def fleet_gpus(nodes: Sequence[Mapping[str, Any]], warn: Callable[[str], None] = lambda _: None,
               ) -> list[FleetGpu]:  # fmt: skip
    """The live GPUs in ``ray.nodes()``'s table, sorted by class and UUID. A ``gpu:<UUID>``
    without its ``gpuinfo:``, or a UUID on two nodes, is left out and ``warn``-ed about."""
    found: dict[str, list[FleetGpu]] = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        named = {k[len(GPU_PREFIX):] for k in resources if k.startswith(GPU_PREFIX)}
        for key in resources:
            if not key.startswith(INFO_PREFIX):
                continue
            uuid, _, rest = key[len(INFO_PREFIX):].partition(":")
            cls, _, name = rest.partition(":")
            if uuid in named and cls in resources and name:
                gpu = FleetGpu(uuid, cls, name, node["NodeID"], resources.get("GPU", 0) > 0)
                found.setdefault(uuid, []).append(gpu)
                named.discard(uuid)
        for uuid in sorted(named):
            warn(f"node {node['NodeID'][:12]} has {GPU_PREFIX}{uuid} but no matching "
                 f"{INFO_PREFIX}{uuid}:<class>:<name> and <class> resource; start it with "
                 "--resources \"$(python -m grader fleet node-resources)\"")  # fmt: skip
    out = []
    for uuid, gpus in found.items():
        if len(gpus) > 1:
            warn(f"GPU {uuid} is named by {len(gpus)} nodes; none of them grades on it")
        else:
            out.append(gpus[0])
    return sorted(out, key=lambda g: (g.cls, g.uuid))


# ----------------------------------------------------------------------------- on the node


def cuda_index(uuid: str) -> int:
    """This host's index of GPU ``uuid`` (NVML's order, which the grader's ``--gpu`` uses).

    Raises:
        ExecutorError: No GPU of this host has that UUID.
    """
    gpus = local_gpus()
    for index, found, _ in gpus:
        if found == uuid:
            return index
    raise ExecutorError(f"GPU {uuid} is not on this node (it has {[g[1] for g in gpus]})")


def _grade_on_node(factory: ExecutorFactory, request: GradeRequest, archive: bytes,
                   pin_gpu: bool) -> tuple[str, str, str]:  # fmt: skip
    """The Ray task: run ``request`` through ``factory()``'s executor on this node.

    Returns (this node's id, ``report`` or ``error``, the report JSON or why). The machinery's
    own failures come back as ``error`` (the store tries again); anything else raises.
    """
    import ray

    node = ray.get_runtime_context().get_node_id()
    request = replace(request, archive=archive)
    try:
        if pin_gpu:
            device = replace(request.device, index=cuda_index(request.device.uuid))
            request = replace(request, device=device)
            # Ray points CUDA_VISIBLE_DEVICES at a GPU of its own choosing (it counts GPUs, the
            # UUID resource chose which); the grader is told the index and confines its children
            # to it, so it must see every GPU of the host, numbered as NVML numbers them.
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        # Cancellation (the dispatcher lost the lease) arrives as KeyboardInterrupt, on which
        # the executor kills the grade's process group: nothing for ``alive`` to ask.
        return node, "report", factory().run(request, lambda: True)
    except (ExecutorError, OSError) as exc:
        return node, "error", str(exc)


# ----------------------------------------------------------------------------- the dispatcher


@dataclass(frozen=True)
class DispatcherOptions:
    """How the dispatcher runs.

    Attributes:
        lease_s: How long a claim holds without renewal; renewed every ``lease_s / 3``.
        poll_s: The longest wait between two looks at the tasks, the nodes and the queue.
        once: Exit when nothing is running and no GPU could take anything.
        classes: Grade only on GPUs of these classes (None: every class).
        pin_gpu: On the node, resolve the claimed UUID to its CUDA index with NVML (a real GPU
            fleet). False for logical GPUs (a CPU test cluster), where the executor gets index 0.
        ray_retries: Ray's ``max_retries`` of a task whose worker or node died (see the module's
            docstring for why the store's retry is the default).
    """

    lease_s: float = 60.0
    poll_s: float = 0.5
    once: bool = False
    classes: frozenset[str] | None = None
    pin_gpu: bool = True
    ray_retries: int = 0


@dataclass
class _Running:
    job: Job
    gpu: FleetGpu
    ref: Any  # the task's ray.ObjectRef
    archive: Any  # the archive's ray.ObjectRef, held until the task ends
    renewed: float


@dataclass(frozen=True)
class Placement:
    """Where an attempt ran and how it ended (the dispatcher's log, kept for tests and views)."""

    grade: int
    attempt: int
    uuid: str
    node: str
    outcome: str  # done, failed, lost


def connect(address: str | None) -> Any:
    """Import Ray and connect this process to the cluster at ``address`` (once); the module.

    Raises:
        FleetError: Ray is not installed or the cluster does not answer.
    """
    try:
        import ray
    except ImportError as exc:
        raise FleetError("the fleet needs Ray (pyproject.toml's fleet extra): "
                         "pip install -e '.[fleet]'") from exc
    if not ray.is_initialized():
        _reachable(address)
        try:
            # log_to_driver=False: a task's output is its executor's business, and a driver's
            # stdout is the command's --json answer.
            ray.init(address=address, log_to_driver=False, logging_level="WARNING")
        except Exception as exc:  # noqa: BLE001 - Ray's errors here have no common base
            raise FleetError(f"cannot connect to the Ray cluster at {address}: {exc}") from exc
    return ray


def _reachable(address: str | None, timeout_s: float = 10.0) -> None:
    """Fail in seconds on a ``HOST:PORT`` nobody answers at (Ray itself retries for minutes:
    13 measured on 127.0.0.1:1)."""
    if not address or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise FleetError(f"no Ray cluster answers at {address}: {exc}") from exc


class Dispatcher:
    """Claims grades from ``store`` for the cluster's free GPUs and runs them as Ray tasks.

    Args:
        store: The service's store; this dispatcher is its only writer for the fleet's grades.
        address: The Ray cluster (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``); None when this
            process is connected already.
        executor_factory: Called on the node to make the executor of each grade (pickled to the
            node: a class, or a `functools.partial` of one, importable there).
    """

    def __init__(self, store: Store, address: str | None, executor_factory: ExecutorFactory, *,
                 options: DispatcherOptions = DispatcherOptions(),
                 log: TextIO = sys.stderr) -> None:  # fmt: skip
        self.ray = connect(address)
        self.store = store
        self.factory = executor_factory
        self.options = options
        self.log = log
        self.task = self.ray.remote(_grade_on_node)
        self.running: dict[Any, _Running] = {}  # task ref -> what it runs
        self.placements: list[Placement] = []
        self._seen: set[str] = set()  # UUIDs whose stale grades were settled
        self._warned: set[str] = set()

    def say(self, text: str) -> None:
        print(f"[fleet] {text}", file=self.log, flush=True)

    def _warn_once(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            self.say(text)

    def gpus(self) -> list[FleetGpu]:
        """The cluster's live GPUs this dispatcher grades on."""
        gpus = fleet_gpus(self.ray.nodes(), self._warn_once)
        if self.options.classes is not None:
            gpus = [g for g in gpus if g.cls in self.options.classes]
        return gpus

    def run(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Dispatch until ``stop()`` and nothing runs (or, with ``once``, until nothing is left
        that a GPU may take); how many grades were recorded."""
        done = 0
        while True:
            gpus = self.gpus()
            self._settle_stale(gpus)
            done += self._collect()
            self._check_nodes(gpus)
            self._renew()
            claimed = 0 if stop() else self._claim(gpus)
            if not self.running and (stop() or (self.options.once and not claimed)):
                return done
            if self.running:
                self.ray.wait(list(self.running), num_returns=1, timeout=self.options.poll_s)
            else:
                time.sleep(self.options.poll_s)

    # ------------------------------------------------------------------ one round

    def _settle_stale(self, gpus: list[FleetGpu]) -> None:
        """A GPU seen for the first time may hold grades of a dispatcher that died: its driver
        died with its tasks, so they are settled at once (not when their leases run out)."""
        for gpu in gpus:
            if gpu.uuid not in self._seen:
                self._seen.add(gpu.uuid)
                stale = self.store.release_stale(gpu.worker)
                if stale:
                    self.say(f"settled {stale} grade(s) {gpu.worker} held when the last "
                             "dispatcher stopped")  # fmt: skip

    def _claim(self, gpus: list[FleetGpu]) -> int:
        for gpu in gpus:  # seen even when idle (/readyz); written at most every few seconds
            presence.note(self.store, gpu.worker, gpu.device.name)
        if self.store.queued() <= len(self.running):
            return 0  # nothing but ours (a read): no claim transaction per idle GPU per round
        busy = {r.gpu.uuid for r in self.running.values()}
        claimed = 0
        for gpu in gpus:
            if gpu.uuid in busy:
                continue
            job = self.store.claim(gpu.worker, gpu.device, self.options.lease_s)
            if job is not None:
                self._submit(job, gpu)
                claimed += 1
        return claimed

    def _submit(self, job: Job, gpu: FleetGpu) -> None:
        label = (f"submission {job.submission.id} ({job.grade.purpose} {job.grade.id}, attempt "
                 f"{job.attempt})")  # fmt: skip
        try:
            archive = self.ray.put(self.store.archive(job.submission.id))
        except StoreError as exc:
            self.say(f"{label} failed: {exc}")
            self.store.fail(job, str(exc))
            return
        request = GradeRequest(archive=b"", commit=job.submission.commit,
                               tree=job.submission.tree, final=job.grade.purpose == "final",
                               device=gpu.device, label=label)  # fmt: skip
        ref = self.task.options(
            resources={gpu.cls: 1, f"{GPU_PREFIX}{gpu.uuid}": 1},
            num_gpus=1 if gpu.ray_gpus else 0,
            num_cpus=0,  # the GPU is the grade's resource; its CPU threads are the grader's
            max_retries=self.options.ray_retries, retry_exceptions=False,
        ).remote(self.factory, request, archive, self.options.pin_gpu)  # fmt: skip
        self.running[ref] = _Running(job, gpu, ref, archive, time.monotonic())
        self.say(f"grading {label} on {gpu.name} {gpu.uuid} (node {gpu.node[:12]})")

    def _collect(self) -> int:
        """Record every task that ended; how many reports were stored."""
        if not self.running:
            return 0
        ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        done = 0
        for ref in ready:
            run = self.running.pop(ref)
            try:
                node, kind, text = self.ray.get(ref)
            except self.ray.exceptions.RayTaskError as exc:
                self._fail(run, f"the task raised {_first_line(exc.cause or exc)}")
                continue
            except self.ray.exceptions.RayError as exc:  # the worker or node died, cancelled
                self._fail(run, _first_line(exc))
                continue
            if node != run.gpu.node:
                self._fail(run, f"it ran on node {node}, not on {run.gpu.uuid}'s {run.gpu.node}")
            elif kind == "error":
                self._fail(run, text)
            else:
                done += self._finish(run, text)
        return done

    def _finish(self, run: _Running, report: str) -> int:
        job = run.job
        try:
            grade = self.store.finish(job, report)
        except StoreError as exc:  # the lease was lost meanwhile: another attempt owns it
            self._placed(run, "lost")
            self.say(str(exc))
            return 0
        except ValueError as exc:  # not a report (`grader.service.verdict`): the executor's fault
            self._fail(run, f"the report is not the grader's: {exc}")
            return 0
        except Exception as exc:  # noqa: BLE001 - one job's failure never ends the dispatcher
            self._fail(run, f"recording its report failed: {type(exc).__name__}: {exc}")
            return 0
        self._placed(run, "done")
        self.say(f"grade {grade.id} (attempt {job.attempt}) on {run.gpu.uuid}: {grade.status} "
                 f"score {grade.score}")  # fmt: skip
        return 1

    def _fail(self, run: _Running, reason: str) -> None:
        self._placed(run, "failed")
        why = f"{reason} [node {run.gpu.node[:12]}]"  # the store names the GPU: ray:<UUID>
        grade = self.store.fail(run.job, why)
        again = "queued again" if grade.state.value == "queued" else grade.status
        self.say(f"grade {grade.id} attempt {run.job.attempt} on {run.gpu.uuid} failed: {why}; "
                 f"{again}")

    def _placed(self, run: _Running, outcome: str) -> None:
        self.placements.append(Placement(run.job.grade.id, run.job.attempt, run.gpu.uuid,
                                         run.gpu.node, outcome))  # fmt: skip

    def _check_nodes(self, gpus: list[FleetGpu]) -> None:
        """A task whose node left the cluster is settled here too: with Ray retries left it
        would wait for that node, and a node that came back has a new id."""
        alive = {(g.uuid, g.node) for g in gpus}
        for ref, run in list(self.running.items()):
            if (run.gpu.uuid, run.gpu.node) not in alive:
                del self.running[ref]
                self._cancel(ref, force=True)
                self._fail(run, "its node left the cluster mid-grade (Ray's node table)")

    def _renew(self) -> None:
        now = time.monotonic()
        for ref, run in list(self.running.items()):
            if now - run.renewed < self.options.lease_s / 3:
                continue
            run.renewed = now
            if not self.store.heartbeat(run.job, self.options.lease_s):
                del self.running[ref]
                self._cancel(ref, force=False)  # the executor kills the grade's processes
                self._placed(run, "lost")
                self.say(f"grade {run.job.grade.id} attempt {run.job.attempt} is no longer "
                         f"{run.gpu.worker}'s (its lease lapsed or it was settled); cancelled")

    def _cancel(self, ref: Any, force: bool) -> None:
        try:
            self.ray.cancel(ref, force=force)
        except Exception as exc:  # noqa: BLE001 - the task may be gone with its node
            self.say(f"cancelling a task: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


__all__ = [
    "GPU_PREFIX", "INFO_PREFIX", "Dispatcher", "DispatcherOptions", "FleetError", "FleetGpu",
    "Placement", "connect", "cuda_index", "fleet_gpus", "gpu_class", "local_gpus",
    "node_resources",
]  # fmt: skip
