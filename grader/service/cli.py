"""The operator's commands (a contract: operators script against them; keep them exactly).

    python -m grader serve --store DIR [--host H] [--port P] [--keep-alive-s S] [--request-s S]
                           [--max-connections N] [--backlog N] [--threads N]
    python -m grader worker --store DIR (--gpu N | --cpu) [--once] [--name NAME]
                            [--executor local|docker] [--image IMAGE]
    python -m grader run create NAME --store DIR [--max-per-hour N] [--max-upload-mb M]
    python -m grader run status|best|report RUN --store DIR
    python -m grader run finalize RUN --store DIR [--allow-same-gpu] [--no-wait] [--timeout S]
    python -m grader run regrade RUN|SUBMISSION --store DIR

``run regrade`` queues another ordinary grade of a submission (a run: its best), as
``POST /v1/submissions/ID/regrade`` does. ``serve``, ``worker`` and ``run create`` make the store
where there is none; the other ``run`` verbs only read one (a mistyped ``--store`` is an error).
The same commands are the ``grader`` console script of an installed package.

Every verb takes ``--json``: one JSON object on stdout, nothing else there. Exit status: 0 done,
1 the thing asked for does not exist or failed (no store, no run, nothing to finalize, a final
that ended in grader_error or timed out waiting; ``serve``: the port cannot be listened on, said
in one line), 2 a usage error. ``serve`` logs one line per request and per event on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grader.service import runs
from grader.service.executors import ExecutorError
from grader.service.server_limits import ServerOptions
from grader.service.store import DB_NAME, Limits, Store, StoreError
from grader.service.text import printable

VERBS = ("serve", "worker", "run")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--store", type=Path, required=True, help="the service's store directory")
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    s = sub.add_parser("serve", help="the HTTP API")
    common(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8750)
    limits = ServerOptions()
    for flag, kind, text in (
        ("keep-alive-s", float, "seconds an idle connection is kept"),
        ("request-s", float, "seconds a request's head and body may take to arrive (then 408)"),
        ("max-connections", int, "connections open at once (past it: 503)"),
        ("backlog", int, "the listen socket's backlog"),
        ("threads", int, "requests handled at once"),
    ):  # fmt: skip
        field = flag.replace("-", "_")
        s.add_argument(f"--{flag}", dest=field, type=kind, default=getattr(limits, field),
                       metavar="N" if kind is int else "S",
                       help=f"{text} (default {getattr(limits, field):g})")
    w = sub.add_parser("worker", help="grade queued submissions on one device")
    common(w)
    where = w.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpu", type=int, help="the CUDA index of this worker's GPU")
    where.add_argument("--cpu", action="store_true", help="the Triton interpreter (untimed)")
    w.add_argument("--once", action="store_true", help="exit 0 when the queue is empty")
    w.add_argument("--name", default=None, help="worker name (default <host>:<GPU UUID|cpu>)")
    w.add_argument("--lease", type=float, default=60.0, help="lease seconds (renewed at 1/3)")
    w.add_argument("--config", type=Path, default=None, help="scoring.yaml for the grades")
    w.add_argument("--command", default=None,
                   help="grade with this command instead of the grader (words formatted with "
                        "{workspace} {report} {device} {gpu} {final}; it writes the report JSON "
                        "to {report})")  # fmt: skip
    w.add_argument("--executor", choices=("local", "docker"), default="local",
                   help="local: the grader's own isolation in this host's processes; docker: a "
                        "fresh container of --image per grade (grader.service.docker_executor)")
    w.add_argument("--image", default=None,
                   help="the grading image for --executor docker (built or pulled beforehand)")
    r = sub.add_parser("run", help="create and inspect runs, finalize them")
    rsub = r.add_subparsers(dest="action", required=True)
    c = rsub.add_parser("create", help="a new run and its agent's token")
    c.add_argument("name")
    common(c)
    c.add_argument("--max-per-hour", type=int, default=Limits.max_per_hour)
    c.add_argument("--max-upload-mb", type=float, default=Limits.max_upload_bytes / (1 << 20))
    c.add_argument("--max-queued", type=int, default=Limits.max_queued,
                   help="the run's grades queued or running at once; an upload past it gets 429")
    for action, text in (("status", "counts by state, best, final"),
                         ("best", "the best submission"),
                         ("report", "every submission, the best and its final regrade"),
                         ("finalize", "regrade the best on another GPU: the run's result"),
                         ("regrade", "queue another ordinary grade of a submission (a run: its "
                                     "best)")):  # fmt: skip
        a = rsub.add_parser(action, help=text)
        a.add_argument("run", metavar="RUN|SUBMISSION" if action == "regrade" else "RUN")
        common(a)
        if action == "finalize":
            a.add_argument("--allow-same-gpu", action="store_true",
                           help="let the final run on a GPU that graded the submission "
                                "(a one-GPU host; say so where the result is quoted)")
            a.add_argument("--no-wait", action="store_true", help="queue it and return")
            a.add_argument("--timeout", type=float, default=6 * 3600,
                           help="seconds to wait for the final (default 6 h)")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        if args.verb == "serve":
            return _serve(args)
        if args.verb == "worker":
            return _worker(args)
        if args.action != "create":
            _existing(args.store)
        with Store(args.store) as store:
            return _run(args, store)
    except (StoreError, ExecutorError) as exc:
        return _out(args, {"error": str(exc)}, str(exc), code=1)
    except ValueError as exc:
        return _out(args, {"error": str(exc)}, str(exc), code=2)


def _out(args: argparse.Namespace, obj: dict[str, Any], text: str, code: int = 0) -> int:
    if args.json:
        print(json.dumps(obj))
    else:
        # Names, statuses, reasons and log tails in it may be a submission's writing.
        print(printable(text), file=sys.stdout if code == 0 else sys.stderr)
    return code


def _existing(path: Path) -> None:
    """Refuse a store that is not there: reading verbs never make one."""
    path = path.expanduser()
    if not (path.is_file() or (path / DB_NAME).is_file()):
        raise StoreError(f"no store at {path} (serve or run create makes one)")


def _serve(args: argparse.Namespace) -> int:
    import errno
    import logging

    try:
        from grader.service.http_server import make_server
    except ImportError as exc:  # the service extra is not installed here
        why = (f"serve needs the service extra (FastAPI, uvicorn): pip install '.[service]' "
               f"or -r requirements-cpu.txt ({exc})")  # fmt: skip
        return _out(args, {"error": why}, why, code=1)

    # One line per request and per event on stderr (grader.service.access, uvicorn's own).
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        options = ServerOptions(keep_alive_s=args.keep_alive_s, request_s=args.request_s,
                                max_connections=args.max_connections, backlog=args.backlog,
                                threads=args.threads)  # fmt: skip
        server = make_server(args.store, args.host, args.port, options=options)
    except OSError as exc:
        why = ("the port is in use (another service, or this one still running?)"
               if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)))  # fmt: skip
        return _out(args, {"error": f"cannot listen on {args.host}:{args.port}: {why}"},
                    f"cannot listen on {args.host}:{args.port}: {why}", code=1)  # fmt: skip
    host, port = server.server_address[:2]
    token_file = args.store / "operator.token"
    _out(args, {"url": f"http://{host}:{port}", "store": str(args.store),
                "operator_token_file": str(token_file)},
         f"serving http://{host}:{port} (store {args.store}; the operator's token is in "
         f"{token_file}; OpenAPI at /docs)")  # fmt: skip
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _worker(args: argparse.Namespace) -> int:
    import shlex
    import signal

    from grader.config import load_config
    from grader.service.executors import CommandExecutor, LocalExecutor, check_importable
    from grader.service.worker import (
        Worker,
        WorkerOptions,
        cpu_device,
        default_name,
        gpu_device,
        gpu_room,
    )

    if args.gpu is not None:
        device = gpu_device(args.gpu)
    else:
        device = cpu_device(args.name or default_name(cpu_device("")))
    name = args.name or default_name(device)
    if args.executor == "docker":
        if args.command or not args.image:
            raise ValueError("--executor docker needs --image IMAGE and takes no --command")
        from grader.service.docker_executor import DockerExecutor, reap

        executor: Any = DockerExecutor(args.image, worker=name, config=args.config)
        # A worker grades one job at a time: a container with its name is from a run that died.
        reaped = reap(executor.client, name)
        if reaped and not args.json:
            print(f"worker {name}: removed {reaped} container(s) a previous run left",
                  file=sys.stderr)  # fmt: skip
    elif args.image:
        raise ValueError("--image is for --executor docker")
    elif args.command:
        executor = CommandExecutor(shlex.split(args.command))
    else:
        check_importable()  # every grade would fail otherwise: say so once, before any is taken
        executor = LocalExecutor(config=args.config, forbidden=[args.store])
    stopping = False

    def stop(*_: Any) -> None:  # SIGTERM: finish the grade in hand, then exit
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with Store(args.store) as store:
        config = load_config(args.config) if args.config else load_config()
        room = gpu_room(device, config) if device.index is not None else None
        worker = Worker(store, device, executor, name=name, room=room,
                        options=WorkerOptions(lease_s=args.lease, once=args.once))  # fmt: skip
        worker.say(f"on {device.name} {device.uuid}, store {args.store}")
        graded = worker.run(stop=lambda: stopping)
    return _out(args, {"worker": name, "graded": graded}, f"worker {name}: graded {graded}")


def _run(args: argparse.Namespace, store: Store) -> int:
    if args.action == "create":
        limits = Limits(max_per_hour=args.max_per_hour,
                        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
                        max_queued=args.max_queued)  # fmt: skip
        run, token = store.create_run(args.name, limits)
        return _out(args, {"run": run.id, "token": token},
                    f"run {run.id} ({run.name})\nagent token: {token}\n"
                    f"give the agent: GRADER_URL=http://HOST:PORT GRADER_TOKEN={token}")
    if args.action == "regrade":
        return _regrade(args, store)
    store.run(args.run)
    if args.action == "status":
        status = runs.run_status(store, args.run)
        return _out(args, status, runs.render_status(status))
    if args.action == "best":
        best = store.best(args.run)
        if best is None:
            return _out(args, {"best": None}, "no scored submission yet")
        view = runs.submission_view(store, best[0])
        return _out(args, {"best": view}, f"best: submission {view['id']} (commit "
                    f"{view['commit'][:12]}) score {view['score']}")
    if args.action == "report":
        report = runs.run_report(store, args.run)
        return _out(args, report, runs.render_run_report(report))
    return _finalize(args, store)


def _regrade(args: argparse.Namespace, store: Store) -> int:
    """Queue another ordinary grade of submission ``args.run`` (digits), or of run ``args.run``'s
    best submission."""
    if args.run.isdigit():
        submission = store.submission(int(args.run))
    else:
        store.run(args.run)  # Unknown: no such run
        best = store.best(args.run)
        if best is None:
            raise StoreError(f"run {args.run} has no scored submission to regrade (name one: "
                             "run regrade SUBMISSION)")  # fmt: skip
        submission = best[0]
    grade = store.regrade(submission.id)
    return _out(args, {"grade": grade.to_dict()},
                f"queued grade {grade.id} of submission {submission.id} (run {submission.run})")


def _finalize(args: argparse.Namespace, store: Store) -> int:
    final = store.request_final(args.run, allow_same_gpu=args.allow_same_gpu)
    if not args.json:
        print(f"final regrade of submission {final.submission}: grade {final.id}, "
              f"{final.state.value}; waiting for a worker on a {final.gpu_kind} other than "
              f"the ones that graded it" if not args.no_wait else "", file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    while not args.no_wait and final.state.value != "done" and time.monotonic() < deadline:
        time.sleep(2.0)
        final = store.grade(final.id)
    view = runs.final_view(store, final)
    report = runs.run_report(store, args.run)
    text = runs.render_run_report(report)
    code = 0
    if not args.no_wait and final.state.value != "done":
        code, text = 1, f"the final regrade is still {final.state.value} after {args.timeout:g} s"
    elif final.state.value == "done" and final.status == "grader_error":
        code = 1
    return _out(args, {"run": args.run, **view}, text, code=code)


__all__ = ["VERBS", "main"]
