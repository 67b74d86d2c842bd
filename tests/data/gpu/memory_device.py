"""GPU memory with its stacks on the device (issue #37 item 2): run by device_memory.sh.

``python3 memory_device.py OUT`` measures, each under ``pyrun -e gpu=nvidia,memory`` (and
prints a PASS/FAIL line per check):

1. a PyTorch training step (a small ResNet-like model): our peak against
   ``torch.cuda.max_memory_allocated()`` and against the peak replayed from
   ``torch.cuda.memory._snapshot()`` taken by the program at its end (the same run), within 1 %;
   the top 5 allocation sites by bytes live at the peak the same as the snapshot's; the
   database's GMEMLIVE:ATPEAK summing to the peak; the timeline's counters in the trace export;
2. the cost: the same training steps under pyrun without memory and with it (a ratio of the
   median step times) and without pyrun (for scale);
3. a CuPy program whose pool allocations (sizes and lines known) must be the sites found;
4. a PyTorch and a CuPy program that run out of memory and die of it: the report must be there,
   name the size asked for and the live 1 GiB block's line.

The other modes are the programs measured (``--train DIR STEPS``, ``--cupy DIR``,
``--oom-torch``, ``--oom-cupy``).
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
MIB = 1 << 20
results: list[tuple[str, bool]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)


# -- the programs measured ---------------------------------------------------------------------


def train(directory: str, steps: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)

    def block(channels_in: int, channels: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(channels_in, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        )

    model = nn.Sequential(
        block(3, 64), nn.MaxPool2d(2), block(64, 128), nn.MaxPool2d(2), block(128, 256),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100),
    ).cuda()  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(128, 3, 64, 64, device="cuda")
    labels = torch.randint(0, 100, (128,), device="cuda")
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(data), labels)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    snapshot = torch.cuda.memory._snapshot()
    with open(out / "snapshot.pickle", "wb") as file:
        pickle.dump(snapshot, file)
    stats = {
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "step_s": times,
        "torch": torch.__version__,
    }
    (out / "stats.json").write_text(json.dumps(stats))


def cupy_program(directory: str) -> None:
    import cupy

    lines = {}
    kept = cupy.empty(3 * MIB, dtype=cupy.uint8)  # SITE kept
    lines["kept"] = sys._getframe().f_lineno - 1
    many = [cupy.empty(MIB, dtype=cupy.uint8) for _ in range(4)]  # SITE many
    lines["many"] = sys._getframe().f_lineno - 1
    big = cupy.empty(5 * MIB, dtype=cupy.uint8)  # SITE big
    lines["big"] = sys._getframe().f_lineno - 1
    cupy.cuda.Device().synchronize()
    del many, big
    truth = {"lines": lines, "at_peak": {"kept": 3 * MIB, "many": 4 * MIB, "big": 5 * MIB}}
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / "truth.json").write_text(json.dumps(truth))
    assert kept.size


def oom_torch() -> None:
    import torch

    kept = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # SITE oom-kept
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: out of memory
    print(kept.shape)


def oom_cupy() -> None:
    import cupy

    kept = cupy.empty(1 << 30, dtype=cupy.uint8)  # SITE oom-kept
    cupy.empty(1 << 50, dtype=cupy.uint8)
    print(kept.shape)


# -- the driver ----------------------------------------------------------------------------------


def run(argv: list[str], log: Path, timeout: int = 150) -> subprocess.CompletedProcess[str]:
    began = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    log.write_text(f"$ {' '.join(argv)}\nrc={done.returncode}\n{done.stdout}\n{done.stderr}")
    print(f"  ({time.time() - began:.1f} s, rc {done.returncode}: {' '.join(argv[-3:])})")
    return done


def pyrun(out: Path, name: str, event: str, *program: str) -> subprocess.CompletedProcess[str]:
    measurement = out / f"{name}.m"
    argv = [sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", event, "-o", str(measurement)]
    return run([*argv, sys.executable, str(HERE), *program], out / f"{name}.log")


def memory_file(measurement: Path) -> dict:
    return json.loads(next((measurement / "gpumem").glob("memory-*.json")).read_text())


def snapshot_replay(snapshot: dict) -> tuple[int, dict[str, int]]:
    """The peak of allocated bytes and each innermost frame's live bytes at it, from the
    snapshot's history (alloc until free_completed), as PyTorch's memory_viz reads it."""
    events = [e for trace in snapshot["device_traces"] for e in trace]
    events.sort(key=lambda e: e.get("time_us", 0))
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[str, int] = {}
    for event in events:
        if event["action"] == "alloc":
            frames = event.get("frames") or []
            where = " < ".join(
                f"{f['filename']}:{f['line']}" for f in frames if OURS not in f["filename"]
            )
            live[event["addr"]] = (event["size"], where)
            total += event["size"]
            if total > peak:
                peak = total
                at_peak = {}
                for size, site in live.values():
                    at_peak[site] = at_peak.get(site, 0) + size
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    return peak, at_peak


OURS = os.sep + os.path.join("pyhpctk", "measure") + os.sep  # pyrun's own frames


def stack_key(site: dict) -> str:
    """A site's stack as the snapshot replay keys it: ``file:line`` innermost first."""
    return " < ".join(frame[frame.rindex("(") + 1 : -1] for frame in site["stack"])


def top_with_ties(values: dict[str, int], count: int) -> set[str]:
    """The ``count`` largest, and every other as large as the smallest of them."""
    ranked = sorted(values.values(), reverse=True)
    floor = ranked[min(count, len(ranked)) - 1] if ranked else 0
    return {key for key, value in values.items() if value >= floor and value > 0}


def training_checks(out: Path, steps: int) -> float:
    pyrun(out, "train", "gpu=nvidia,memory", "--train", str(out / "train"), str(steps))
    stats = json.loads((out / "train" / "stats.json").read_text())
    ours = memory_file(out / "train.m")
    with open(out / "train" / "snapshot.pickle", "rb") as file:
        snapshot = pickle.load(file)
    peak, at_peak = snapshot_replay(snapshot)
    # PyTorch's part of each site (the snapshot knows no other allocator: a line whose PyTorch
    # call also made cuBLAS cudaMalloc its workspace keeps its torch bytes), keyed as the
    # snapshot's
    our_values = {
        stack_key(site): site["at_peak_by_source"]["torch"]
        for site in ours["top_sites"]
        if site["at_peak_by_source"].get("torch")
    }
    top_ours, top_theirs = top_with_ties(our_values, 5), top_with_ties(at_peak, 5)
    (out / "train_compare.json").write_text(
        json.dumps({"ours": our_values, "snapshot": at_peak, "peak": peak}, indent=1)
    )
    same_bytes = all(at_peak.get(key) == our_values[key] for key in top_ours)
    allocated, torch_peak = stats["max_allocated"], ours["source_peaks"].get("torch", 0)
    print(f"  peaks by allocator: {ours['source_peaks']}; process {ours['peak_bytes']}")
    check(
        "torch peak vs max_memory_allocated within 1 %",
        abs(torch_peak - allocated) <= 0.01 * allocated,
        f"ours {torch_peak}, torch.cuda.max_memory_allocated() {allocated}",
    )
    check(
        "torch peak vs _snapshot() within 1 %",
        abs(torch_peak - peak) <= 0.01 * peak,
        f"ours {torch_peak}, snapshot's history {peak}",
    )
    check("torch top 5 sites (and their bytes at peak) as _snapshot()'s",
          top_ours == top_theirs and same_bytes,
          f"{len(top_ours)} sites; ours not theirs {top_ours - top_theirs}; theirs not ours"
          f" {top_theirs - top_ours}; train_compare.json")  # fmt: skip
    database = out / "train.d"
    run([sys.executable, "-m", "pyhpctk.cli.pyprof", "-o", str(database), str(out / "train.m")],
        out / "train_pyprof.log")  # fmt: skip
    from pyhpctk.present.api import open_database

    arrays = open_database(database).arrays(["GMEMLIVE:ATPEAK (B)"])
    root = float(arrays["GMEMLIVE:ATPEAK (B) (I)"][0])
    check("database: GMEMLIVE:ATPEAK sums to the peak", int(root) == ours["peak_bytes"],
          f"{int(root)} vs {ours['peak_bytes']}")  # fmt: skip
    export = out / "train_trace.json"
    run([sys.executable, "-m", "pyhpctk.cli.pyview", str(database), "--trace-export", str(export)],
        out / "train_pyview.log")  # fmt: skip
    counters = [e for e in json.loads(export.read_text())["traceEvents"] if e["ph"] == "C"]
    top = max((e["args"]["allocated"] for e in counters), default=0)
    check("trace export: memory counters up to the peak", top == ours["peak_bytes"],
          f"{len(counters)} counters, max {top}")  # fmt: skip
    return statistics.median(stats["step_s"][steps // 4 :])


def overhead(out: Path, steps: int, with_memory_s: float) -> None:
    medians = {"memory": with_memory_s}
    for name, argv in (
        ("plain", None),
        ("pyrun", ("gpu=nvidia",)),
    ):
        directory = out / f"train_{name}"
        program = ["--train", str(directory), str(steps)]
        if argv is None:
            run([sys.executable, str(HERE), *program], out / f"train_{name}.log")
        else:
            pyrun(out, f"train_{name}", argv[0], *program)
        stats = json.loads((directory / "stats.json").read_text())
        medians[name] = statistics.median(stats["step_s"][steps // 4 :])
    ratio = medians["memory"] / medians["pyrun"]
    line = (
        f"overhead: median step {medians['plain'] * 1e3:.2f} ms plain, {medians['pyrun'] * 1e3:.2f}"
        f" ms pyrun -e gpu=nvidia, {medians['memory'] * 1e3:.2f} ms with memory: memory/pyrun"
        f" = {ratio:.3f}x, pyrun/plain = {medians['pyrun'] / medians['plain']:.3f}x"
    )
    print(line)
    (out / "overhead.txt").write_text(line + "\n")


def cupy_checks(out: Path) -> None:
    pyrun(out, "cupy", "gpu=nvidia,memory", "--cupy", str(out / "cupy"))
    truth = json.loads((out / "cupy" / "truth.json").read_text())
    ours = memory_file(out / "cupy.m")
    by_line = {}
    for site in ours["top_sites"]:
        for frame in site["stack"]:
            if frame.endswith(")") and str(HERE) in frame:
                by_line[int(frame[frame.rindex(":") + 1 : -1])] = site["at_peak"]
                break
    found = {name: by_line.get(line, 0) for name, line in truth["lines"].items()}
    check("cupy pool sites and bytes at peak", found == truth["at_peak"],
          f"ours {found}, truth {truth['at_peak']}")  # fmt: skip
    cupy_peak = ours["source_peaks"].get("cupy", 0)
    check("cupy pool peak", cupy_peak == 12 * MIB, f"{cupy_peak}; process {ours['peak_bytes']}")
    reserved = max((max(d["reserved"], default=0) for d in ours["devices"]), default=0)
    check("cupy pool reserved in the timeline", reserved >= 12 * MIB, f"{reserved}")


def oom_checks(out: Path, which: str) -> None:
    done = pyrun(out, f"oom_{which}", "gpu=nvidia,memory", f"--oom-{which}")
    reports = sorted((out / f"oom_{which}.m" / "gpumem").glob("oom-*.txt"))
    died = done.returncode != 0 and "OutOfMemoryError" in done.stderr
    check(f"{which} OOM: the program died of it", died, f"rc {done.returncode}")
    check(f"{which} OOM: a report was written", len(reports) == 1, str(reports))
    if not reports:
        return
    text = reports[0].read_text()
    kept_line = next(
        i for i, t in enumerate(HERE.read_text().splitlines(), 1)
        if t.endswith("# SITE oom-kept") and (which in t)
    )  # fmt: skip
    check(f"{which} OOM: names the live 1 GiB and its line",
          "1.00 GiB live" in text and f"{HERE}:{kept_line})" in text, text[:600])  # fmt: skip
    check(f"{which} OOM: pyrun's summary points to it", str(reports[0]) in done.stderr)


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    steps = int(os.environ.get("MEMORY_STEPS", "40"))
    began = time.time()

    def group(name: str, body: Callable[[], object]) -> object:
        try:
            return body()
        except Exception as error:  # one group's failure leaves the others' lines
            check(name, False, f"{error!r} (see its log under {out})")
            return None

    with_memory = group("torch training step", lambda: training_checks(out, steps))
    if isinstance(with_memory, float):
        group("overhead", lambda: overhead(out, steps, with_memory))
    group("cupy program", lambda: cupy_checks(out))
    group("torch out of memory", lambda: oom_checks(out, "torch"))
    group("cupy out of memory", lambda: oom_checks(out, "cupy"))
    failed = [name for name, ok in results if not ok]
    print(f"{len(results) - len(failed)}/{len(results)} passed in {time.time() - began:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "--train":
        train(sys.argv[2], int(sys.argv[3]))
    elif mode == "--cupy":
        cupy_program(sys.argv[2])
    elif mode == "--oom-torch":
        oom_torch()
    elif mode == "--oom-cupy":
        oom_cupy()
    else:
        sys.exit(main(Path(mode)))
