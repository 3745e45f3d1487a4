"""This process's memory, from the standard library only (no torch, no numpy), so every node engine reports
the same figure: ``peak_rss_mb`` is the peak resident set of the calling process (VmHWM), ``rss_mb`` its
resident set now."""

from __future__ import annotations

import functools
import os
import resource
import sys
import time
from typing import Any

_MB = 2**20


def _status_kb(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (None where there is no /proc or no such field)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_mb() -> float:
    """The calling process's own peak resident memory (MB): VmHWM from /proc/self/status, read in this
    process; where there is none, ``ru_maxrss`` of RUSAGE_SELF (kB on Linux, bytes on macOS)."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / _MB if sys.platform == "darwin" else peak / 1024


def rss_mb() -> float:
    """The calling process's resident memory now (MB), from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB
    except (OSError, ValueError, IndexError):
        return 0.0


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, looked up once (None where the C library is not glibc)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def release_free_memory() -> None:
    """Give the C heap's freed pages back to the system (glibc's ``malloc_trim``; nothing elsewhere): loading
    an ONNX graph frees its parsed copy of the weights, which glibc would otherwise keep resident."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def torch_loaded() -> bool:
    """Whether ``torch`` is imported in this process (a torch-free engine must end with False)."""
    return sys.modules.get("torch") is not None


TRIM_EVERY_S = 10.0  # a served node gives its C heap's freed pages back this often (its RSS shows what is in use)
_last_trim = [0.0]


def trim_heap() -> None:
    """:func:`release_free_memory` at most every ``TRIM_EVERY_S`` (called from a served node's loops)."""
    now = time.monotonic()
    if now - _last_trim[0] >= TRIM_EVERY_S:
        _last_trim[0] = now
        release_free_memory()
