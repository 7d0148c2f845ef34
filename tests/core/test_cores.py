"""`FEDRESEARCH_WORKERS=auto` counts the cores this process may use, not the machine's: a container
limited to 2 CPUs on a 64-core node must not start 64 workers; nor, limited to 1 GB, 16 workers
that need 4 between them."""

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

from fedresearch.core.cores import MB, Memory, auto_workers, cpu_quota, usable_cores, usable_memory
from fedresearch.core.settings import Settings
from fedresearch.serve.launch import worker_vectors

V1_MOUNTS = "32 31 0:29 {root} {mount} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
V1_MEMORY_MOUNTS = "35 31 0:32 {root} {mount} rw,relatime - cgroup cgroup rw,memory\n"
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


def meminfo(tmp_path: Path, available_mb: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {4 * available_mb * 1024} kB\nMemAvailable:   {available_mb * 1024} kB\n")
    return path


def test_a_cgroup_v2_memory_limit_caps_the_workers_auto_starts(tmp_path):
    """A pod limited to 1 GiB on a machine with 64 GB free: the tightest `memory.max` above the
    process is the memory available, and `auto` starts the workers that fit in it, not a worker
    per core."""
    mount = tmp_path / "cg"
    group(mount, memory_max="max")
    group(mount / "kubepods.slice" / "pod1", memory_max=str(1024 * MB), cpu_max="max 100000")
    group(mount / "kubepods.slice" / "pod1" / "app", memory_max="max", cpu_max="max 100000")
    proc = proc_dir(tmp_path, V2_MOUNTS.format(mount=mount), "0::/kubepods.slice/pod1/app\n")
    memory = usable_memory(proc, meminfo(tmp_path, 64_000))
    assert memory is not None and memory.limit == memory.available == 1024 * MB
    with_model, without = (
        auto_workers(True, proc, meminfo(tmp_path, 64_000)),
        auto_workers(False, proc, meminfo(tmp_path, 64_000)),
    )
    cores = len(os.sched_getaffinity(0))
    # 1,024 MB less what one process writing the model's graph and the supervisor take, 256 MB a worker
    assert with_model.fitting == 2 and with_model.count == min(cores, 2)
    assert without.fitting == 7 and without.count == min(cores, 7)  # (1,024 - 64) // 128
    if cores > 2:
        assert "and 1,024 MB of memory available, a cgroup memory limit of 1,024 MB" in with_model.describe()
        assert "about 256 MB a worker with the embedding model" in with_model.describe()
    # a tighter limit below the pod's wins; the machine's MemAvailable, when lower, too
    group(mount / "kubepods.slice" / "pod1" / "app", memory_max=str(300 * MB))
    assert auto_workers(True, proc, meminfo(tmp_path, 64_000)).count == 1  # one, even where none fits
    assert usable_memory(proc, meminfo(tmp_path, 200)) == Memory(200 * MB, 300 * MB)


def test_a_cgroup_v1_memory_limit_and_its_unlimited_value(tmp_path):
    """v1 writes "no limit" as the largest page-aligned number (2^63 - 4096 on x86-64)."""
    mount = tmp_path / "memory"
    group(mount, memory_limit_in_bytes=str(2**63 - 4096))
    proc = proc_dir(
        tmp_path,
        V1_MEMORY_MOUNTS.format(root="/docker/3f2a", mount=mount),
        "12:pids:/docker/3f2a\n9:memory:/docker/3f2a\n4:cpu,cpuacct:/docker/3f2a\n0::/\n",
    )
    info = meminfo(tmp_path, 8_000)
    assert usable_memory(proc, info) == Memory(8_000 * MB, None)
    group(mount, memory_limit_in_bytes=str(512 * MB))
    memory = usable_memory(proc, info)
    assert memory is not None and (memory.available, memory.limit) == (512 * MB, 512 * MB)
    assert auto_workers(False, proc, info).fitting == 3  # (512 - 64) // 128
    # no /proc/meminfo (not Linux): the cores alone decide, as before
    unknown = auto_workers(True, proc, tmp_path / "nowhere")
    assert unknown.memory is None and unknown.fitting is None and unknown.count == usable_cores(proc).usable
    assert unknown.crowded(64) is None


def test_more_workers_than_fit_are_started_with_a_warning_that_says_so(tmp_path):
    mount = tmp_path / "memory"
    group(mount, memory_limit_in_bytes=str(512 * MB))
    proc = proc_dir(tmp_path, V1_MEMORY_MOUNTS.format(root="/", mount=mount), "9:memory:/\n")
    auto = auto_workers(False, proc, meminfo(tmp_path, 8_000))
    assert auto.crowded(3) is None
    assert auto.crowded(16) == (
        "16 workers may not fit in 512 MB of memory available, a cgroup memory limit of 512 MB (about 128 MB a "
        "worker without the embedding model): FEDRESEARCH_WORKERS=auto would start 3"
    )


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
def limited_group(controller: str, v1: dict[str, str], v2: dict[str, str]) -> Iterator[Path]:
    """A real cgroup with the files `v1` or `v2` written (on cgroup v1, in `controller`'s mount; on
    v2, under a root that delegates it), removed after. Needs root; skips where the kernel refuses."""
    name = f"fedresearch-test-{uuid.uuid4().hex[:8]}"
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    v1_mounts = [
        line.split()[4] for line in mounts if " - cgroup " in line and controller in line.split()[-1].split(",")
    ]
    v2_mounts = [line.split()[4] for line in mounts if " - cgroup2 " in line]
    try:
        if v1_mounts:
            path, files = Path(v1_mounts[0]) / name, v1
        elif v2_mounts and controller in (Path(v2_mounts[0]) / "cgroup.subtree_control").read_text().split():
            path, files = Path(v2_mounts[0]) / name, v2
        else:
            pytest.skip(f"no cgroup file system with the {controller} controller to create a group in")
        path.mkdir()
        for file, text in files.items():
            (path / file).write_text(text)
    except OSError as error:
        pytest.skip(f"cannot create a cgroup with a {controller} limit here (root, and a writable cgroup fs): {error}")
    try:
        yield path
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                path.rmdir()
                break
            time.sleep(0.1)


def cpu_limited_group(cores: float) -> contextlib.AbstractContextManager[Path]:
    quota = int(cores * 100_000)
    return limited_group("cpu", {"cpu.cfs_quota_us": str(quota)}, {"cpu.max": f"{quota} 100000"})


def serve_auto_in(group_path: Path, tmp_path: Path) -> tuple[int, str]:
    """`fedresearch serve --workers auto` run inside a real group, embeddings off: whether the server
    itself answered /healthz (no supervisor), and its log once stopped."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "FEDRESEARCH_DATA_DIR": str(tmp_path / "data"),
        "FEDRESEARCH_API_KEYS": "",
        "FEDRESEARCH_EMBEDDINGS": "false",
    }
    # the shell joins the group, then becomes the server: every process it starts stays in it
    join = f'echo $$ > "{group_path}/cgroup.procs" && exec "$@"'
    command = ["sh", "-c", join, "sh", sys.executable, "-m", "fedresearch", "serve"]
    command += ["--workers", "auto", "--port", str(port)]
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        alone = _healthz_pid(port, server) == server.pid
    finally:
        server.terminate()
        _, log = server.communicate(timeout=60)
    assert server.returncode == 0, log
    return alone, log


def test_serve_with_auto_workers_obeys_a_real_cgroup_cpu_quota(tmp_path):
    """`fedresearch serve --workers auto` in a group held to half a core, on a machine of two or more:
    one process, which says why, and serves; before, one worker per core of the machine."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU only: auto means one process with or without a quota")
    with cpu_limited_group(0.5) as limited:
        alone, log = serve_auto_in(limited, tmp_path)
    assert alone  # the server itself answers: no supervisor, no workers
    assert re.search(r"workers auto: one process, for 1 usable core \(\d+ on the machine.*CPU quota of 0\.5\)", log), (
        log
    )
    assert "supervisor" not in log


def test_serve_with_auto_workers_obeys_a_real_cgroup_memory_limit(tmp_path):
    """The same in a group limited to 180 MB of memory, on a machine of two cores or more: one
    process (a worker without the model is allowed 128 MB, the supervisor 64), which serves and says
    why; before, a worker per core, and the OOM killer among them."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU only: auto means one process with or without a memory limit")
    limit = str(180 * MB)
    with limited_group("memory", {"memory.limit_in_bytes": limit}, {"memory.max": limit}) as limited:
        alone, log = serve_auto_in(limited, tmp_path)
    assert alone, log
    assert re.search(
        r"workers auto: one process, for \d+ usable cores \(.*\) and 180 MB of memory available, "
        r"a cgroup memory limit of 180 MB \(about 128 MB a worker without the embedding model\)",
        log,
    ), log


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


def test_auto_counts_the_library_vectors_each_worker_may_hold(tmp_path):
    """A worker of the embedded library also holds the vectors of the users it searched, up to
    LIBRARY_VECTOR_CACHE_MB: with a library that large, fewer workers fit."""
    mount = tmp_path / "memory"
    group(mount, memory_limit_in_bytes=str(1024 * MB))
    proc = proc_dir(tmp_path, V1_MEMORY_MOUNTS.format(root="/", mount=mount), "9:memory:/\n")
    info = meminfo(tmp_path, 8_000)
    assert auto_workers(True, proc, info).fitting == 2  # (1,024 - 512) // 256
    holding = auto_workers(True, proc, info, vectors=256 * MB)
    assert holding.fitting == 1  # (1,024 - 512) // (256 + 256)
    assert "(about 256 MB a worker with the embedding model, and up to 256 MB of the library's vectors)" in (
        holding.crowded(4) or ""
    )

    def settings(**values: object) -> Settings:
        return Settings(_env_file=None, FEDRESEARCH_DATA_DIR=str(tmp_path / "data"), **values)  # type: ignore[call-arg]

    assert worker_vectors(settings()) == 0  # no library yet
    store = settings().library_dir / "library.sqlite3"
    store.parent.mkdir(parents=True)
    with store.open("wb") as file:  # sparse: only its size is read
        file.truncate(40 * MB)
    assert worker_vectors(settings()) == 40 * MB
    with store.open("wb") as file:
        file.truncate(3 * 1024 * MB)
    assert worker_vectors(settings()) == 512 * MB  # the vector cache's bound
    assert worker_vectors(settings(LIBRARY_VECTOR_CACHE_MB=64)) == 64 * MB
    assert worker_vectors(settings(FEDRESEARCH_EMBEDDINGS=False)) == 0  # BM25 alone holds no vectors
    remote = settings(FEDRESEARCH_LIBRARY_URL="postgresql://db/fedresearch")
    assert worker_vectors(remote) == 0  # pgvector searches in the database
