"""The wheelhouse that carries ``inspect_ai`` to the GPU machine, which has no network
(``bench/gpu_session.sh inspect-run`` installs from it).

    python bench/adapters/inspect_wheelhouse.py [--dest .wheelhouse]

Downloads ``inspect_ai`` and its dependencies for CPython 3.12 on x86_64 Linux (the machine's), then
makes it fit the 64 MiB a device call carries with the tree, dropping only what that run never
touches:

- numpy: the machine's own (2.5.2, beside its torch) satisfies inspect_ai's unpinned ``numpy``;
- ``inspect_ai/binaries/``: the sandbox-tools executables (amd64 and arm64, 14 MiB each) that
  Inspect copies into a Docker sandbox for its stateful tools; the run uses the local sandbox;
- ``botocore/data/<service>/``: the AWS service models, read only when an S3 client is made (the
  run's logs are local files); the top-level files of ``data/`` (endpoints, partitions) stay.

A repacked wheel keeps its name; its ``RECORD`` loses the dropped files' lines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")


def repack(wheel: Path, drop: Callable[[str], bool]) -> int:
    """Rewrite ``wheel`` without the members ``drop`` names (and their RECORD lines); bytes
    saved."""
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if drop(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if not drop(ln.split(",", 1)[0])).encode()
            dst.writestr(info, data)
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dest", type=Path, default=Path(".wheelhouse"))
    args = parser.parse_args(argv)
    platforms = [w for p in PLATFORMS for w in ("--platform", p)]
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--python-version",
                           "3.12", *platforms, "--only-binary=:all:", "-d", str(args.dest),
                           "inspect_ai"])  # fmt: skip
    for wheel in args.dest.glob("numpy-*.whl"):
        wheel.unlink()
    for wheel in args.dest.glob("inspect_ai-*.whl"):
        saved = repack(wheel, lambda name: name.startswith("inspect_ai/binaries/"))
        print(f"{wheel.name}: {saved >> 20} MiB of sandbox-tools binaries dropped")
    for wheel in args.dest.glob("botocore-*.whl"):
        saved = repack(wheel, lambda name: name.startswith("botocore/data/")
                       and name.count("/") > 2)  # fmt: skip
        print(f"{wheel.name}: {saved >> 20} MiB of AWS service models dropped")
    total = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(f"{args.dest}: {len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
