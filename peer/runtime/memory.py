"""The process's resident memory, as status.json reports it: the peak (``ru_maxrss``, what an attack must
not grow) and the current one (what an operator watches for a leak: a peak set by torch's import
hides growth for a long time; the multi-host suite's RSS check reads the same number from /proc)."""

from __future__ import annotations

import os
import resource

MIB = 2 ** 20


def peak_mib() -> float:
    """The peak resident memory of this process in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_mib() -> float:
    """The resident memory of this process now, in MiB (``/proc/self/statm``'s resident pages); the peak
    where /proc is not there to read (not Linux)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return peak_mib()
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB
