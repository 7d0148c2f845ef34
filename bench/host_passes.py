"""The encoder's passes of several processes of one host, with the host's budget of passes and without.

    python -m bench.host_passes [--processes 4] [--passes 8] [--rounds 2]

`--processes` processes (a host's workers), each with an encoder of `--passes` passes at once (a
worker's default is one per usable core: 8 is what one call of an upload runs at once on a 16-core
host), all encode an upload's 256 passages of about 250 tokens at the same moment, as the library
sends them (64 a call, 8 a pass). With the budget (library/host_passes.py) their passes together
hold at most one slot per usable core of this machine; without it ("each on its own": each process
is given no slots, as before) every process runs its own passes. Rounds alternate the two. Printed
per process: how much its private memory grew at most while it encoded (RssAnon sampled every
10 ms, against after a first question) and the seconds it took.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.load import ROOT

_ENCODING = """
import os, sys, threading, time
from pathlib import Path
from bench.worker_memory import anonymous_mb
from fedresearch.library import embeddings, host_passes

if sys.argv[2] == "each on its own":
    host_passes.HostPasses.open = classmethod(lambda cls, folder, slots: None)

def private_mb():
    return anonymous_mb({os.getpid()})

encoder = embeddings.load_encoder(cache_dir=Path(sys.argv[1]), passes=int(sys.argv[3]))
encoder.encode(["a first question"])
passages = [("Federated retrieval merges the ranked lists of several engines; " * 24) + str(i) for i in range(256)]
before = most = private_mb()
done = threading.Event()

def sample():
    global most
    while not done.wait(0.01):
        most = max(most, private_mb())

sampler = threading.Thread(target=sample)
sampler.start()
print("ready", flush=True)
sys.stdin.readline()
started = time.perf_counter()
for start in range(0, len(passages), 64):
    encoder.encode(passages[start : start + 64], batch_size=8)
took = time.perf_counter() - started
done.set()
sampler.join()
print(most - before, took)
"""

MODES = ("with the host's budget", "each on its own")


def run(models: Path, mode: str, processes: int, passes: int) -> list[tuple[float, float]]:
    """Every process's memory growth (MB) and seconds, started together once all are ready."""
    command = [sys.executable, "-c", _ENCODING, str(models), mode, str(passes)]
    children = [
        subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("an encoding process did not start (is the embedding model installed?)")
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = []
    for child in children:
        out, _ = child.communicate(timeout=1200)
        grown, took = out.split()
        results.append((float(grown), float(took)))
    return results


def main(options: argparse.Namespace) -> None:
    models = Path(tempfile.mkdtemp(prefix="bench-host-passes-"))  # the graph, and the host's slots
    totals: dict[str, list[float]] = {mode: [] for mode in MODES}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    print(f"{options.processes} processes of {options.passes} passes each, an upload's 256 passages each at once")
    try:
        for round_number in range(1, options.rounds + 1):
            for mode in MODES:
                results = run(models, mode, options.processes, options.passes)
                grown = [g for g, _ in results]
                slowest = max(t for _, t in results)
                totals[mode].append(sum(grown))
                times[mode].append(slowest)
                each = ", ".join(f"{g:.0f}" for g in grown)
                print(
                    f"round {round_number} {mode:<24} grew {each} MB: {sum(grown):,.0f} MB together; "
                    f"all done in {slowest:.1f} s"
                )
    finally:
        shutil.rmtree(models, ignore_errors=True)
    ours, theirs = (statistics.median(totals[mode]) for mode in MODES)
    our_s, their_s = (statistics.median(times[mode]) for mode in MODES)
    print(
        f"median: {ours:,.0f} against {theirs:,.0f} MB together (ratio {ours / theirs:.2f}); "
        f"{our_s:.1f} against {their_s:.1f} s (ratio {our_s / their_s:.2f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    main(parser.parse_args())
