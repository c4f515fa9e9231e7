"""The service's upload check (`grader.service.archive`): real `git archive` output is accepted with
git's own tree id, and every unsafe, oversized or malformed archive is refused with its reason."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from grader_helpers import git, make_workspace

from grader.config import load_config
from grader.service.archive import (
    CheckedTree,
    UploadLimits,
    UploadRejected,
    check_upload,
    extract_archive,
    git_tree_id,
    make_archive,
)

LIMITS = UploadLimits()
SOLUTION = b"import torch\n"


def _file(name: str, data: bytes = SOLUTION, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, b""


def _tar(*members: tuple[tarfile.TarInfo, bytes], gz: bool = False) -> bytes:
    """A tar (or tar.gz) of ``members`` exactly as given: tarfile's writer checks no names."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _rejected(data: bytes, limits: UploadLimits = LIMITS) -> UploadRejected:
    with pytest.raises(UploadRejected) as caught:
        check_upload(data, limits)
    return caught.value


def _git_archive(ws: Path, fmt: str) -> bytes:
    return subprocess.run(
        ["git", "archive", f"--format={fmt}", "HEAD"], cwd=ws, check=True, capture_output=True
    ).stdout


# ----------------------------------------------------------------------------- accepted


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # "foo.c" < "foo/" < "foo0" in git's order, but "foo" < "foo.c" in plain name order: a tree
    # id computed with the wrong sort would differ. The long name needs a pax header.
    ws = make_workspace(tmp_path_factory.mktemp("ws") / "ws", {
        "solution.py": "import torch\n",
        "foo.c": "int x;\n",
        "foo/bar.py": "y = 1\n",
        "foo0": "",
        "kernels/deep/nested/ünïcode.py": "z = 2\n",
        "kernels/" + "long_name_" * 12 + ".py": "w = 3\n",
        "run.sh": "#!/bin/sh\necho hi\n",
    })  # fmt: skip
    (ws / "run.sh").chmod(0o755)
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "executable run.sh")
    return ws


@pytest.mark.parametrize("fmt", ["tar", "tar.gz"])
def test_git_archive_gives_gits_tree_id_and_commit(workspace: Path, fmt: str) -> None:
    checked = check_upload(_git_archive(workspace, fmt), LIMITS)
    assert checked.tree == git(workspace, "rev-parse", "HEAD^{tree}")
    assert checked.commit == git(workspace, "rev-parse", "HEAD")
    assert set(checked.files) == set(git(workspace, "ls-files", "-z").strip("\0").split("\0"))
    assert checked.executable == {"run.sh"}
    assert checked.files["foo/bar.py"] == b"y = 1\n"
    assert "pax_global_header" not in checked.files


def test_same_files_give_the_same_canonical_archive(workspace: Path, tmp_path: Path) -> None:
    plain = check_upload(_git_archive(workspace, "tar"), LIMITS)
    gzipped = check_upload(_git_archive(workspace, "tar.gz"), LIMITS)
    assert plain.archive == gzipped.archive == check_upload(plain.archive, LIMITS).archive
    assert plain.sha256 == gzipped.sha256
    # The canonical archive is byte for byte what the local `submit` stores for the same tree.
    assert plain.archive == make_archive(workspace, list(plain.files))
    names = extract_archive(plain.archive, tmp_path / "out")
    assert sorted(names) == sorted(plain.files)
    assert (tmp_path / "out" / "run.sh").stat().st_mode & 0o111
    assert (tmp_path / "out" / "foo" / "bar.py").read_bytes() == b"y = 1\n"


def test_uploads_differing_only_in_times_and_order_are_the_same_tree() -> None:
    a = _tar(_file("solution.py"), _file("lib/k.py", b"k", 0o775))
    later = [_file("./lib/k.py", b"k", 0o700), _file("./solution.py")]
    for info, _ in later:
        info.mtime, info.uid, info.uname = 1, 1000, "agent"
    b = _tar(_special("./", tarfile.DIRTYPE), *later, gz=True)
    first, second = check_upload(a, LIMITS), check_upload(b, LIMITS)
    assert first.sha256 == second.sha256 and first.tree == second.tree
    assert set(second.files) == {"solution.py", "lib/k.py"}
    assert second.commit is None


def test_tree_id_of_an_empty_file_and_a_nested_executable() -> None:
    # What `git mktree` gives for one empty blob named "a".
    assert git_tree_id({"a": b""}, set()) == "496d6428b9cf92981dc9495211e6e1120fb6f2ba"
    assert git_tree_id({"a": b""}, {"a"}) != git_tree_id({"a": b""}, set())
    assert git_tree_id({"d/a": b""}, set()) != git_tree_id({"a": b""}, set())


def test_a_pax_global_header_file_is_not_part_of_the_tree() -> None:
    data = _tar(_file("pax_global_header", b"52 comment=x\n"), _file("solution.py"))
    assert set(check_upload(data, LIMITS).files) == {"solution.py"}


def test_limits_come_from_scoring_yaml() -> None:
    limits = load_config().limits
    upload = UploadLimits.of(limits)
    assert upload.max_files == limits.tree_max_files
    assert upload.max_file_bytes == int(limits.file_max_mb * (1 << 20))
    assert upload.max_tree_bytes == int(limits.tree_max_mb * (1 << 20))
    assert upload.max_upload_bytes == UploadLimits().max_upload_bytes


# ----------------------------------------------------------------------------- refused: sizes


def test_too_large_an_upload_is_refused_before_reading() -> None:
    error = _rejected(b"\0" * 2000, UploadLimits(max_upload_bytes=1000))
    assert error.http_status == 413
    assert "2,000 bytes" in str(error) and "1,000 bytes" in str(error)


def test_too_many_files() -> None:
    data = _tar(_file("solution.py"), *(_file(f"f{i}.py") for i in range(3)))
    error = _rejected(data, UploadLimits(max_files=3))
    assert error.http_status == 413
    assert "more than 3 files (at 'f2.py')" in str(error)


def test_too_large_a_file() -> None:
    data = _tar(_file("solution.py"), _file("w.bin", bytes(101)))
    error = _rejected(data, UploadLimits(max_file_bytes=100))
    assert error.http_status == 413
    assert "'w.bin' is 101 bytes; the limit per file is 100 bytes" in str(error)


def test_too_large_a_tree() -> None:
    data = _tar(*(_file(name, bytes(100)) for name in ("solution.py", "a", "b")), gz=True)
    error = _rejected(data, UploadLimits(max_tree_bytes=250))
    assert error.http_status == 413
    assert "300 bytes at 'b'; the limit for the tree is 250 bytes" in str(error)


def test_too_many_members() -> None:
    dirs = [_special(f"d{i}/", tarfile.DIRTYPE) for i in range(6)]
    error = _rejected(_tar(_file("solution.py"), *dirs), UploadLimits(max_members=5))
    assert error.http_status == 413
    assert "more than 5 members (at 'd4')" in str(error)


def _gzip_of_zeros(header: bytes, zeros: int) -> bytes:
    """gzip of ``header`` and ``zeros`` zero bytes, fed in 1 MiB chunks (never held whole)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [deflate.compress(header)]
    chunk = bytes(1 << 20)
    for _ in range(zeros // len(chunk)):
        parts.append(deflate.compress(chunk))
    return b"".join(parts) + deflate.flush()


def test_a_gzip_bomb_is_refused_quickly_and_in_little_memory() -> None:
    # 1 GiB of zeros behind a tar header that says so: about 1 MB on the wire.
    info, _ = _file("weights.bin", bytes(0))
    info.size = 1 << 30
    bomb = _gzip_of_zeros(info.tobuf(tarfile.PAX_FORMAT), 1 << 30)
    assert len(bomb) < LIMITS.max_upload_bytes
    tracemalloc.start()
    start = time.perf_counter()
    try:
        error = _rejected(bomb)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.http_status == 413
    assert "compression bomb" in str(error)
    assert elapsed < 2.0
    assert peak < 64 << 20, f"peak {peak / (1 << 20):.0f} MiB while refusing the bomb"


def test_a_small_file_that_inflates_too_far_is_refused_by_the_ratio() -> None:
    # 3 MiB of zeros is within every size limit, but 3 KB of gzip inflating 1000x is not.
    data = _tar(_file("solution.py"), _file("zeros.bin", bytes(3 << 20)), gz=True)
    error = _rejected(data)
    assert error.http_status == 413
    assert "compression bomb" in str(error) and f"{len(data):,} received" in str(error)


# ----------------------------------------------------------------------------- refused: members


@pytest.mark.parametrize(
    ("kind", "linkname", "reason"),
    [
        (tarfile.SYMTYPE, "/etc/passwd", "'link' is a symlink"),
        (tarfile.LNKTYPE, "solution.py", "'link' is a hard link"),
        (tarfile.CHRTYPE, "", "'link' is a character device"),
        (tarfile.BLKTYPE, "", "'link' is a block device"),
        (tarfile.FIFOTYPE, "", "'link' is a fifo"),
        (b"V", "", "'link' is a tar member of type b'V'"),
    ],
)
def test_links_devices_and_others_are_refused(kind: bytes, linkname: str, reason: str) -> None:
    error = _rejected(_tar(_file("solution.py"), _special("link", kind, linkname)))
    assert error.http_status == 400
    assert reason in str(error)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("/etc/cron.d/x", "'/etc/cron.d/x' is an absolute path"),
        ("../escape.py", "'..' component"),
        ("lib/../../escape.py", "'..' component"),
        ("lib/./k.py", "'.' or '..' component"),
        ("lib//k.py", "an empty"),
        (".git/hooks/pre-commit", "is inside .git"),
        ("lib/.GIT/config", "is inside .git"),
        ("lib\\k.py", "a backslash"),
    ],
)
def test_unsafe_names_are_refused(name: str, reason: str) -> None:
    error = _rejected(_tar(_file("solution.py"), _file(name)))
    assert error.http_status == 400
    assert reason in str(error)


def test_an_unsafe_directory_is_refused_too() -> None:
    error = _rejected(_tar(_file("solution.py"), _special("../up/", tarfile.DIRTYPE)))
    assert error.http_status == 400
    assert "'..' component" in str(error)


def test_a_name_given_twice_is_refused() -> None:
    error = _rejected(_tar(_file("solution.py"), _file("./solution.py", b"other")))
    assert error.http_status == 400
    assert "'solution.py' appears twice" in str(error)


@pytest.mark.parametrize(
    "members",
    [
        [_file("lib"), _file("lib/k.py")],
        [_file("lib/k.py"), _file("lib")],
        [_special("lib/", tarfile.DIRTYPE), _file("lib")],
    ],
    ids=["file-then-child", "child-then-file", "dir-member"],
)
def test_a_file_that_is_also_a_directory_is_refused(members: list) -> None:
    error = _rejected(_tar(_file("solution.py"), *members))
    assert error.http_status == 400
    assert "'lib' is both a file and a directory" in str(error)


def test_no_solution_at_the_root_is_refused() -> None:
    error = _rejected(_tar(_file("sub/solution.py")))
    assert error.http_status == 400
    assert "no solution.py at the root" in str(error)


# ----------------------------------------------------------------------------- refused: not a tar


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not a readable tar archive"),
        (b"PK\x03\x04 this is a zip, not a tar" * 40, "not a readable tar archive"),
        (os.urandom(4096).replace(b"\x1f\x8b", b"xx"), "not a readable tar archive"),
        (b"\x1f\x8b" + b"not deflate at all" * 10, "not a valid gzip stream"),
        (_gzip_of_zeros(b"x" * 600, 0)[:-8] + b"\0" * 8, "not a valid gzip stream"),
    ],
    ids=["empty", "zip", "random", "bad-gzip", "bad-gzip-crc"],
)
def test_garbage_is_refused(data: bytes, reason: str) -> None:
    error = _rejected(data)
    assert error.http_status == 400
    assert reason in str(error)


def _two_file_tar() -> bytes:
    # Blocks: 0 header, 1-2 data of solution.py (600 bytes), 3 header, 4 data of b.py, 5-6 end.
    return _tar(_file("solution.py", b"#" * 600), _file("b.py", b"b = 1\n"))


@pytest.mark.parametrize(
    "cut",
    [700, 3 * 512, 3 * 512 + 100, 4 * 512 + 3, 5 * 512],
    ids=["in-data", "before-header", "in-header", "in-last-data", "before-end-marker"],
)
def test_a_truncated_tar_is_refused(cut: int) -> None:
    error = _rejected(_two_file_tar()[:cut])
    assert error.http_status == 400
    assert "truncated" in str(error)


def test_a_truncated_gzip_is_refused() -> None:
    whole = _tar(_file("solution.py", os.urandom(3000)), gz=True)
    error = _rejected(whole[: len(whole) // 2])
    assert error.http_status == 400
    assert "truncated gzip" in str(error)


def test_a_corrupt_header_after_the_first_is_refused() -> None:
    data = bytearray(_two_file_tar())
    data[3 * 512 + 150] ^= 0xFF  # inside b.py's header checksum field
    error = _rejected(bytes(data))
    assert error.http_status == 400
    assert "truncated or corrupt at byte 1,536" in str(error)


def _with_size_field(header: bytes, field: bytes) -> bytes:
    """``header`` with its 12-byte size field replaced and its checksum fixed."""
    block = bytearray(header[: tarfile.BLOCKSIZE])
    block[124:136] = field
    block[148:156] = b"%06o\0 " % tarfile.calc_chksums(bytes(block))[0]
    return bytes(block)


def test_a_negative_size_is_refused() -> None:
    # Base-256 size fields can be negative; summed, one would lower the tree's total.
    header = _with_size_field(_file("evil")[0].tobuf(tarfile.GNU_FORMAT), b"\xff" * 12)
    error = _rejected(_tar(_file("solution.py"))[:1024] + header + bytes(1024))
    assert error.http_status == 400
    assert "'evil' has a negative size, -1" in str(error)


def test_a_header_tarfile_cannot_parse_is_refused_not_raised() -> None:
    # A malformed pax sparse map makes tarfile raise ValueError, not TarError.
    info, data = _file("sparse.bin", b"abc")
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "x"}
    error = _rejected(_tar(_file("solution.py"), (info, data)))
    assert error.http_status == 400
    assert "not a readable tar archive" in str(error)


def test_a_name_that_is_not_utf8_is_refused() -> None:
    info, data = _file("k\xff.py", b"x")
    member = info.tobuf(tarfile.USTAR_FORMAT, "latin-1") + data.ljust(tarfile.BLOCKSIZE, b"\0")
    error = _rejected(_tar(_file("solution.py"))[:1024] + member + bytes(1024))
    assert error.http_status == 400
    assert "is not valid UTF-8" in str(error)


def test_a_checked_tree_is_what_the_api_promises() -> None:
    checked = check_upload(_tar(_file("solution.py")), LIMITS)
    assert isinstance(checked, CheckedTree)
    assert checked.files == {"solution.py": SOLUTION}
    assert len(checked.sha256) == 64 and len(checked.tree) == 40
