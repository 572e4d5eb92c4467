"""Giving freed memory back to the system.

Dropping a user's index frees its arrays and Python objects, but glibc's allocator keeps most of
the freed heap for later allocations: the process's resident size stays where it was. After a
cache drops indexes, :func:`give_back` asks it to return what it can (``malloc_trim``); measured
in bench/recall_bench.py ``--every-user`` (docs/performance.md). Elsewhere than glibc it does
nothing.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger("memproxy.memory")


def _trim() -> ctypes._NamedFuncPointer | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim: ctypes._NamedFuncPointer = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _trim()


def give_back() -> None:
    """Return the allocator's free memory to the system (blocking: run it in a thread)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
