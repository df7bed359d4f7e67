"""Process-wide CPU settings for models, applied once, at the first model call on CPU.

Threads: reconstruction frameworks (CMSSW's TBB pool) run many events in parallel threads; a model
that also spreads each call over every core oversubscribes the machine. So, as CMSSW does, torch's
intra-op and inter-op thread counts become 1 unless the process chose otherwise, with
`set_cpu_threads` or the environment variable `SOAGEN_CPU_THREADS` ("intra" or "intra,inter"); where
only torch's own `OMP_NUM_THREADS` is set, the intra-op count stays as torch has it.

Memory: glibc's malloc gives large freed blocks back to the OS at once, so a model's intermediates
are page-faulted in again on every call (62.5k faults per call for a small MLP at n = 1e6). Keeping
them in the heap, as `MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...` would, halved that model's time
here, and removed every fault (625k per call for the same MLP at n = 1e7). Threads other than the
main one allocate from arenas of their own, whose heaps hold at most 64 MiB: larger blocks are mapped
and unmapped per call whatever the settings (the MLP at 1e6 from a worker thread: 64k faults and 2.7x
the time per call), so the tuning also keeps threads on the main arena (`M_ARENA_MAX` 1). soagen
applies all three through `mallopt` on glibc (never on other C libraries), at the first CPU call;
threads that allocated before that keep their arenas (`MALLOC_ARENA_MAX=1` in the environment covers
them). The price: the process keeps its peak heap, and threads share one arena (glibc's per-thread
caches serve small blocks without its lock). `SOAGEN_MALLOC_TUNING=0` or `set_malloc_tuning(False)`
opts out.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import warnings

ENVIRONMENT_VARIABLE = "SOAGEN_CPU_THREADS"
MALLOC_VARIABLE = "SOAGEN_MALLOC_TUNING"

# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# glibc casts the int to size_t: -1 means "never trim". A finite threshold (even 1 GiB) is
# below a large model's intermediates (1.28 GB each for an MLP at n = 1e7), which were then
# handed back and page-faulted in again on every call.
_TRIM_THRESHOLD = -1

_lock = threading.Lock()
_configured = False
_malloc_decided = False


def set_cpu_threads(intra_op: int | None = 1, inter_op: int | None = 1) -> None:
    """Set torch's CPU thread counts now; None leaves that count as torch has it.

    torch accepts the inter-op count only before its first parallel work: after that it keeps its
    count, and a warning says so.
    """
    global _configured
    import torch

    for name, value in (("intra_op", intra_op), ("inter_op", inter_op)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    with _lock:
        if intra_op is not None:
            torch.set_num_threads(intra_op)
        if inter_op is not None and torch.get_num_interop_threads() != inter_op:
            try:
                torch.set_num_interop_threads(inter_op)
            except RuntimeError:
                warnings.warn(
                    f"soagen: torch already started its inter-op pool with "
                    f"{torch.get_num_interop_threads()} threads; it stays so (set the count before "
                    f"torch runs anything, or with {ENVIRONMENT_VARIABLE})",
                    RuntimeWarning,
                    stacklevel=2,
                )
        _configured = True


def set_malloc_tuning(enabled: bool = True) -> bool:
    """Keep freed memory in the heap (glibc only). Returns whether the tuning is in effect.

    `enabled=False` only stops soagen from applying it later: settings made cannot be undone.
    """
    global _malloc_decided
    with _lock:
        _malloc_decided = True
        if not enabled or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        try:
            mallopt = ctypes.CDLL("libc.so.6").mallopt
        except (OSError, AttributeError):
            return False
        settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_ARENA_MAX, 1))
        # A list, not a generator: apply all three even where one is refused.
        return all([bool(mallopt(parameter, value)) for parameter, value in settings])


def ensure_cpu_settings() -> None:
    """Apply the defaults (or the environment's settings) once, unless the process set them."""
    if not _configured:
        intra_op, inter_op = _from_environment(os.environ.get(ENVIRONMENT_VARIABLE, ""))
        if (
            not os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
            and os.environ.get("OMP_NUM_THREADS", "").strip()
        ):
            intra_op = None  # torch's own variable, which torch applied: the user chose a count
        set_cpu_threads(intra_op, inter_op)
    ensure_malloc_tuning()


def ensure_malloc_tuning() -> None:
    """Apply the malloc tuning once (unless the environment or the process opted out): at the first
    CPU call, or earlier, before a server starts the threads that will run models."""
    if not _malloc_decided:
        setting = os.environ.get(MALLOC_VARIABLE, "1").strip().lower()
        if setting not in ("0", "1", "off", "on", "false", "true", ""):
            raise ValueError(f"{MALLOC_VARIABLE}={setting!r}: expected 1 (the default) or 0")
        set_malloc_tuning(setting not in ("0", "off", "false"))


def _from_environment(text: str) -> tuple[int | None, int | None]:
    if not text.strip():
        return 1, 1
    parts = [part.strip() for part in text.split(",")]
    # ASCII digits only: int() would also take "+3", "1_0" and other scripts' digits.
    counts = [int(part) for part in parts if part.isascii() and part.isdigit()]
    if len(counts) == len(parts) and len(counts) in (1, 2) and all(count >= 1 for count in counts):
        return counts[0], counts[1] if len(counts) == 2 else 1
    raise ValueError(
        f"{ENVIRONMENT_VARIABLE}={text!r}: expected a positive thread count, or two "
        f"(intra-op,inter-op), e.g. {ENVIRONMENT_VARIABLE}=4 or {ENVIRONMENT_VARIABLE}=4,1"
    )
