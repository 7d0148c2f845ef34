"""How many cores this process may use: the CPUs it may run on, capped by its cgroup's CPU quota.

`os.cpu_count()` is the machine's count. In a container limited to 2 CPUs (`docker run --cpus 2`,
a Kubernetes CPU limit, systemd's `CPUQuota=200%`) on a 64-core node it still says 64, and
`FEDRESEARCH_WORKERS=auto` started 64 workers that the kernel's CFS bandwidth control then throttled
to 2 cores' worth of time between them: 64 event loops stalled for most of each 100 ms period, and
64 times the memory. A quota is CPU time per period, not a set of CPUs, so `sched_getaffinity`
(which a cpuset or `taskset` does narrow) does not see it; it is read from the cgroup file system, v2
(`cpu.max`) or v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`), at every level from the process's own
group up to the root of the mount it can see, since a parent's quota bounds its children. A quota
of 1.5 cores gives 2: one worker alone could use only one of them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path


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


def usable_cores(proc: Path = Path("/proc/self")) -> Cores:
    machine = os.cpu_count() or 1
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    quota = cpu_quota(proc)
    usable = allowed if quota is None else max(1, min(allowed, math.ceil(quota)))
    return Cores(usable=usable, machine=machine, allowed=allowed, quota=quota)


def cpu_quota(proc: Path = Path("/proc/self")) -> float | None:
    """The tightest CPU quota, in cores, over the cgroups (v1 and v2) holding the process described
    under `proc`; None without one, or where there is no cgroup file system to read (not Linux)."""
    try:
        mounts = (proc / "mountinfo").read_text()
        groups = (proc / "cgroup").read_text()
    except OSError:
        return None
    quotas: list[float] = []
    for version, root, mount_point in _cgroup_mounts(mounts):
        path = _group_path(groups, version)
        if path is None:
            continue
        for directory in _up_to(mount_point, _inside(mount_point, root, path)):
            quota = _quota_v2(directory) if version == 2 else _quota_v1(directory)
            if quota is not None:
                quotas.append(quota)
    return min(quotas) if quotas else None


def _cgroup_mounts(mountinfo: str) -> list[tuple[int, str, Path]]:
    """(version, the mount's root within the hierarchy, where it is mounted) of the cgroup v2 mount
    and of the v1 mount holding the `cpu` controller. A line of /proc/self/mountinfo: `id parent
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
        elif fstype == "cgroup" and "cpu" in options:
            found.append((1, root, mount_point))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes a space in a path as \\040 (and a tab, a newline, a backslash in octal too)."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal[1], 8)), field)


def _group_path(groups: str, version: int) -> str | None:
    """The process's group in /proc/self/cgroup: `0::/path` for v2, `N:cpu,cpuacct:/path` for v1."""
    for line in groups.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and number == "0" and controllers == "":
            return path
        if version == 1 and "cpu" in controllers.split(","):
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
