"""The C heap's tuning for a process that reads large bodies (glibc's ``mallopt``).

An 8-image request allocates eight 220 KiB images and frees them a few milliseconds
later. glibc maps a block that large with ``mmap`` and unmaps it on free (or trims the
heap back to the system), so the next request faults every page in again: on this
machine 0.9 ms of an 8-image request's ~5 ms of CPU went to page faults. Serving blocks
under 4 MiB from the heap and keeping up to ``keep_bytes`` of freed heap lets the next
request reuse pages already mapped. The cost: up to ``keep_bytes`` of freed memory stays
in the process's RSS after a peak instead of going back (the peak itself is no higher).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# blocks under this come from the heap (an image, a body piece); larger ones are mapped
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024


def keep_heap(keep_bytes: int) -> bool:
    """Keep up to ``keep_bytes`` of freed heap for reuse (0: glibc's defaults, untouched);
    whether the C library took it (only glibc has ``mallopt``)."""
    if keep_bytes <= 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("heap tuning skipped: the C library has no mallopt")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    threshold = min(MMAP_THRESHOLD_BYTES, keep_bytes)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, keep_bytes))
