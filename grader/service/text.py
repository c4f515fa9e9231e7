"""Text a submission may have written, made safe to print on an operator's terminal.

A log tail, a report's status or reason, a run's name: any of them can carry terminal escape
sequences (a fake green "scored" line, a cleared screen, a rewritten title). Everything the
operator's commands and the worker print from such a source goes through `printable`.
"""

from __future__ import annotations

import unicodedata


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: object, *, newlines: bool = True) -> str:
    """``str(value)`` with every control character escaped (``\\x1b`` → ``\\\\x1b``): C0 and C1
    controls, DEL, and Unicode's format characters (bidirectional overrides, which reorder what
    is shown). Newlines are kept where ``newlines`` (a log tail's lines), escaped otherwise
    (one field on one line); a tab is kept."""
    out = []
    for char in str(value):
        if char == "\n" and newlines or char == "\t":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(_escape(char))
        else:
            out.append(char)
    return "".join(out)


__all__ = ["printable"]
