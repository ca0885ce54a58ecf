"""glibc's malloc thresholds, raised once to the values glibc itself adopts after a program
frees a 32 MiB buffer (``raise_thresholds``).

glibc serves an allocation at or above its *mmap threshold* with a fresh ``mmap`` and gives
free memory at the top of its heap back to the kernel once it exceeds the *trim threshold*.
Both start low (128 KiB) and rise as the program frees ``mmap``-ed blocks, up to 32 MiB (mmap)
and 64 MiB (trim) after a free of a block of 32 MiB. A CPU training step whose temporaries add
up to more than the trim threshold (Adam's intermediate tensors, activations) then gives its
heap back at every step and page-faults it in again at the next: on this project's 2-core VM
the 70 MB MLP of ``benchmarks/vs_flor.py`` page-faulted ~200,000 times an epoch in one run,
~0 times in another (which one a run gets varied from run to run), 10-20% of its training
time. The original FLOR (pyflor) pickles each checkpointed object to time it (the model: a
~23 MB buffer) and frees it, which raises the thresholds as a side effect: its recordings ran
at the fast end. flor raises them on purpose when a session starts (record and replay alike), by
allocating and freeing one such block, so that a recording's (and its replays') training
runs at the fast end every time: what glibc's own policy does, at most 64 MiB of free memory
kept at the top of each heap rather than given back.

Nothing happens where the C library is not glibc, or where the user has fixed the thresholds
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_MAX_`` or ``glibc.malloc`` tunables: glibc then keeps them fixed anyway), or with
``FLOR_MALLOC=default``. ``run.json`` notes which (``versions.malloc``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["BLOCK", "done", "raise_thresholds"]

#: one page short of glibc's largest dynamic mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``,
#: 32 MiB on 64-bit), so that the block, with its header rounded up to a page, is no larger
BLOCK = (32 << 20) - 2 * 4096
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_DONE: list[str] = []


def raise_thresholds(setting: str = "raise", env: os._Environ[str] | dict[str, str] = os.environ) -> str:
    """Raise glibc's dynamic mmap and trim thresholds to their maximum, once per process,
    unless ``setting`` (``Settings.malloc``, from ``FLOR_MALLOC``) is ``"default"`` or ``env``
    holds the user's own glibc malloc settings; returns what was done (for the run's metadata)."""
    if _DONE:
        return _DONE[0]
    _DONE.append(_raise(setting, env))
    return _DONE[0]


def done() -> str | None:
    """What ``raise_thresholds`` did in this process (None: not called)."""
    return _DONE[0] if _DONE else None


def _raise(setting: str, env: os._Environ[str] | dict[str, str]) -> str:
    if setting == "default":
        return "unchanged (FLOR_MALLOC=default)"
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return "unchanged (not glibc)"
    fixed = [k for k in _USER_SETTINGS if k in env]
    fixed += ["GLIBC_TUNABLES"] if "glibc.malloc" in env.get("GLIBC_TUNABLES", "") else []
    if fixed:
        return f"unchanged (the user's {fixed[0]})"
    try:
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
        block = libc.malloc(BLOCK)  # mmap-ed (never touched: no page is faulted in)
        if not block:
            return "unchanged (malloc failed)"
        libc.free(block)  # glibc: mmap threshold = 32 MiB, trim threshold = 64 MiB
    except (OSError, AttributeError) as exc:  # never a reason to stop a run
        return f"unchanged ({type(exc).__name__})"
    return "glibc thresholds raised (mmap 32 MiB, trim 64 MiB)"
