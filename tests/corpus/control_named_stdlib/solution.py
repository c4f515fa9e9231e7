"""Control: an honest submission that uses every module of the import list, reads a plan file of
its own, and generates code, under the operating system's confinement.

What an honest fast submission does and issue 37's rules must still admit: every module of the
standard library's named part, ``os.environ`` (the interpreter switch), a JSON plan beside its
code read through ``pathlib`` (as the reference reads its plan tables), and helper code built
from a string and compiled under a name of its own (``<generated>``), not under another file's.
Then the naive control. Expected: pass.
"""

import abc  # noqa: F401
import array  # noqa: F401
import bisect  # noqa: F401
import cmath  # noqa: F401
import collections  # noqa: F401
import contextlib  # noqa: F401
import copy  # noqa: F401
import dataclasses  # noqa: F401
import decimal  # noqa: F401
import enum  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import json
import math  # noqa: F401
import numbers  # noqa: F401
import operator  # noqa: F401
import os
import pathlib
import random  # noqa: F401
import re  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import struct  # noqa: F401
import textwrap
import time  # noqa: F401
import typing  # noqa: F401
import warnings  # noqa: F401
import weakref  # noqa: F401

from naive_triton import DilatedResidualBlock

EXPECTED = "pass"

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
PLAN = json.loads((pathlib.Path(__file__).parent / "plan.json").read_text())
_SOURCE = textwrap.dedent("""
    def tile(length):
        return min(PLAN["max_tile"], 1 << max(length - 1, 0).bit_length())
""")
_NAMESPACE = {"PLAN": PLAN}
exec(compile(_SOURCE, "<generated>", "exec"), _NAMESPACE)
assert _NAMESPACE["tile"](100) == 128

__all__ = ["DilatedResidualBlock"]
