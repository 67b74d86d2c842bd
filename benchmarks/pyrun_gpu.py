"""Overhead of pyrun's GPU measurement on a real GPU (issue #6, item 8).

    PYTHONPATH=src python3 benchmarks/pyrun_gpu.py --all [--out results.json]

Workloads (each timed after a warm-up, GPU synchronized at the end of the timed region):

- ``launch``: a launch-bound CuPy loop, 20,000 tiny elementwise kernels;
- ``compute``: a compute-bound CuPy loop of large (8192²) float32 matrix products;
- ``torch``: PyTorch training steps of a 4-layer MLP (forward, backward, SGD step);
- ``resnet18``: torchvision ResNet-18 training steps, batch 64 of 224² images, AdamW
  (random weights and data, nothing downloaded; issue #18);
- ``gpt2``: Hugging Face ``GPT2LMHeadModel`` from ``GPT2Config(n_layer=6, n_embd=512,
  n_head=8)``, random weights, batch 8 of 256 tokens, AdamW (issue #18).

Modes, each in its own process (CUPTI allows one subscriber per process):

- ``plain``: no measurement;
- ``pyrun``: a pyrun session (CPU-time sampler at 200 Hz) with ``gpu=nvidia`` installed, as
  ``pyrun -e CPUTIME -e gpu=nvidia`` runs it (the C CUPTI hook, ``hook=c``; synchronizations
  timed by the hook, the default ``sync=api``);
- ``pyrun-syncact``: the same with ``gpu=nvidia,sync=activity`` (CUPTI's SYNCHRONIZATION
  records, as before issue #18's ``sync=api``: about 30 % on PyTorch models);
- ``pyrun-pyhook``: the same with ``gpu=nvidia,hook=python`` (cupti-python's callbacks);
  the timed region includes attributing activities
  at safe points, the final flush and attribution are reported separately (``shutdown_s``);
- ``pyrun-t``: ``pyrun`` with tracing (``-t``: stream traces written at the end);
- ``torchprof``: ``torch.profiler`` with CUDA activities and ``with_stack=True`` (the Python
  calling context, as pyrun records it), on the PyTorch workloads only.

Steady state: ``--settle N`` (default 1) runs the workload N more times inside each mode's
measurement before the timed repetitions, in every mode (plain too), so the timed region
excludes first-sight costs (pyrun's slow path at each new launch site, torch.profiler's
warm-up) that a longer run amortises; ``--settle 0`` times them.

The reported ratio is the timed region's wall time over the plain run's (best of ``--repeat``):
a table of the best of all rounds, then the median and range of the ratios to the plain run of
the same round (``--rounds``; ``--cpus 2-5`` pins every run to the same processors, since
plain runs alone differ by up to 30 % between processes on the device machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

WORKLOADS = ("launch", "compute", "torch", "resnet18", "gpt2")
TORCH_WORKLOADS = ("torch", "resnet18", "gpt2")


def _launch(cp: object, n: int = 20000) -> None:
    x = cp.ones(256, dtype=cp.float32)  # type: ignore[attr-defined]
    for _ in range(n):
        x = x + 1.0
    cp.cuda.Device().synchronize()  # type: ignore[attr-defined]


def _compute(cp: object, n: int = 20) -> None:
    a = cp.random.rand(8192, 8192, dtype=cp.float32)  # type: ignore[attr-defined]
    for _ in range(n):
        b = a @ a
    del b
    cp.cuda.Device().synchronize()  # type: ignore[attr-defined]


def _torch_setup() -> tuple[object, ...]:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 10),
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(512, 2048, device="cuda")
    target = torch.randint(0, 10, (512,), device="cuda")
    return torch, model, optimizer, data, target


def _torch_steps(setup: tuple[object, ...], n: int = 50) -> None:
    torch, model, optimizer, data, target = setup
    loss_fn = torch.nn.functional.cross_entropy  # type: ignore[attr-defined]
    for _ in range(n):
        optimizer.zero_grad()  # type: ignore[attr-defined]
        loss = loss_fn(model(data), target)  # type: ignore[operator]
        loss.backward()
        optimizer.step()  # type: ignore[attr-defined]
    torch.cuda.synchronize()  # type: ignore[attr-defined]


def _model_steps(workload: str, steps: int) -> Callable[[], None]:
    """``steps`` training steps of ResNet-18 or the GPT-2 configuration (random, local)."""
    return model_steps(workload, steps)[1]


def model_steps(workload: str, steps: int) -> tuple[object, Callable[[], None]]:
    """The model and a function that runs ``steps`` training steps of ResNet-18 or the GPT-2
    configuration (random, local), then synchronizes (tests/data/gpu/ranges_device.py too)."""
    import torch

    if workload == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(weights=None, num_classes=1000).cuda()
        data = torch.randn(64, 3, 224, 224, device="cuda")
        target = torch.randint(0, 1000, (64,), device="cuda")

        def loss_of() -> object:
            return torch.nn.functional.cross_entropy(model(data), target)

    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=256, vocab_size=8192)
        model = GPT2LMHeadModel(config).cuda()
        tokens = torch.randint(0, config.vocab_size, (8, 256), device="cuda")

        def loss_of() -> object:
            return model(input_ids=tokens, labels=tokens).loss

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of()
            loss.backward()  # type: ignore[attr-defined]
            optimizer.step()
        torch.cuda.synchronize()

    return model, run


#: pyrun's modes and the GPU event each installs (the C hook unless said).
PYRUN_MODES = {
    "pyrun": "gpu=nvidia,hook=c",
    "pyrun-t": "gpu=nvidia,hook=c",
    "pyrun-syncact": "gpu=nvidia,hook=c,sync=activity",
    "pyrun-pyhook": "gpu=nvidia,hook=python",
}


def run_one(
    workload: str, mode: str, repeat: int, steps: int = 10, settle: int = 1
) -> dict[str, object]:
    """Time one workload in one mode (this process), after ``settle`` untimed repetitions."""
    if workload == "torch":
        setup = _torch_setup()
        body = lambda: _torch_steps(setup)  # noqa: E731
    elif workload in ("resnet18", "gpt2"):
        body = _model_steps(workload, steps)
    else:
        import cupy as cp

        body = (lambda: _launch(cp)) if workload == "launch" else (lambda: _compute(cp))
    body()  # warm-up: kernels compiled and loaded, pools filled
    result: dict[str, object] = {"workload": workload, "mode": mode, "settle": settle}
    times: list[float] = []
    if mode in PYRUN_MODES:
        from pyhpctk.measure.gpu import install, shutdown
        from pyhpctk.measure.launch import runtime

        out = tempfile.mkdtemp(prefix="pyrun-gpu-bench-")
        session = runtime.start(out, trace=mode == "pyrun-t", install_hooks=False)
        monitor = install(session, PYRUN_MODES[mode])
        for _ in range(settle):
            body()
        for _ in range(repeat):
            began = time.perf_counter()
            body()
            times.append(time.perf_counter() - began)
        native = getattr(monitor.backend, "native", None)
        if native is not None:
            result["hook"] = native.stats()
        syncs = getattr(monitor.backend, "api_syncs", None)  # sync=api: rows the hook made
        result["sync_rows"] = syncs.rows if syncs is not None else None
        began = time.perf_counter()
        stats = shutdown(monitor)
        runtime.stop(session)
        result["shutdown_s"] = time.perf_counter() - began
        result["stats"] = stats.as_dict()
        result["files"] = len(os.listdir(out))
        shutil.rmtree(out, ignore_errors=True)  # nothing of one run is left for the next
    elif mode == "torchprof":
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=activities, with_stack=True) as prof:
            for _ in range(settle):
                body()
            for _ in range(repeat):
                began = time.perf_counter()
                body()
                times.append(time.perf_counter() - began)
        began = time.perf_counter()
        events = prof.key_averages()
        result["shutdown_s"] = time.perf_counter() - began
        result["events"] = len(events)
        del torch
    else:
        for _ in range(settle):
            body()
        for _ in range(repeat):
            began = time.perf_counter()
            body()
            times.append(time.perf_counter() - began)
    result["times"] = times
    result["best"] = min(times)
    return result


def run_all(
    repeat: int,
    rounds: int = 2,
    workloads: tuple[str, ...] = WORKLOADS,
    cpus: str = "",
    steps: int = 10,
    modes: tuple[str, ...] = (),
    budget: float = 0.0,
    out: str | None = None,
    settle: int = 1,
    torchprof_last: int = 0,
) -> list[dict[str, object]]:
    """Every workload in every mode, ``rounds`` times over, modes alternating (drift-fair).

    ``torchprof_last`` (rounds, 0: torch.profiler in every round): torch.profiler's runs leave
    the interleaved rounds and come after them, that many rounds of (plain, torchprof) per
    PyTorch workload, numbered after the others (on an H100, pyrun's GPT-2 runs that came
    after torch.profiler runs grew slower round after round; whether torch.profiler did it is
    open: benchmarks/RESULTS.md).

    ``cpus`` ("2-5", "3,4"): the processors every child is pinned to, so that plain and
    measured runs do not land on different cores (``os.sched_setaffinity``). ``budget``
    (seconds, 0: none): no round is started that the slowest round so far says would not end
    within it, so a time-limited run still ends with whole rounds and its tables. ``out``: the
    results so far are written there after each child.
    """
    results: list[dict[str, object]] = []

    def wanted(workload: str, late: bool) -> list[str]:
        profiled = ["torchprof"] if workload in TORCH_WORKLOADS else []
        chosen = ["plain", *profiled] if late else ["plain", *PYRUN_MODES]
        if not late and not torchprof_last:
            chosen += profiled
        return [m for m in chosen if not modes or m in modes]

    plan = [(r, w, m) for r in range(rounds) for w in workloads for m in wanted(w, False)]
    if torchprof_last and (not modes or "torchprof" in modes):
        late = [w for w in workloads if w in TORCH_WORKLOADS]
        plan += [
            (r, w, m) for r in range(rounds, rounds + torchprof_last) for w in late
            for m in wanted(w, True)
        ]  # fmt: skip
    began = time.monotonic()
    round_began, slowest, current = began, 0.0, 0
    for round_, workload, mode in plan:
        if round_ != current:  # a round ended: is there time for another?
            now = time.monotonic()
            slowest, round_began, current = max(slowest, now - round_began), now, round_
            if budget and now - began + slowest > budget:
                print(f"stopped after {round_} rounds: the budget of {budget:.0f} s", flush=True)
                break
        command = [sys.executable, __file__, "--workload", workload, "--mode", mode]
        command += ["--repeat", str(repeat), "--steps", str(steps), "--settle", str(settle)]
        command += ["--cpus", cpus] if cpus else []
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            result = {"workload": workload, "mode": mode, "error": done.stderr[-2000:]}
        else:
            result = json.loads(lines[-1])
        result["round"] = round_
        results.append(result)
        print(json.dumps(result), flush=True)
        if out:
            with open(out, "w", encoding="utf-8") as stream:
                json.dump(results, stream, indent=1)
    return results


def paired(results: list[dict[str, object]]) -> str:
    """Markdown: each mode's ratio to the plain run of the same round, median and range."""
    plain = {
        (r["round"], r["workload"]): float(r["best"])  # type: ignore[arg-type]
        for r in results
        if r["mode"] == "plain" and "best" in r
    }
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in results:
        base = plain.get((r["round"], r["workload"]))
        if r["mode"] != "plain" and "best" in r and base:
            key = (str(r["workload"]), str(r["mode"]))
            ratios.setdefault(key, []).append(float(r["best"]) / base)  # type: ignore[arg-type]
    rows = [
        "| workload | mode | rounds | median ratio | min | max |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (workload, mode), values in ratios.items():
        values.sort()
        median = (
            values[len(values) // 2]
            if len(values) % 2
            else sum(values[len(values) // 2 - 1 : len(values) // 2 + 1]) / 2
        )
        rows.append(
            f"| {workload} | {mode} | {len(values)} | {median:.3f}x | {values[0]:.3f}x "
            f"| {values[-1]:.3f}x |"
        )
    return "\n".join(rows)


def _cpu_list(text: str) -> set[int]:
    """``2-5,8`` → {2, 3, 4, 5, 8}."""
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def table(results: list[dict[str, object]]) -> str:
    """Markdown: the best time of each (workload, mode) over all rounds, and its ratio."""
    best: dict[tuple[str, str], dict[str, object]] = {}
    for r in results:
        key = (str(r["workload"]), str(r["mode"]))
        known = best.get(key)
        if known is None or ("best" in r and float(r["best"]) < float(known.get("best", 1e300))):  # type: ignore[arg-type]
            best[key] = r
    plain = {w: r.get("best") for (w, m), r in best.items() if m == "plain"}
    rows = [
        "| workload | mode | best wall (s) | ratio to plain | flush+write (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in best.values():
        if "best" not in r:
            rows.append(f"| {r['workload']} | {r['mode']} | error | | |")
            continue
        wall = float(r["best"])  # type: ignore[arg-type]
        base = plain.get(str(r["workload"]))
        ratio = f"{wall / float(base):.3f}x" if base else ""  # type: ignore[arg-type]
        shutdown = f"{float(r['shutdown_s']):.3f}" if "shutdown_s" in r else ""  # type: ignore[arg-type]
        rows.append(f"| {r['workload']} | {r['mode']} | {wall:.4f} | {ratio} | {shutdown} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--workload", choices=WORKLOADS)
    parser.add_argument(
        "--mode",
        choices=("plain", *PYRUN_MODES, "torchprof"),
        default="plain",
    )
    parser.add_argument("--steps", type=int, default=10, help="training steps per repetition")
    parser.add_argument("--modes", default="", help="subset of modes (--all), e.g. plain,pyrun")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--settle", type=int, default=1, help="untimed repetitions inside the measurement first"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every mode (--all)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="subset (--all)")
    parser.add_argument("--cpus", default="", help="pin every run to these CPUs, e.g. 2-5")
    parser.add_argument(
        "--budget", type=float, default=0.0, help="seconds (--all): start no round past them"
    )
    parser.add_argument(
        "--torchprof-last",
        type=int,
        default=0,
        metavar="N",
        help="torch.profiler's runs after the other rounds, N rounds of them (--all)",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, _cpu_list(args.cpus))
    if args.all:
        chosen = tuple(w for w in args.workloads.split(",") if w)
        unknown = set(chosen) - set(WORKLOADS)
        if unknown:
            parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
        modes = tuple(m for m in args.modes.split(",") if m)
        results = run_all(
            args.repeat,
            args.rounds,
            chosen,
            args.cpus,
            args.steps,
            modes,
            args.budget,
            args.out,
            args.settle,
            args.torchprof_last,
        )
        print(table(results))
        print()
        print(paired(results))
        return 0
    print(json.dumps(run_one(args.workload, args.mode, args.repeat, args.steps, args.settle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
