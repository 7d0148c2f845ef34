"""`FEDRESEARCH_WORKERS=auto` counts the cores this process may use, not the machine's: a container
limited to 2 CPUs on a 64-core node must not start 64 workers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedresearch.core.cores import cpu_quota, usable_cores

V1_MOUNTS = "32 31 0:29 {root} {mount} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
V2_MOUNTS = "35 25 0:30 / {mount} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
OTHER_MOUNTS = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"


def proc_dir(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    """A /proc/self as the kernel writes its two files, for a cgroup tree built under `tmp_path`."""
    proc = tmp_path / "proc"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text(OTHER_MOUNTS + mountinfo)
    (proc / "cgroup").write_text(cgroup)
    return proc


def group(path: Path, **files: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("_", ".", 1)).write_text(text + "\n")


def test_a_parents_cgroup_v2_quota_bounds_its_children(tmp_path):
    mount = tmp_path / "cg"
    group(mount, cpu_max="max 100000")
    group(mount / "kubepods.slice", cpu_max="max 100000")
    group(mount / "kubepods.slice" / "pod1", cpu_max="150000 100000")  # 1.5 cores: the pod's limit
    group(mount / "kubepods.slice" / "pod1" / "app", cpu_max="max 100000")
    proc = proc_dir(tmp_path, V2_MOUNTS.format(mount=mount), "0::/kubepods.slice/pod1/app\n")
    assert cpu_quota(proc) == 1.5
    group(mount / "kubepods.slice" / "pod1" / "app", cpu_max="50000 200000")  # tighter below
    assert cpu_quota(proc) == 0.25
    cores = usable_cores(proc)
    assert cores.usable == 1 and cores.quota == 0.25
    assert cores.describe().startswith("1 usable core (") and "a cgroup CPU quota of 0.25" in cores.describe()


def test_no_quota_leaves_the_cpus_the_process_may_run_on(tmp_path):
    mount = tmp_path / "cg"
    group(mount / "user.slice", cpu_max="max 100000")
    proc = proc_dir(tmp_path, V2_MOUNTS.format(mount=mount), "0::/user.slice\n")
    assert cpu_quota(proc) is None
    allowed = len(os.sched_getaffinity(0))
    assert usable_cores(proc).usable == allowed
    # not Linux, or no cgroup file system mounted: the same
    assert cpu_quota(tmp_path / "nowhere") is None
    assert usable_cores(proc_dir(tmp_path / "bare", "", "")).usable == allowed


def test_cgroup_v1_in_a_container_without_its_own_cgroup_namespace(tmp_path):
    """Docker on cgroup v1 mounts the container's group at the mount point (mountinfo's root is
    `/docker/<id>`) while /proc/self/cgroup names it from the host's root. `--cpus 2`."""
    mount = tmp_path / "cpu,cpuacct"
    group(mount, cpu_cfs_quota_us="200000", cpu_cfs_period_us="100000")
    proc = proc_dir(
        tmp_path,
        V1_MOUNTS.format(root="/docker/3f2a", mount=mount),
        "12:pids:/docker/3f2a\n4:cpu,cpuacct:/docker/3f2a\n0::/\n",
    )
    assert cpu_quota(proc) == 2.0
    group(mount, cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")  # no limit
    assert cpu_quota(proc) is None


def test_a_mount_point_with_a_space_is_read_as_mountinfo_escapes_it(tmp_path):
    mount = tmp_path / "cgroup v2"
    group(mount / "app", cpu_max="300000 100000")
    proc = proc_dir(tmp_path, V2_MOUNTS.format(mount=str(mount).replace(" ", "\\040")), "0::/app\n")
    assert cpu_quota(proc) == 3.0


def test_one_cpu_allowed_means_one():
    """sched_getaffinity is per thread on Linux: narrowing this thread's is what `taskset -c 0` does
    to a process."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("one CPU only: narrowing to one changes nothing")
    os.sched_setaffinity(0, {min(allowed)})
    try:
        cores = usable_cores()
    finally:
        os.sched_setaffinity(0, allowed)
    assert cores.usable == 1 and cores.allowed == 1
    assert f"{cores.machine} on the machine, 1 this process may run on" in cores.describe()


@contextlib.contextmanager
def cpu_limited_group(cores: float) -> Iterator[Path]:
    """A real cgroup whose CPU quota is `cores`, removed after: on cgroup v1 (the `cpu` controller's
    mount) or v2 (a root that delegates `cpu`). Needs root; skips where the kernel refuses."""
    name = f"fedresearch-test-{uuid.uuid4().hex[:8]}"
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    v1 = [line.split()[4] for line in mounts if " - cgroup " in line and "cpu" in line.split()[-1].split(",")]
    v2 = [line.split()[4] for line in mounts if " - cgroup2 " in line]
    try:
        if v1:
            path = Path(v1[0]) / name
            path.mkdir()
            (path / "cpu.cfs_quota_us").write_text(str(int(cores * 100_000)))
        elif v2 and "cpu" in (Path(v2[0]) / "cgroup.subtree_control").read_text().split():
            path = Path(v2[0]) / name
            path.mkdir()
            (path / "cpu.max").write_text(f"{int(cores * 100_000)} 100000")
        else:
            pytest.skip("no cgroup file system with the cpu controller to create a group in")
    except OSError as error:
        pytest.skip(f"cannot create a cgroup with a CPU quota here (root, and a writable cgroup fs): {error}")
    try:
        yield path
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                path.rmdir()
                break
            time.sleep(0.1)


def test_serve_with_auto_workers_obeys_a_real_cgroup_cpu_quota(tmp_path):
    """`fedresearch serve --workers auto` in a group held to half a core, on a machine of two or more:
    one process, which says why, and serves; before, one worker per core of the machine."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU only: auto means one process with or without a quota")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"),
        "FEDRESEARCH_API_KEYS": "",
        "FEDRESEARCH_EMBEDDINGS": "false",
    }
    with cpu_limited_group(0.5) as limited:
        # the shell joins the group, then becomes the server: every process it starts stays in it
        join = f'echo $$ > "{limited}/cgroup.procs" && exec "$@"'
        command = ["sh", "-c", join, "sh", sys.executable, "-m", "fedresearch", "serve"]
        command += ["--workers", "auto", "--port", str(port)]
        server = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        try:
            pid = _healthz_pid(port, server)
            assert pid == server.pid  # the server itself answers: no supervisor, no workers
        finally:
            server.terminate()
            _, log = server.communicate(timeout=60)
    assert server.returncode == 0, log
    assert re.search(r"workers auto: one process, for 1 usable core \(\d+ on the machine.*CPU quota of 0\.5\)", log), (
        log
    )
    assert "supervisor" not in log


def _healthz_pid(port: int, server: subprocess.Popen[str]) -> int:
    started = time.monotonic()
    while time.monotonic() - started < 90:
        assert server.poll() is None, server.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                return int(json.load(answer)["pid"])
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the server never answered /healthz")
