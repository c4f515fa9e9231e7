"""Check an uploaded submission archive before anything of it is stored.

The service's upload endpoint calls `check_upload` on the bytes as received: a committed tree as
``git archive --format=tar HEAD`` (or ``--format=tar.gz``) writes it. The upload is refused, with a
message the client sees as is, when it is too large, inflates too far (a compression bomb), holds
too many or too large files, or holds anything but regular files and directories at safe relative
paths. What comes back is the tree in memory, its git tree id (what ``git write-tree`` gives for
the same files and modes, so the operator can match it to the agent's commit), and a canonical
``tar.gz`` of it: the same files always give the same bytes and sha256, which is what is stored.

Nothing is written to disk and nothing is extracted here; the tar is parsed from memory, after
inflating at most a fixed number of bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
import zlib
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from grader.config import Limits
from grader.workspace import SOLUTION

_MIB = 1 << 20
# What tar adds around the file contents: a header (and, for a long name, a pax header and its
# data) per member, padding to a block, the end marker and the last record. With this much room
# past the tree limit, an honest tree meets the tree limit (which names a file) before the cap.
_BLOCKS_PER_MEMBER = 4
_HEX_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# git archive writes its commit id in a pax global header; a tar reader that does not know pax
# (or an extract-and-retar) turns that header into a root file of this name, never committed.
_PAX_GLOBAL_FILE = "pax_global_header"

# tarfile.isreg() also admits GNU sparse and contiguous files, which git never writes.
_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
}
_Tree = tuple[dict[str, bytes], frozenset[str], str | None]  # files, executable, commit


@dataclass(frozen=True)
class UploadLimits:
    """What an upload may be. Sizes are in bytes."""

    max_upload_bytes: int = 8 * _MIB  # the bytes as received (compressed or not)
    max_files: int = 200  # regular files
    max_file_bytes: int = 4 * _MIB  # one file, unpacked
    max_tree_bytes: int = 16 * _MIB  # all files, unpacked
    max_ratio: float = 200.0  # unpacked / received: a compression-bomb limit
    max_members: int = 1000  # tar members of any kind (files, directories, ...) read at most

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) <= 0:
                raise ValueError(f"UploadLimits.{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def of(cls, limits: Limits) -> UploadLimits:
        """The tree limits of `scoring.yaml` (the same a local grade checks); the rest default."""
        return cls(
            max_files=limits.tree_max_files,
            max_file_bytes=int(limits.file_max_mb * _MIB),
            max_tree_bytes=int(limits.tree_max_mb * _MIB),
        )

    def max_inflated_bytes(self, received: int) -> int:
        """The most a gzip upload of ``received`` bytes may inflate to."""
        overhead = self.max_members * _BLOCKS_PER_MEMBER * tarfile.BLOCKSIZE + tarfile.RECORDSIZE
        return min(self.max_tree_bytes + overhead, int(received * self.max_ratio))


class UploadRejected(ValueError):
    """Why an upload was refused; the message is shown to the client as is.

    Attributes:
        http_status: 413 for the size and count caps and compression bombs, 400 for the rest.
    """

    def __init__(self, message: str, http_status: int = 400) -> None:
        super().__init__(message)
        self.http_status = http_status


def _too_large(message: str) -> UploadRejected:
    return UploadRejected(message, http_status=413)


@dataclass(frozen=True)
class CheckedTree:
    """An accepted upload."""

    files: dict[str, bytes]  # path (posix, relative) -> content, regular files only
    executable: frozenset[str]  # paths whose tar mode had any x bit
    commit: str | None  # git archive's pax global 'comment' (40 or 64 hex), else None
    tree: str  # git tree id of exactly these files and modes, as `git write-tree` gives it
    archive: bytes  # canonical tar.gz of the files: the same files give the same bytes
    sha256: str  # of `archive`


def check_upload(data: bytes, limits: UploadLimits) -> CheckedTree:
    """Check an uploaded ``tar`` or ``tar.gz`` and return its tree.

    Raises:
        UploadRejected: The upload is too large or inflates too far, is not a tar, holds a member
            that is not a regular file or directory, an unsafe or duplicate path, too many or
            too large files, or no ``solution.py`` at the root.
    """
    if len(data) > limits.max_upload_bytes:
        raise _too_large(
            f"the upload is {len(data):,} bytes; the limit is {limits.max_upload_bytes:,} bytes"
        )
    raw = _gunzip(data, limits) if data[:2] == b"\x1f\x8b" else data
    files, executable, commit = _read_tar(raw, limits)
    if SOLUTION not in files:
        raise UploadRejected(f"no {SOLUTION} at the root of the uploaded tree")
    archive = _canonical_archive(files, executable)
    return CheckedTree(
        files=files,
        executable=executable,
        commit=commit,
        tree=git_tree_id(files, executable),
        archive=archive,
        sha256=hashlib.sha256(archive).hexdigest(),
    )


def _gunzip(data: bytes, limits: UploadLimits) -> bytes:
    """Inflate a gzip stream (members may be concatenated), refusing it past the inflation cap.

    Output is asked for 1 MiB at a time and never past ``cap + 1`` bytes in all, so a bomb costs
    ``cap`` bytes of memory and the time to inflate them, never its full size.
    """
    cap = limits.max_inflated_bytes(len(data))
    out = bytearray()
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
            tail = rest
            while not inflater.eof:
                chunk = inflater.decompress(tail, min(cap + 1 - len(out), _MIB))
                if not chunk and not tail:
                    raise UploadRejected("the upload is a truncated gzip stream")
                tail = inflater.unconsumed_tail
                out += chunk
                if len(out) > cap:
                    raise _too_large(
                        f"the upload inflates past {cap:,} bytes from {len(data):,} received; the "
                        f"limit is {cap:,} bytes (the tree limit plus tar overhead, or "
                        f"{limits.max_ratio:g}x the upload if less): refused as a compression bomb"
                    )
            # gzip(1) may pad with zeros after the last member; anything else must be a member.
            rest = inflater.unused_data.lstrip(b"\0")
    except zlib.error as e:
        raise UploadRejected(f"the upload is not a valid gzip stream: {e}") from None
    return bytes(out)


def _read_tar(raw: bytes, limits: UploadLimits) -> _Tree:
    files: dict[str, bytes] = {}
    executable: set[str] = set()
    dirs: set[str] = set()
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            # Iterating fills tar.members too: the member cap is what bounds that list.
            for count, member in enumerate(tar, start=1):
                if count > limits.max_members:
                    raise _too_large(
                        f"the archive has more than {limits.max_members:,} members (at "
                        f"{member.name!r}); the limit is {limits.max_members:,}"
                    )
                kind = _KINDS.get(member.type, f"tar member of type {member.type!r}")
                if member.sparse is not None:  # tarfile reads a pax sparse file as a plain one
                    kind = "sparse file"
                if kind not in ("file", "directory"):
                    raise UploadRejected(f"{member.name!r} is a {kind}; only files are allowed")
                path = _safe_path(member.name)
                if kind == "directory":
                    if path:  # "./" names the root itself
                        dirs.add(path)
                    continue
                if not path:
                    raise UploadRejected(f"{member.name!r} is a file without a name")
                if path == _PAX_GLOBAL_FILE:
                    continue
                if path in files:
                    raise UploadRejected(f"{path!r} appears twice in the archive")
                if member.size < 0:
                    raise UploadRejected(f"{path!r} has a negative size, {member.size:,}")
                if member.size > limits.max_file_bytes:
                    raise _too_large(
                        f"{path!r} is {member.size:,} bytes; the limit per file is "
                        f"{limits.max_file_bytes:,} bytes"
                    )
                if len(files) == limits.max_files:
                    raise _too_large(
                        f"the archive has more than {limits.max_files} files (at {path!r}); "
                        f"the limit is {limits.max_files}"
                    )
                total += member.size
                if total > limits.max_tree_bytes:
                    raise _too_large(
                        f"the files come to {total:,} bytes at {path!r}; the limit for the tree "
                        f"is {limits.max_tree_bytes:,} bytes"
                    )
                if member.offset_data + member.size > len(raw):
                    raise UploadRejected(
                        f"the tar archive is truncated in {path!r}: {member.size:,} bytes "
                        f"declared, {len(raw) - member.offset_data:,} present"
                    )
                files[path] = tar.extractfile(member).read()
                if member.mode & 0o111:
                    executable.add(path)
            end = tar.offset
            commit = tar.pax_headers.get("comment")
    except UploadRejected:
        raise
    except Exception as e:  # tarfile raises more than TarError (ValueError, OverflowError) on junk
        raise UploadRejected(f"the upload is not a readable tar archive: {e}") from None
    # tarfile stops quietly at a damaged or cut header after the first; only a zero block (the
    # end-of-archive marker) there means the whole tree was read.
    if raw[end : end + tarfile.BLOCKSIZE] != bytes(tarfile.BLOCKSIZE):
        raise UploadRejected(f"the tar archive is truncated or corrupt at byte {end:,}")
    _check_no_clash(files, dirs)
    commit = commit if commit and _HEX_ID.fullmatch(commit) else None
    return files, frozenset(executable), commit


def _safe_path(name: str) -> str:
    """``name`` without a leading ``./``; `UploadRejected` when it is not a safe relative path."""
    if not name:
        raise UploadRejected("a member has an empty name")
    if "\\" in name or "\0" in name:
        raise UploadRejected(f"{name!r} has a backslash or NUL in its name")
    if name.startswith("/"):
        raise UploadRejected(f"{name!r} is an absolute path")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UploadRejected(f"{name!r} is not valid UTF-8") from None
    path = name
    while path.startswith("./"):
        path = path[2:]
    if path in ("", "."):
        return ""
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise UploadRejected(f"{name!r} has an empty, '.' or '..' component")
        if part.lower() == ".git":
            raise UploadRejected(f"{name!r} is inside .git")
    return path


def _check_no_clash(files: Mapping[str, bytes], dirs: Set[str]) -> None:
    """No file may also be a directory: git could not hold both, nor could a disk."""
    parents = {path.rsplit("/", i)[0] for path in files for i in range(1, path.count("/") + 1)}
    for path in sorted(files):
        if path in parents or path in dirs:
            raise UploadRejected(f"{path!r} is both a file and a directory in the archive")


def git_tree_id(files: Mapping[str, bytes], executable: Set[str]) -> str:
    """The git tree id (sha1) of ``files``: blobs of mode 100755 for ``executable``, else 100644.

    Entries sort as git sorts them: by name, a subtree's name taken with a trailing ``/``.
    """
    tree: dict[str, object] = {}
    for path, content in files.items():
        *parents, leaf = path.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = (b"100755" if path in executable else b"100644", _object_id(b"blob", content))
    return _tree_object(tree).hex()


def _tree_object(node: dict[str, object]) -> bytes:
    entries = []
    for name, child in node.items():
        key = name.encode("utf-8")
        if isinstance(child, dict):
            entries.append((key + b"/", b"40000 " + key + b"\0" + _tree_object(child)))
        else:
            mode, oid = child
            entries.append((key, mode + b" " + key + b"\0" + oid))
    return _object_id(b"tree", b"".join(entry for _, entry in sorted(entries)))


def _object_id(kind: bytes, body: bytes) -> bytes:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body).digest()


def _canonical_archive(files: Mapping[str, bytes], executable: Set[str]) -> bytes:
    """A deterministic ``tar.gz`` of ``files`` (`make_archive` too, for a tree on disk): sorted
    names, zero times and owners, modes 0644/0755 only."""
    buffer = io.BytesIO()
    # mtime=0 in the gzip header too, or the bytes change with the clock.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size = len(files[path])
            info.mode = 0o755 if path in executable else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[path]))
    return buffer.getvalue()


# ----------------------------------------------------------------------------- local trees


def make_archive(root: Path, files: Sequence[str]) -> bytes:
    """The canonical ``tar.gz`` of ``files`` (paths relative to ``root``), as `check_upload` makes
    of an upload: the same tree always gives the same bytes, so the sha256 names the content.

    What the agent's ``submit`` sends and stores; a file with any x bit is archived 0755.
    """
    return _canonical_archive({name: (root / name).read_bytes() for name in files},
                              {name for name in files if (root / name).stat().st_mode & 0o111})


def extract_archive(data: bytes, dest: Path) -> list[str]:
    """Unpack a ``tar.gz`` made by `make_archive` (or stored by the service) into ``dest``;
    return the file names.

    Uses tarfile's ``data`` filter: no absolute paths, no ``..``, no links, no devices.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        tar.extractall(dest, filter="data")
    return [m.name for m in members if m.isfile()]
