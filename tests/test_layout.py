"""The tree's shape, held by parsing it (no import runs): module sizes, no import cycles, the
trust boundary as a folder boundary (`grader/child/` imports nothing else of `grader/`), and
citations that stay inside the repository (every "CONTRACT §" names a section of CONTRACT.md),
and bench/'s scripts held to the same size limit and kept from shadowing a package."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("grader", "reference", "task")
MAX_LINES = 700
# What code under grader/child/ may import besides itself (CONTRACT §6: the parent passes the rest):
# also NVML's bindings, which torch's CUDA build depends on and itself reads GPU memory with, and
# ``solution``, the submission, which the harness is there to import.
CHILD_MAY_IMPORT = {"torch", "triton", "numpy", "task", "reference", "pynvml", "solution"}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()
# bench/'s scripts and the scripts kept with their records (bench/results/): not a package, but run
# as ``python bench/<folder>/<script>.py``, which puts the script's folder first on sys.path.
BENCH = sorted((REPO / "bench").rglob("*.py"))


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (a function-level import is a
    dependency too: it only hides a cycle until the function runs)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # ``from grader import census`` imports the module grader.census.
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if f"{base}.{alias.name}" in MODULES)
    return found


def _project(imported: str) -> str | None:
    """The project module an import names (its longest known prefix), None if not ours."""
    parts = imported.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


GRAPH = {name: {m for i in _imports(name, path) if (m := _project(i)) and m != name}
         for name, path in MODULES.items()}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_the_size_limit(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(REPO)} has {lines} lines > {MAX_LINES}"


@pytest.mark.parametrize("path", BENCH, ids=lambda p: str(p.relative_to(REPO)))
def test_no_bench_module_is_over_the_size_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines > {MAX_LINES}"


def _importable_elsewhere(name: str) -> str | None:
    """What a top-level ``import name`` finds outside bench/ (the standard library, the project's
    packages, an installed distribution, a test helper), or None."""
    if name in sys.stdlib_module_names:
        return "the standard library"
    if name in PACKAGES:
        return "the project"
    bench = REPO / "bench"
    path = [p for p in sys.path if not Path(p or ".").resolve().is_relative_to(bench)]
    spec = importlib.machinery.PathFinder.find_spec(name, [*path, str(REPO), str(REPO / "tests")])
    return None if spec is None else str(spec.origin or spec.submodule_search_locations)


def test_no_bench_module_shadows_a_package() -> None:
    """A script's folder comes first on sys.path when it runs (and tests put bench's folders
    there to import its helpers), so a bench module or folder named like a package hides that
    package from every import the script makes: bench/reference.py hid `reference` and had to put
    the repository's root before its own folder to reach it."""
    names = {p.stem: p for p in BENCH} | {p.parent.name: p.parent for p in BENCH}
    names.pop("bench", None)  # the folder itself: `bench` is what the scripts import it as
    bad = [f"{path.relative_to(REPO)} shadows {name!r} ({where})"
           for name, path in sorted(names.items()) if (where := _importable_elsewhere(name))]
    assert not bad, "\n".join(bad)


def _expand(pattern: str) -> list[str]:
    """A record's name as the index writes it, its braces expanded (``a{1,2}{.json,.md}``)."""
    import re

    group = re.search(r"\{([^{}]*)\}", pattern)
    if group is None:
        return [pattern]
    head, tail = pattern[: group.start()], pattern[group.end():]
    return [name for alt in group.group(1).split(",") for name in _expand(head + alt + tail)]


def test_every_record_is_in_the_results_index() -> None:
    """bench/results/README.md names every file and folder under bench/results/ in the first
    column of its index, and nothing that is not there: a record nobody can find is lost."""
    import re

    text = (REPO / "bench" / "results" / "README.md").read_text()
    index = text[text.index("## Index"):text.index("## Current headlines")]
    named: set[str] = set()
    for row in re.findall(r"^\| (`[^|]*) \|", index, re.MULTILINE):
        for pattern in re.findall(r"`([^`]+)`", row):
            named.update(_expand(pattern))
    records = {p.name + ("/" if p.is_dir() else "") for p in (REPO / "bench" / "results").iterdir()
               if p.name != "README.md"}
    assert not records - named, f"records missing from the index: {sorted(records - named)}"
    assert not named - records, f"indexed but not under bench/results/: {sorted(named - records)}"


def test_no_import_cycle() -> None:
    """A depth-first search over the import graph of grader/, reference/ and task/ (a package's
    ``__init__`` counts as the package, and importing a submodule does not import its parent's
    siblings)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt):], nxt]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)


def test_the_child_imports_nothing_of_the_parent() -> None:
    """grader/child/ runs beside the submission: besides itself it imports only the standard
    library, torch, triton, numpy (and NVML's bindings), the frozen block, the reference and the
    submission."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for name, path in MODULES.items():
        if not name.startswith("grader.child"):
            continue
        for imported in sorted(_imports(name, path)):
            top = imported.split(".")[0]
            inside = imported == "grader.child" or imported.startswith("grader.child.")
            if not (inside or top in stdlib or top in CHILD_MAY_IMPORT):
                bad.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not bad, "\n".join(bad)


def _reaches(start: str) -> set[str]:
    """Every project module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


# The judge of the timing phase, and what drives the children and talks to them: the judge reads
# a shape's samples (`grader.samples`) and can be read, tested and reused without the protocol.
JUDGE = "grader.timing"
DRIVER = ("grader.interleave", "grader.conversation", "grader.sandbox", "grader.timing_run")


def test_the_judge_does_not_import_the_driver() -> None:
    """`grader.timing` reaches none of the driver's modules, by any chain of imports."""
    reached = _reaches(JUDGE)
    assert not reached & set(DRIVER), f"{JUDGE} imports {sorted(reached & set(DRIVER))}"
    assert "grader.samples" in reached


def test_the_checks_see_what_they_guard() -> None:
    """The parser finds the imports these tests are about (a test that cannot fail is none)."""
    assert "grader.child.channel" in GRAPH["grader.child.gate"]
    assert "grader.child.census" in GRAPH["grader.census"]
    assert "grader.report" in GRAPH["grader.timing"]
    assert {"grader.samples", "grader.sandbox"} <= _reaches("grader.interleave")
    assert len([n for n in MODULES if n.startswith("grader.child.")]) >= 9


def test_gpu_session_usage_names_exactly_its_phases() -> None:
    """bench/gpu_session.sh's usage line lists every phase it has a case for, and no other: an
    edit that drops a case (as one did on 2026-12-04) or forgets the usage fails here."""
    import re

    text = (REPO / "bench" / "gpu_session.sh").read_text()
    usage = re.search(r"phase=\$\{1:\?usage: bash bench/gpu_session.sh ([^}]*)\}", text)
    assert usage is not None
    cases = set(re.findall(r"^([a-z0-9-]+)\)$", text, re.MULTILINE))
    assert set(usage.group(1).split("|")) == cases



# --- citations: the contract is CONTRACT.md, and nothing points outside the repository ---------
# (This file's own examples are assembled from pieces, so that it keeps the rules it tests.)

CONTRACT = REPO / "CONTRACT.md"
# Records of runs keep the host paths of the machine they ran on (a traceback's files, pytest's
# rootdir): evidence of where a number was measured, not a pointer for a reader to follow.
RECORDS = "bench/results/"
# A section heading of CONTRACT.md: "## §3 The correctness gate", or "### §N.M Title".
SECTION = re.compile(r"^#{2,3} §(\d+(?:\.\d+)*) \S", re.MULTILINE)
# "CONTRACT §4", "CONTRACT §4–§5", "CONTRACT §2, §6", "CONTRACT §N.M" (a trailing "." ends it).
CITATION = re.compile(r"\bCONTRACT (§\d+(?:\.\d+)*(?:\s*(?:[–,-]|and)\s*§\d+(?:\.\d+)*)*)")
SECTION_NUMBER = re.compile(r"§(\d+(?:\.\d+)*)")
# What counts as a pointer outside the repository:
# - a relative path that starts with one or more "../" and, resolved against the citing file's
#   folder, lands above the repository's root;
UP_PATH = re.compile(r"(?<![\w./-])(?:\.\./)+[\w.-]+(?:/[\w.-]+)*")
# - an absolute path into a host's own folders: the machine's work folder (where checkouts and
#   the project's shared notes live), a macOS or Linux home but the agent image's (agent_env/
#   defines it); not checked in records (above);
HOST_PATH = re.compile(r"(?<![\w.-])/(?:work|Users)/[\w.-]+|(?<![\w.-])/home/(?!agent\b)[\w.-]+")
# - a path through a folder named shared or research (the project's notes outside the tree)
#   that names nothing in the repository, from its root or from the citing file's folder;
NOTES_PATH = re.compile(r"(?<![\w./-])(?:[\w-][\w.-]*/)*(?:shared|research)/[\w.-]+(?:/[\w.-]+)*")
# - and the contract's old name as a word (an identifier that merely starts with it is not).
OLD_NAME = re.compile(r"\b" + "SP" + r"EC\b")


@cache
def _texts() -> dict[str, str]:
    """Every tracked text file (``git ls-files``; in a copy without git, every file outside
    hidden folders but .ci and outside caches), by its path from the root, with JSON's escaped §
    read as §."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                  and not any(part.startswith(".") and part != ".ci" or part == "__pycache__"
                              for part in p.relative_to(REPO).parts)]
    texts = {}
    for rel in filter(None, listed):
        path = REPO / rel
        if not path.is_file():
            continue  # deleted in the work tree, not yet in the index
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[rel] = data.decode("utf-8").replace("\\u00a7", "§")
        except UnicodeDecodeError:
            continue
    return texts


def _sections() -> set[str]:
    return set(SECTION.findall(CONTRACT.read_text()))


def _cited(text: str) -> list[str]:
    """Every section number a "CONTRACT §" citation in ``text`` names."""
    return [n for m in CITATION.finditer(text) for n in SECTION_NUMBER.findall(m.group(1))]


def outside_pointers(rel: str, text: str) -> list[str]:
    """The pointers out of the repository in the text of the file at ``rel`` (rules above)."""
    here = os.path.dirname(os.path.normpath(REPO / rel))
    found = []
    for m in UP_PATH.finditer(text):
        target = os.path.normpath(os.path.join(here, m.group()))
        if os.path.commonpath([target, str(REPO)]) != str(REPO):
            found.append(m.group())
    if not rel.startswith(RECORDS):
        found += HOST_PATH.findall(text)
    for m in NOTES_PATH.finditer(text):
        if not ((REPO / m.group()).exists() or os.path.exists(os.path.join(here, m.group()))):
            found.append(m.group())
    return found


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def test_the_contract_has_its_sections() -> None:
    """CONTRACT.md keeps the numbering code cites: §1 the block ... §8 the reference."""
    numbers = SECTION.findall(CONTRACT.read_text())
    top = [n for n in numbers if "." not in n]
    assert top == [str(n) for n in range(1, 9)], f"CONTRACT.md's sections are {numbers}"
    assert len(numbers) == len(set(numbers)), f"a section number twice in {numbers}"


def test_every_contract_citation_names_a_section() -> None:
    sections = _sections()
    bad, count = [], 0
    for rel, text in _texts().items():
        for m in CITATION.finditer(text):
            count += 1
            bad += [f"{rel}:{_line(text, m.start())}: {m.group()}"
                    for n in SECTION_NUMBER.findall(m.group(1)) if n not in sections]
    # CONTRACT.md refers to its own sections without the prefix.
    bad += [f"CONTRACT.md: §{n}" for n in SECTION_NUMBER.findall(CONTRACT.read_text())
            if n not in sections]
    assert count > 50, f"only {count} citations found: is the pattern still the tree's?"
    assert not bad, "citations of sections CONTRACT.md lacks:\n" + "\n".join(bad)


def test_no_citation_of_the_old_contract_remains() -> None:
    bad = [f"{rel}:{_line(text, m.start())}: {text[m.start():m.start() + 20]!r}"
           for rel, text in _texts().items() for m in OLD_NAME.finditer(text)]
    assert not bad, "the contract is CONTRACT.md now (cite CONTRACT §N):\n" + "\n".join(bad)


def test_nothing_points_outside_the_repository() -> None:
    bad = [f"{rel}:{_line(text, text.index(p))}: {p}" for rel, text in _texts().items()
           for p in outside_pointers(rel, text)]
    assert not bad, "pointers outside the repository:\n" + "\n".join(bad)


def test_the_citation_checks_catch_what_they_are_for() -> None:
    """Each rule above on text it must refuse and on text it must let through."""
    up, notes = "../" + "shared/" + "SP" + "EC.md", "research" + "/graders-and-exploits.md"
    work = "/wo" + "rk/main/reference/block.py"
    assert outside_pointers("README.md", f"see `{up}`") == [up]
    assert outside_pointers("README.md", f'File "{work}", line 3') == [work[:10]]
    assert not outside_pointers(RECORDS + "run/bench.log", f'File "{work}", line 3')
    assert outside_pointers("agent_env/Dockerfile.agent", "(" + "../" * 2 + "Dockerfile)")
    assert not outside_pointers("agent_env/Dockerfile.agent", "(../Dockerfile)")
    assert not outside_pointers("tests/test_service_store_local.py", '"/home/agent/workspace"')
    assert outside_pointers("README.md", f"({notes})") == [notes]
    assert OLD_NAME.search("SP" + "EC §2") and not OLD_NAME.search("SP" + "EC_ENV = 1")
    text = "CONTRACT §4–§5 and CONTRACT §2, §8. CONTRACT §3. CONTRACT " + "§9.1"
    assert _cited(text) == ["4", "5", "2", "8", "3", "9.1"]
    assert "9.1" not in _sections() and "3" in _sections()


README_MAX_LINES = 300


def _layout_section() -> str:
    text = (REPO / "README.md").read_text()
    start, end = text.index("\n## Layout"), text.index("\n## Working on it")
    return text[start:end]


def test_the_readme_stays_a_guide() -> None:
    """README.md is a guide with a table of contents, not a log: measurements live in
    bench/results/README.md, the long form in docs/."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines > {README_MAX_LINES}: move detail to docs/ or "
        "bench/results/README.md")
    assert "## Contents" in lines, "README.md lost its table of contents (## Contents)"


def test_every_module_is_on_the_readme_map() -> None:
    """The README's layout table is the map of the tree: every module of the packages, bench/
    and metr/ is named there (by its file name or module name in backticks, or its path)."""
    layout = _layout_section()
    missing = []
    for top in (*PACKAGES, "bench", "metr"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO)
            if path.name == "__init__.py" or {"__pycache__", "results"} & set(rel.parts):
                continue
            names = (f"`{path.name}`", f"`{path.stem}`", str(rel))
            if not any(name in layout for name in names):
                missing.append(str(rel))
    assert not missing, f"modules the README's layout table does not name: {missing}"

