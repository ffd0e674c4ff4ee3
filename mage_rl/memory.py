"""Handing freed memory back to the operating system.

glibc keeps what a process frees in its arenas for reuse instead of returning it. A
training iteration frees gigabytes at its end (activations, gradients, logits, the
engine's stored prefixes), and glibc held on to 1.1-1.7 GB of it between iterations of
the main job, about a third of the process's resident memory; a server that refused a
few large requests kept what parsing them allocated. :func:`release_free_memory` returns
those free pages (``malloc_trim``); it costs milliseconds and changes nothing that is
in use. Elsewhere than glibc (macOS, musl) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def can_release() -> bool:
    """Whether this C library can hand free memory back (glibc's ``malloc_trim``)."""
    return _TRIM is not None


def release_free_memory() -> None:
    """Return the C allocator's free pages to the operating system, where it can."""
    if _TRIM is not None:
        _TRIM(0)
