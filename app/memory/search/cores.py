"""How many threads this process may give onnxruntime: the CPUs it may use, counted from its
affinity and from its container's CPU limit (cgroup v2 or v1), for
``MEMPROXY_EMBEDDING_THREADS=0``."""

from __future__ import annotations

import os
from pathlib import Path

MAX_AUTO_THREADS = 8
"""The most threads `MEMPROXY_EMBEDDING_THREADS=0` gives: a bound on one process's share of a big
machine (several copies of memproxy on one machine each take it), not a measured optimum."""
CGROUP = Path("/sys/fs/cgroup")


def usable_cores(cgroup: Path = CGROUP) -> int:
    """The CPUs this process may use: its affinity, its container's CPU limit (a cgroup quota:
    more threads than it allows use the quota up early in each period, and then the whole
    process waits, the event loop too), at most :data:`MAX_AUTO_THREADS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cgroup_cpus(cgroup)
    return max(1, min(cores or 1, quota or MAX_AUTO_THREADS, MAX_AUTO_THREADS))


def cgroup_cpus(root: Path) -> int | None:
    """Whole CPUs the cgroup under `root` may use (cgroup v2's ``cpu.max``, else v1's CFS quota),
    rounded up; None: no limit, or none readable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        limit, every = int(quota), int(period)
    except ValueError:  # "max": no limit
        return None
    return -(-limit // every) if limit > 0 and every > 0 else None
