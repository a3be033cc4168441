"""Give back a thread's OpenMP worker pool, so the thread that computes is the only one holding one.

PyTorch's CPU kernels run their parallel regions on GNU OpenMP (libgomp), which keeps a pool of worker threads
for every thread that has entered a parallel region, for as long as that thread lives. While the pools of two
threads together hold more OpenMP threads than the machine has CPUs, libgomp stops spin-waiting between regions
(its "throttled" spin count, 100 instead of 300,000), and every region then wakes its workers through the kernel:
a forward's hundreds of small products each pay it. Measured on a 2-vCPU Intel Xeon (BENCHMARKS.md, "The start
through the real app"): greedy's decode step on the float16-weight model took 35 ms in a thread alone and 55 ms
in a thread whose parent had run one parallel region and waited for it; one ``F.linear`` of a row, 45 against
165 us. ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` do not lift the throttle.

So a thread that hands the computing to another thread and waits (the app's run thread, the main thread before
it serves) first calls :func:`release`: libgomp's ``omp_pause_resource_all(omp_pause_soft)`` frees the calling
thread's pool (only its own: libgomp pauses the caller's pool, and refuses inside a parallel region). The next
region that thread enters builds a pool again. Only libgomp is paused (other OpenMP runtimes pause every pool of
the process); elsewhere, or where the library cannot be found, :func:`release` does nothing and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Iterator, Optional

import torch  # noqa: F401: loads PyTorch's libgomp, which _libgomp_path looks for

OMP_PAUSE_SOFT = 1


def _libgomp_path() -> Optional[str]:
    """The libgomp this process has loaded (PyTorch's own copy), from /proc/self/maps; None elsewhere."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            for line in fh:
                path = line.split()[-1] if line.strip() else ""
                if "/libgomp" in path and ".so" in path:
                    return path
    except OSError:
        pass
    return None


@functools.cache
def _pause() -> Optional[ctypes._CFuncPtr]:
    """libgomp's ``omp_pause_resource_all``, looked up once; None without it."""
    path = _libgomp_path()
    if not path:
        return None
    try:
        fn = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):      # an older libgomp (before GCC 9) has no pause
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def available() -> bool:
    """Whether this process runs libgomp with ``omp_pause_resource_all`` (PyTorch's Linux CPU builds do)."""
    return _pause() is not None


def release() -> bool:
    """Free the calling thread's OpenMP worker pool; True when libgomp did, False where it cannot (no libgomp, or
    called inside a parallel region)."""
    fn = _pause()
    return fn is not None and fn(OMP_PAUSE_SOFT) == 0


@contextlib.contextmanager
def threads(count: Optional[int]) -> Iterator[None]:
    """PyTorch's thread count is ``count`` inside (None: as it is), and is put back after it, however the block ends.
    The count is the process's, not the calling thread's: ``torch.set_num_threads`` also stores the count PyTorch
    gives every thread at its first parallel region, and setting only a thread's own OpenMP count left a busy run
    1.5-3x slower than this (``web/contention.py``). So another thread computing meanwhile computes on it too: the
    callers are the one computation of the app (a run), or a call inside it."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
