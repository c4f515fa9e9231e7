"""The fleet's commands (`grader.service.fleet`):

    python -m grader fleet --store DIR --address ADDR [--once] [--class C ...] [--lease S]
                           [--config FILE | --command CMD] [--logical-gpus] [--ray-retries N]
    python -m grader fleet node-resources [--class NAME]
    python -m grader fleet gpus --address ADDR

``ADDR`` is ``auto`` (this host is a node of the cluster: its head, or one joined with ``ray
start --address``), ``HOST:PORT`` (the head's GCS), or ``ray://HOST:10001`` (Ray Client, which
needs ``ray[client]``). ``--json`` prints one JSON object on stdout. Exit status: 0 done, 1 no Ray,
no cluster or no GPU, 2 a usage error.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grader.service.executors import CommandExecutor, LocalExecutor
from grader.service.fleet import (
    Dispatcher,
    DispatcherOptions,
    FleetError,
    connect,
    fleet_gpus,
    local_gpus,
    node_resources,
)
from grader.service.store import Store, StoreError


def _dispatch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grader fleet",
        description="grade the store's queue on a Ray cluster's GPUs",
        epilog="also: python -m grader fleet node-resources [--class NAME] (on a GPU node, for "
               "`ray start --resources`); python -m grader fleet gpus --address ADDR",
    )  # fmt: skip
    p.add_argument("--store", type=Path, required=True, help="the service's store directory")
    p.add_argument("--address", required=True, help="auto | HOST:PORT | ray://HOST:PORT")
    p.add_argument("--once", action="store_true",
                   help="exit 0 when nothing runs and no GPU can take anything")  # fmt: skip
    p.add_argument("--class", dest="classes", action="append", default=None, metavar="CLASS",
                   help="grade only on GPUs of this class (repeatable; default: every class)")
    p.add_argument("--lease", type=float, default=60.0, help="lease seconds (renewed at 1/3)")
    p.add_argument("--config", default=None,
                   help="scoring.yaml for the grades: a path that exists on every node")
    p.add_argument("--command", default=None,
                   help="grade with this command on the node instead of the grader (words "
                        "formatted with {workspace} {report} {device} {gpu} {final})")  # fmt: skip
    p.add_argument("--logical-gpus", action="store_true",
                   help="the cluster's GPUs are logical (a CPU test cluster): do not resolve "
                        "UUIDs with NVML on the nodes")  # fmt: skip
    p.add_argument("--ray-retries", type=int, default=0,
                   help="Ray's max_retries for a task whose worker or node died (default 0: "
                        "the store queues the grade again, for any free GPU)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return p


def _node_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader fleet node-resources",
                                description="this host's GPUs as `ray start --resources` JSON")
    p.add_argument("--class", dest="cls", default=None,
                   help="the class of every GPU here (default: from its name, e.g. H200)")
    return p


def _gpus_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader fleet gpus",
                                description="the cluster's GPUs, as the dispatcher sees them")
    p.add_argument("--address", required=True, help="auto | HOST:PORT | ray://HOST:PORT")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return p


def main(argv: Sequence[str]) -> int:
    """``argv`` is what follows ``fleet``."""
    argv = list(argv)
    try:
        if argv[:1] == ["node-resources"]:
            return _node_resources(_node_parser().parse_args(argv[1:]))
        if argv[:1] == ["gpus"]:
            return _gpus(_gpus_parser().parse_args(argv[1:]))
        return _dispatch(_dispatch_parser().parse_args(argv))
    except (FleetError, StoreError) as exc:
        print(f"python -m grader fleet: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"python -m grader fleet: {exc}", file=sys.stderr)
        return 2


def _node_resources(args: argparse.Namespace) -> int:
    gpus = local_gpus()
    if not gpus:
        raise FleetError("this host has no NVIDIA GPU that NVML or nvidia-smi can see")
    print(json.dumps(node_resources([(uuid, name) for _, uuid, name in gpus], args.cls)))
    return 0


def _gpus(args: argparse.Namespace) -> int:
    ray = connect(args.address)
    warnings: list[str] = []
    gpus = fleet_gpus(ray.nodes(), warnings.append)
    if args.json:
        print(json.dumps({"gpus": [g.__dict__ for g in gpus], "warnings": warnings}))
    else:
        for g in gpus:
            print(f"{g.cls:8} {g.uuid}  {g.name}  node {g.node[:12]}"
                  f"{'' if g.ray_gpus else '  (no Ray GPUs)'}")  # fmt: skip
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        if not gpus:
            print("no GPU named for the grader in this cluster", file=sys.stderr)
    return 0 if gpus else 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command:
        factory: Any = functools.partial(CommandExecutor, shlex.split(args.command))
    else:
        factory = functools.partial(LocalExecutor,
                                    config=Path(args.config) if args.config else None)  # fmt: skip
    options = DispatcherOptions(
        lease_s=args.lease, once=args.once, pin_gpu=not args.logical_gpus,
        classes=frozenset(args.classes) if args.classes else None, ray_retries=args.ray_retries,
    )  # fmt: skip
    stopping = False

    def stop(*_: Any) -> None:  # SIGTERM: no new claims; the grades in hand finish, then exit
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with Store(args.store) as store:
        dispatcher = Dispatcher(store, args.address, factory, options=options)
        gpus = dispatcher.gpus()
        dispatcher.say(f"store {args.store}; {len(gpus)} GPU(s): "
                       + ", ".join(f"{g.cls} {g.uuid}" for g in gpus))  # fmt: skip
        graded = dispatcher.run(stop=lambda: stopping)
    text = f"fleet: recorded {graded} grade(s)"
    if args.json:
        print(json.dumps({"graded": graded, "gpus": [g.uuid for g in gpus]}))
    else:
        print(text)
    return 0


# ``python -m grader.service.fleet_cli …`` is ``python -m grader fleet …`` (the tests use it).
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
