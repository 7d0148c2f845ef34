"""How many cores and how much memory this process may use, and so how many workers `auto` starts.

Cores: the CPUs it may run on, capped by its cgroup's CPU quota.

`os.cpu_count()` is the machine's count. In a container limited to 2 CPUs (`docker run --cpus 2`,
a Kubernetes CPU limit, systemd's `CPUQuota=200%`) on a 64-core node it still says 64, and
`FEDRESEARCH_WORKERS=auto` started 64 workers that the kernel's CFS bandwidth control then throttled
to 2 cores' worth of time between them: 64 event loops stalled for most of each 100 ms period, and
64 times the memory. A quota is CPU time per period, not a set of CPUs, so `sched_getaffinity`
(which a cpuset or `taskset` does narrow) does not see it; it is read from the cgroup file system, v2
(`cpu.max`) or v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`), at every level from the process's own
group up to the root of the mount it can see, since a parent's quota bounds its children. A quota
of 1.5 cores gives 2: one worker alone could use only one of them.

Memory: a worker holds its own interpreter, library handles and HTTP pools and, with embeddings on,
its share of the encoder (measured in docs/benchmarks.md, "Worker memory"), so a container
with many CPUs and a small memory limit (`docker run --cpus 16 --memory 1g`, a Kubernetes memory
limit) started more workers than fit, and the kernel's OOM killer ended one, then its replacement,
in a loop. `auto` also counts the workers that fit in the memory available: the machine's
MemAvailable, capped by the tightest cgroup memory limit above the process (v2 `memory.max`, v1
`memory.limit_in_bytes`), the same walk as for the CPU quota. A worker of the embedded library
with embeddings also holds the vectors of the users it searched (up to LIBRARY_VECTOR_CACHE_MB):
`auto` counts them as the library stands at start, at most that bound.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
MB = 1 << 20
# What `auto` allows a worker, from peaks measured at stop 30 on 2 workers (VmHWM): 183-184 MB with
# the model after an upload, 97-138 MB without; the supervisor 53 MB; the first process on a fresh
# data dir writes the model's graphs, the float one and the int8 one the writer ranks with, and peaks
# at 686 MB once (479 with the float graph alone); 8 research tasks at once with pages, 329-337 MB.
WORKER_BYTES = {True: 256 * MB, False: 128 * MB}  # keyed by embeddings on
RESERVED_BYTES = {True: (64 + 448) * MB, False: 64 * MB}


@dataclass(frozen=True)
class Cores:
    usable: int  # what `auto` means: one worker, one encoder thread, per usable core
    machine: int  # os.cpu_count()
    allowed: int  # the CPUs this process may run on (sched_getaffinity)
    quota: float | None  # the tightest cgroup CPU quota, in cores; None when there is none

    def describe(self) -> str:
        """Why `usable` is what it is, in a few words for the log."""
        reasons = [f"{self.machine} on the machine"]
        if self.allowed < self.machine:
            reasons.append(f"{self.allowed} this process may run on")
        if self.quota is not None:
            reasons.append(f"a cgroup CPU quota of {self.quota:g}")
        return f"{self.usable} usable {'core' if self.usable == 1 else 'cores'} ({', '.join(reasons)})"


@dataclass(frozen=True)
class Memory:
    available: int  # bytes: MemAvailable, capped by `limit`
    limit: int | None  # the tightest cgroup memory limit, in bytes; None when there is none

    def describe(self) -> str:
        limit = f", a cgroup memory limit of {self.limit // MB:,} MB" if self.limit is not None else ""
        return f"{self.available // MB:,} MB of memory available{limit}"


@dataclass(frozen=True)
class AutoWorkers:
    count: int
    cores: Cores
    memory: Memory | None  # None where it cannot be read (not Linux): cores alone decide
    embeddings: bool
    vectors: int = 0  # bytes of the library's passage vectors a worker may hold (`library_vectors`)

    @property
    def fitting(self) -> int | None:
        """How many workers fit in the memory available, at least one; None when unknown."""
        if self.memory is None:
            return None
        room = self.memory.available - RESERVED_BYTES[self.embeddings]
        return max(1, room // (WORKER_BYTES[self.embeddings] + self.vectors))

    def _per_worker(self) -> str:
        model = "with" if self.embeddings else "without"
        vectors = f", and up to {self.vectors // MB:,} MB of the library's vectors" if self.vectors else ""
        return f"about {WORKER_BYTES[self.embeddings] // MB} MB a worker {model} the embedding model{vectors}"

    def describe(self) -> str:
        """How many, and why, for the log."""
        what = f"{self.count} workers" if self.count > 1 else "one process"
        why = f"{what}, for {self.cores.describe()}"
        fitting = self.fitting
        if self.memory is not None and fitting is not None and fitting < self.cores.usable:
            why += f" and {self.memory.describe()} ({self._per_worker()}); set FEDRESEARCH_WORKERS=N to choose"
        return why

    def crowded(self, count: int) -> str | None:
        """A warning when `count` workers are more than fit in the memory available; else None."""
        fitting = self.fitting
        if self.memory is None or fitting is None or count <= fitting:
            return None
        return (
            f"{count} workers may not fit in {self.memory.describe()} ({self._per_worker()}): "
            f"FEDRESEARCH_WORKERS=auto would start {fitting}"
        )


def auto_workers(
    embeddings: bool, proc: Path = Path("/proc/self"), meminfo: Path = Path("/proc/meminfo"), vectors: int = 0
) -> AutoWorkers:
    """`FEDRESEARCH_WORKERS=auto`: a worker per usable core, as many as fit in the memory available,
    each also holding up to `vectors` bytes of the library's passage vectors."""
    cores, memory = usable_cores(proc), usable_memory(proc, meminfo)
    auto = AutoWorkers(cores.usable, cores, memory, embeddings, vectors)
    fitting = auto.fitting
    if fitting is None or fitting >= cores.usable:
        return auto
    return AutoWorkers(fitting, cores, memory, embeddings, vectors)


def library_vectors(store: Path, cache_mb: int) -> int:
    """The bytes of an embedded library's passage vectors a worker may hold: what its store holds
    now (its file's size, the vectors and the passages' text: an upper bound), at most the
    worker's vector cache (LIBRARY_VECTOR_CACHE_MB)."""
    try:
        size = store.stat().st_size
    except OSError:
        return 0
    return min(size, cache_mb * MB)


def usable_memory(proc: Path = Path("/proc/self"), meminfo: Path = Path("/proc/meminfo")) -> Memory | None:
    """The memory this process may still take: MemAvailable, capped by the tightest cgroup memory
    limit above it; None where /proc/meminfo cannot be read (not Linux)."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None
    limits = _over_cgroups(proc, "memory", _memory_limit_v1, _memory_limit_v2)
    limit = min(limits) if limits else None
    return Memory(available if limit is None else min(available, limit), limit)


def usable_cores(proc: Path = Path("/proc/self")) -> Cores:
    machine = os.cpu_count() or 1
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    quota = cpu_quota(proc)
    usable = allowed if quota is None else max(1, min(allowed, math.ceil(quota)))
    return Cores(usable=usable, machine=machine, allowed=allowed, quota=quota)


def cpu_quota(proc: Path = Path("/proc/self")) -> float | None:
    """The tightest CPU quota, in cores, over the cgroups (v1 and v2) holding the process described
    under `proc`; None without one, or where there is no cgroup file system to read (not Linux)."""
    quotas = _over_cgroups(proc, "cpu", _quota_v1, _quota_v2)
    return min(quotas) if quotas else None


def _over_cgroups(
    proc: Path, controller: str, read_v1: Callable[[Path], T | None], read_v2: Callable[[Path], T | None]
) -> list[T]:
    """What `read_v1` or `read_v2` finds in each group from the process's own up to its mount's
    root, in the v2 hierarchy and in the v1 one holding `controller`."""
    try:
        mounts = (proc / "mountinfo").read_text()
        groups = (proc / "cgroup").read_text()
    except OSError:
        return []
    found: list[T] = []
    for version, root, mount_point in _cgroup_mounts(mounts, controller):
        path = _group_path(groups, version, controller)
        if path is None:
            continue
        for directory in _up_to(mount_point, _inside(mount_point, root, path)):
            value = read_v2(directory) if version == 2 else read_v1(directory)
            if value is not None:
                found.append(value)
    return found


def _cgroup_mounts(mountinfo: str, controller: str) -> list[tuple[int, str, Path]]:
    """(version, the mount's root within the hierarchy, where it is mounted) of the cgroup v2 mount
    and of the v1 mount holding `controller`. A line of /proc/self/mountinfo: `id parent
    major:minor root mount-point options [optional fields] - fstype source super-options`."""
    found: list[tuple[int, str, Path]] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype, _, super_options = line.split(" - ", 1)[1].partition(" ")
        options = super_options.split(" ", 1)[-1].split(",")
        root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if fstype == "cgroup2":
            found.append((2, root, mount_point))
        elif fstype == "cgroup" and controller in options:
            found.append((1, root, mount_point))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes a space in a path as \\040 (and a tab, a newline, a backslash in octal too)."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal[1], 8)), field)


def _group_path(groups: str, version: int, controller: str) -> str | None:
    """The process's group in /proc/self/cgroup: `0::/path` for v2, `N:cpu,cpuacct:/path` for v1."""
    for line in groups.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and number == "0" and controllers == "":
            return path
        if version == 1 and controller in controllers.split(","):
            return path
    return None


def _inside(mount_point: Path, root: str, path: str) -> Path:
    """The group's directory under the mount. A container without its own cgroup namespace mounts
    its group as the root (mountinfo's root `/docker/<id>`) while /proc/self/cgroup names it from
    the host's root: the mount point itself then. A group outside the mount's root: the mount point."""
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return mount_point
        path = path[len(root) :]
    directory = mount_point / path.lstrip("/")
    return directory if directory.is_dir() else mount_point


def _up_to(mount_point: Path, directory: Path) -> list[Path]:
    """`directory` and its parents, up to and including `mount_point`."""
    chain = [directory]
    while chain[-1] != mount_point and mount_point in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _quota_v2(directory: Path) -> float | None:
    """`cpu.max`: `max 100000` (none) or `150000 100000` (microseconds of CPU per period)."""
    try:
        quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period or "100000")
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _quota_v1(directory: Path) -> float | None:
    """`cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _memory_limit_v2(directory: Path) -> int | None:
    """`memory.max`: `max` (none) or bytes."""
    try:
        value = (directory / "memory.max").read_text().strip()
        return None if value == "max" else int(value)
    except (OSError, ValueError):
        return None


def _memory_limit_v1(directory: Path) -> int | None:
    """`memory.limit_in_bytes`: none is written as the largest page-aligned value (2^63 - 4096 on
    x86-64), so anything from 2^62 up is none."""
    try:
        value = int((directory / "memory.limit_in_bytes").read_text())
        return None if value >= 1 << 62 else value
    except (OSError, ValueError):
        return None
