"""Assemble the agent's environment: the task kit, a fresh workspace and ``env.sh``; no reference.

    python agent_env/build_agent_env.py DEST [--force]

writes::

    DEST/kit/          the grader's public part: task/ (frozen block, inputs, oracle, PROMPT.md),
                       grader/ (gate, sandbox, timing, published speedups; the agent's check
                       and submit in grader/agent/, the store and the service's client they use
                       in grader/service/),
                       scoring.yaml, PROMPT.md (a copy at the top, for finding it)
    DEST/workspace/    a git repository: the template's solution.py, README.md, .gitignore,
                       one commit ("start"), user.name/user.email "agent" in its .git/config
    DEST/env.sh        source it: TASK_KIT, PYTHONPATH (the kit) and GRADER_STORE (DEST/store,
                       the local store; the operator sets GRADER_URL and GRADER_TOKEN instead
                       when a grading service takes the submissions)
    DEST/MANIFEST.json every file shipped, with its sha256, and what was left out and why

The reference (``reference/``: kernels and plan tables) is never copied: the agent's tools need
only its published numbers (``grader/published_speedups.json``). The build refuses to finish if a
file of ``reference/`` (by name or by content) ended up in DEST. Tests, benchmarks and the
repository's git history are left out too. ``Dockerfile.agent`` next to this file turns DEST
into the agent's image (ENVIRONMENT.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
TEMPLATE_DIR = REPO_ROOT / "workspace_template"

# What the kit holds: directory → file patterns, plus single files. Everything else is left out.
KIT_DIRS: dict[str, tuple[str, ...]] = {
    "task": ("*.py", "PROMPT.md"),
    "grader": ("*.py", "*.json"),
    "grader/child": ("*.py",),  # what runs next to the submission (channel, census...)
    "grader/agent": ("*.py",),  # the agent's tools: check, submit
    "grader/service": ("*.py",),  # what submit uses: the store, archives, the service's client
}
KIT_FILES = ("scoring.yaml",)
# The files of the template that make the workspace.
WORKSPACE_FILES = ("solution.py", "README.md", ".gitignore")
LEFT_OUT = {
    "reference/": "the reference solution: the bar to beat, never shown to the agent",
    "tests/": "the grader's tests and their corpus of submissions",
    "bench/": "calibration and benchmark scripts and results",
    "agent_env/": "how this environment is built",
    ".git/": "the task repository's history (it holds the reference too)",
}
_START_ID = {
    "GIT_AUTHOR_NAME": "task",
    "GIT_AUTHOR_EMAIL": "task@localhost",
    "GIT_COMMITTER_NAME": "task",
    "GIT_COMMITTER_EMAIL": "task@localhost",
}
# The agent's identity, written into the workspace's .git/config: the image has no global or
# system git config, and without an identity the agent's first `git commit` fails ("unable to
# auto-detect email address").
AGENT_ID = {"user.name": "agent", "user.email": "agent@localhost"}

ENV_SH = """\
# Source this file (". env.sh") to use the task kit from your workspace.
_here="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export TASK_KIT="$_here/kit"
export PYTHONPATH="$TASK_KIT${PYTHONPATH:+:$PYTHONPATH}"
export GRADER_STORE="${GRADER_STORE:-$_here/store}"
unset _here
"""


class BuildError(RuntimeError):
    """The environment could not be built, or it would have shipped the reference."""


@dataclass(frozen=True)
class Manifest:
    """What a build shipped.

    Attributes:
        kit: Kit file path (relative to DEST) → sha256.
        workspace: Workspace file path → sha256.
        workspace_commit: The workspace's first commit.
        left_out: Path → why it is not in the environment.
    """

    kit: dict[str, str]
    workspace: dict[str, str]
    workspace_commit: str
    left_out: dict[str, str]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_kit(dest: Path, repo_root: Path = REPO_ROOT) -> dict[str, str]:
    """Copy the kit's files from ``repo_root`` into ``dest``; return path → sha256."""
    shipped: dict[str, str] = {}
    for directory, patterns in KIT_DIRS.items():
        for pattern in patterns:
            for src in sorted((repo_root / directory).glob(pattern)):
                if src.is_file():
                    rel = src.relative_to(repo_root)
                    target = dest / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, target)
                    shipped[str(rel)] = _sha256(target)
    for name in KIT_FILES:
        shutil.copy2(repo_root / name, dest / name)
        shipped[name] = _sha256(dest / name)
    prompt = repo_root / "task" / "PROMPT.md"
    if prompt.is_file():
        shutil.copy2(prompt, dest / "PROMPT.md")
        shipped["PROMPT.md"] = _sha256(dest / "PROMPT.md")
    return shipped


def _git(root: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_START_ID, GIT_CONFIG_NOSYSTEM="1")
    proc = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-C", str(root), *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def new_workspace(dest: Path, template: Path = TEMPLATE_DIR) -> str:
    """Start a workspace: copy the template's files into ``dest``, ``git init``, set the agent's
    identity in the repository's own config (`AGENT_ID`), commit.

    Returns:
        The first commit's id.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKSPACE_FILES:
        shutil.copy2(template / name, dest / name)
    _git(dest, "init", "--quiet", "--initial-branch=main")
    for key, value in AGENT_ID.items():
        _git(dest, "config", "--local", key, value)
    _git(dest, "add", "--all", ".")
    _git(dest, "commit", "--quiet", "-m", "start: the plain PyTorch block from the template")
    return _git(dest, "rev-parse", "HEAD")


def assert_no_reference(dest: Path, repo_root: Path = REPO_ROOT) -> None:
    """Refuse a build that holds anything of ``reference/``, by name or by content.

    Raises:
        BuildError: A path named ``reference`` or a file equal to a reference file is in DEST.
    """
    ref_dir = repo_root / "reference"
    ref_hashes = {
        _sha256(p): str(p.relative_to(repo_root)) for p in ref_dir.rglob("*") if p.is_file()
    } if ref_dir.is_dir() else {}  # fmt: skip
    for path in dest.rglob("*"):
        rel = path.relative_to(dest)
        if any(part.startswith("reference") for part in rel.parts):
            raise BuildError(f"{rel} is named like the reference; the agent must not get it")
        if path.is_file() and ".git" not in rel.parts:
            twin = ref_hashes.get(_sha256(path))
            if twin is not None:
                raise BuildError(f"{rel} has the same content as {twin}")


def build(dest: Path, *, repo_root: Path = REPO_ROOT, force: bool = False) -> Manifest:
    """Build the agent's environment into ``dest`` (see the module docstring).

    Raises:
        BuildError: ``dest`` exists and is not empty (without ``force``), or the reference leaked.
    """
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise BuildError(f"{dest} exists and is not empty (use --force to replace it)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)
    kit = build_kit(dest / "kit", repo_root)
    commit = new_workspace(dest / "workspace", repo_root / "workspace_template")
    workspace = {
        name: _sha256(dest / "workspace" / name) for name in WORKSPACE_FILES
    }
    (dest / "env.sh").write_text(ENV_SH)
    assert_no_reference(dest, repo_root)
    manifest = Manifest(
        kit={f"kit/{k}": v for k, v in kit.items()},
        workspace={f"workspace/{k}": v for k, v in workspace.items()},
        workspace_commit=commit,
        left_out=dict(LEFT_OUT),
    )
    (dest / "MANIFEST.json").write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dest", type=Path, help="directory to build the environment in")
    parser.add_argument("--force", action="store_true", help="replace a non-empty DEST")
    args = parser.parse_args(argv)
    try:
        manifest = build(args.dest.resolve(), force=args.force)
    except BuildError as exc:
        print(f"build_agent_env: {exc}", file=sys.stderr)
        return 1
    dest = args.dest.resolve()
    print(f"built {dest}: {len(manifest.kit)} kit files, workspace at {dest / 'workspace'} "
          f"(commit {manifest.workspace_commit[:12]}); reference left out")
    print(f"use it: . {dest / 'env.sh'} && cd {dest / 'workspace'} && python -m grader check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
