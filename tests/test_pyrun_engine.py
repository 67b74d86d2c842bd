"""pyrun's sampling engine against programs that know their truth (issue #16).

Each program in ``tests/programs/engine_cases.py`` measures itself (per-line and per-thread CPU
times, the process's CPU time) and pyrun's profiles must agree: self time where the thread was
at the tick, C calls under their calling line, generators and coroutines, deep recursion, two
threads, BLAS threads that Python never started, GIL waits, and blocking calls that keep their
timeouts under realtime signals. Profiles are read back with the format readers only.

These tests run on CPython 3.11 (the suite) and on 3.12 and 3.13 (``make test-engine``). Run
them with ``PYHPCTK_PYRUN_SAMPLER=thread`` to see the Python sampler thread fail them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import hpcrun, logical
from pyhpctk.formats.hpcrun_model import placeholder_text
from pyhpctk.measure.sampling import engine

PROGRAM = Path(__file__).resolve().parent / "programs" / "engine_cases.py"
PYTHON = sys.executable


@dataclass
class Profile:
    """One thread's profile: nodes as (parent, label, line), values by node and metric name."""

    thread: int
    nodes: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    values: dict[int, dict[str, float]] = field(default_factory=dict)

    def path(self, node: int) -> list[tuple[str, int]]:
        labels = []
        while node:
            parent, label, line = self.nodes[node]
            labels.append((label, line))
            node = parent
        return labels[::-1]

    def total(self, metric: str) -> float:
        return sum(v.get(metric, 0.0) for v in self.values.values())

    def inclusive(self, metric: str, label: str, line: int | None = None) -> float:
        """The metric over every node whose path passes through ``label`` (at ``line``)."""
        return sum(
            v.get(metric, 0.0)
            for node, v in self.values.items()
            if any(name == label and line in (None, at) for name, at in self.path(node))
        )

    def self_of(self, metric: str, label: str) -> float:
        return sum(
            v.get(metric, 0.0) for node, v in self.values.items() if self.nodes[node][1] == label
        )


def read_profiles(directory: Path) -> list[Profile]:
    profiles = []
    for path in sorted(directory.glob("*.hpcrun")):
        profile = hpcrun.read(path)
        assert hpcrun.verify(profile) == [], path
        stanzas = {
            module.id: logical.read(directory / module.path).by_fid()
            for module in profile.load_modules
            if module.path.startswith("logical/")
        }
        natives = {m.id: os.path.basename(m.path) for m in profile.load_modules}
        result = Profile(int(profile.header("thread-id")))
        for record in profile.cct:
            node, lm, ip = int(record["id"]), int(record["lm_id"]), int(record["lm_ip"])
            if lm == 0:
                label, line = placeholder_text(ip), 0
            elif lm not in stanzas:  # a native frame (issue #17): (load module, offset)
                label, line = f"<native> {natives[lm]}", ip
            else:
                stanza = stanzas[lm][ip >> 32]
                label = stanza.funcname or f"<module> {os.path.basename(stanza.filename)}"
                line = ip & 0xFFFFFFFF
            result.nodes[node] = (int(record["parent_id"]), label, line)
        names = [m.name for m in profile.metrics]
        node_ids, metrics, decoded = profile.decoded_values()
        for node, metric, value in zip(node_ids, metrics, decoded, strict=True):
            result.values.setdefault(int(node), {})[names[int(metric)]] = float(value)
        profiles.append(result)
    return profiles


def run_case(
    tmp_path: Path,
    case: str,
    seconds: float,
    events: tuple[str, ...] = ("CPUTIME@1000",),
    env: dict[str, str] | None = None,
) -> tuple[list[Profile], dict[str, object]]:
    out = tmp_path / "m"
    truth = tmp_path / "truth.json"
    args = [arg for event in events for arg in ("-e", event)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENBLAS_NUM_THREADS", "1")
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        status = pyrun_main(
            [*args, "-o", str(out), PYTHON, str(PROGRAM), case, str(truth), str(seconds)]
        )
    assert status == 0
    return read_profiles(out), json.loads(truth.read_text())


def main_profile(profiles: list[Profile]) -> Profile:
    (main,) = [p for p in profiles if p.thread == 0]
    return main


CPU = "CPUTIME (sec)"


def test_the_engine_is_built_for_this_interpreter() -> None:
    """pip builds the engine as optional: a compile error would leave the fallback (or a stale
    build) in place without a word. On the interpreters it supports, it must load, current."""
    assert engine.build_problem() == ""
    module, reason = engine.load_engine()
    assert module is not None, reason


@pytest.mark.parametrize("cpu_timer", ["sigtrap", "signal", "posix"])
def test_straight_line_code_before_a_trivial_call_keeps_its_self_time(
    tmp_path: Path, cpu_timer: str
) -> None:
    """Through each route of CPU samples: perf counters raising SIGTRAP (asked for), perf
    counters signalling through O_ASYNC and the realtime signal (the default), and POSIX
    CPU-clock timers (asked for, or where perf_events is refused)."""
    profiles, _ = run_case(tmp_path, "straight", 1.0, env={"PYHPCTK_PYRUN_CPU_TIMER": cpu_timer})
    main = main_profile(profiles)
    work = main.inclusive(CPU, "straight")
    assert work > 0.8
    assert main.inclusive(CPU, "tiny") <= 0.02 * work, (main.inclusive(CPU, "tiny"), work)
    assert main.self_of(CPU, "straight") >= 0.95 * work


def test_time_inside_c_calls_is_under_the_calling_line(tmp_path: Path) -> None:
    profiles, truth = run_case(tmp_path, "ccalls", 1.5)
    main = main_profile(profiles)
    times: dict[str, float] = truth["times"]  # type: ignore[assignment]
    lines: dict[str, int] = truth["lines"]  # type: ignore[assignment]
    total = sum(times.values())
    measured = {name: main.inclusive(CPU, "c_calls", lines[name]) for name in times}
    attributed = sum(measured.values())
    for name, seconds in times.items():
        share, truth_share = measured[name] / attributed, seconds / total
        assert share == pytest.approx(truth_share, abs=0.05), (name, measured, times)


def test_generators_and_coroutines_get_their_own_time(tmp_path: Path) -> None:
    profiles, truth = run_case(tmp_path, "generators", 2.0)
    main = main_profile(profiles)
    times: dict[str, float] = truth["times"]  # type: ignore[assignment]
    generator = main.inclusive(CPU, "numbers")
    consumer = main.inclusive(CPU, "generator_part") - generator
    expected = times["generator"] / (times["generator"] + times["consumer"])
    assert generator / (generator + consumer) == pytest.approx(expected, abs=0.06)
    a, b = main.inclusive(CPU, "light_task"), main.inclusive(CPU, "heavy_task")
    expected = times["coroutine_a"] / (times["coroutine_a"] + times["coroutine_b"])
    assert a / (a + b) == pytest.approx(expected, abs=0.06), (a, b, times)


def test_deep_recursion_keeps_every_frame_and_the_leafs_self_time(tmp_path: Path) -> None:
    profiles, truth = run_case(tmp_path, "recursion", 1.0)
    main = main_profile(profiles)
    depth = int(truth["depth"])  # type: ignore[call-overload]
    leaves = [node for node, (_, label, _) in main.nodes.items() if label == "straight"]
    deepest = max(sum(1 for label, _ in main.path(node) if label == "recurse") for node in leaves)
    assert deepest == depth + 1
    work = main.inclusive(CPU, "recurse")
    assert main.self_of(CPU, "straight") >= 0.95 * work, (work, main.total(CPU), truth)
    assert main.inclusive(CPU, "tiny") <= 0.02 * work


def test_two_threads_one_to_three_and_no_thread_above_its_clock(tmp_path: Path) -> None:
    profiles, truth = run_case(tmp_path, "threads", 2.0)
    clocks: dict[str, float] = truth["clocks"]  # type: ignore[assignment]
    exit_clocks: dict[str, float] = truth["exit_clocks"]  # type: ignore[assignment]
    (light,) = [p for p in profiles if p.inclusive(CPU, "light")]
    (heavy,) = [p for p in profiles if p.inclusive(CPU, "heavy")]
    light_work, heavy_work = light.inclusive(CPU, "light"), heavy.inclusive(CPU, "heavy")
    assert 100 * heavy_work / (light_work + heavy_work) == pytest.approx(
        100 * clocks["heavy"] / (clocks["light"] + clocks["heavy"]), abs=5
    )
    # Each thread's CPUTIME is its own clock's: never more than the clock read when the
    # thread's state is cleared (after pyrun's last sample), never much less than at the end of
    # its work.
    for profile, name in ((light, "light"), (heavy, "heavy")):
        assert profile.total(CPU) <= exit_clocks[name] + 1e-6, (profile.total(CPU), exit_clocks)
        assert profile.total(CPU) >= 0.9 * clocks[name], (profile.total(CPU), clocks)


@pytest.mark.parametrize("cpu_timer", ["sigtrap", "signal", "posix"])
def test_blas_threads_python_never_started_are_measured(tmp_path: Path, cpu_timer: str) -> None:
    env = {
        "OPENBLAS_NUM_THREADS": "2",
        "OMP_NUM_THREADS": "2",
        "PYHPCTK_PYRUN_CPU_TIMER": cpu_timer,
    }
    profiles, truth = run_case(tmp_path, "blas", 2.0, env=env)
    assert int(truth["threads"]) >= 2  # type: ignore[call-overload]
    # the program's CPU: the process's, less pyrun's own threads (drain, monitor), which the
    # program did not use and pyrun does not measure
    own = float(truth["pyrun_threads_cpu"])  # type: ignore[arg-type]
    process_cpu = float(truth["process_cpu"]) - own  # type: ignore[arg-type]
    # ... of which the engine can see what came after it began sampling (the interpreter's
    # start and pyrun's bootstrap before it, 0.05-0.25 s, are no thread's measured CPU)
    began = float(truth["sampling_began_cpu"])  # type: ignore[arg-type]
    assert 0 < began < process_cpu, (began, process_cpu)
    sampled = process_cpu - began
    attributed = sum(profile.total(CPU) for profile in profiles)
    assert 0 <= own < 0.2 * process_cpu, (own, process_cpu)
    assert attributed >= 0.95 * sampled, (attributed, sampled, began, own)
    # never more than the process used (its exit, after the program read its clock, is
    # measured too: the 3 % is for that; 1.4 % was seen on a loaded 2-core machine, and a
    # thread counted twice would be 30 % or more)
    assert attributed <= 1.03 * process_cpu, (attributed, process_cpu)
    native = [p for p in profiles if p.thread != 0 and p.total(CPU) > 0.05 * process_cpu]
    assert native, "the BLAS thread has a profile of its own"
    for profile in native:  # a thread that never ran Python: native frames under its fence
        labels = {label for _, label, _ in profile.nodes.values()}
        assert "| Thread" in labels and any(label.startswith("<native>") for label in labels)
        assert all(
            label in ("^Primary", "| Thread") or label.startswith("<native>") for label in labels
        ), labels


def test_a_thread_waiting_for_the_gil_shows_gil_wait_at_its_line(tmp_path: Path) -> None:
    profiles, truth = run_case(tmp_path, "gil", 1.0, events=("REALTIME@1000", "GILWAIT@1000"))
    walls: dict[str, float] = truth["walls"]  # type: ignore[assignment]
    line = int(truth["line"])  # type: ignore[call-overload]
    (waiter,) = [p for p in profiles if p.inclusive("REALTIME (sec)", "waiter")]
    (holder,) = [p for p in profiles if p.inclusive("REALTIME (sec)", "holder")]
    waiting = waiter.inclusive("GILWAIT (sec)", "waiter", line)
    # Each 0.1 ms sleep is followed by a wait for the GIL held by the other thread (up to the
    # 5 ms switch interval): most of the waiter's time.
    assert waiting >= 0.6 * (walls["waiter"] - walls["waiter_sleeping"]), (waiting, walls)
    assert holder.total("GILWAIT (sec)") <= 0.2 * walls["holder"], (
        holder.total("GILWAIT (sec)"),
        walls,
    )


def test_blocking_calls_keep_their_timeouts_under_realtime_signals(tmp_path: Path) -> None:
    _, truth = run_case(tmp_path, "eintr", 0, events=("REALTIME@1000",))
    checks: dict[str, bool] = truth["checks"]  # type: ignore[assignment]
    assert checks and all(checks.values()), checks


def test_code_objects_that_die_before_the_drain_are_still_named(tmp_path: Path) -> None:
    """exec'd code dies right after it ran, long before the drain names its frames: the code
    watcher (3.12+) or the deallocator hook (3.11) keeps it alive until then."""
    profiles, truth = run_case(tmp_path, "dying", 2.0)
    main = main_profile(profiles)
    assert int(truth["codes"]) > 100  # type: ignore[call-overload]
    labels = {label for _, label, _ in main.nodes.values()}
    assert "<unknown code>" not in labels
    exec_cpu: dict[str, float] = truth["exec_cpu"]  # type: ignore[assignment]
    total = sum(exec_cpu.values())
    measured = {name: main.inclusive(CPU, name) for name in exec_cpu}
    attributed = sum(measured.values())
    assert attributed == pytest.approx(total, rel=0.15), (measured, exec_cpu)
    for name, seconds in exec_cpu.items():  # each to its own function, not to a later one
        assert measured[name] / attributed == pytest.approx(seconds / total, abs=0.05), (
            measured,
            exec_cpu,
        )


FAULTING = """
import ctypes, json, sys, time
from pyhpctk.measure import _engine
caught = []
for _ in range(3):  # each time the next sample reads an unmapped page, as a stale frame can
    before = _engine.stats()["faults"]
    _engine.poison_next_sample()
    deadline = time.monotonic() + 10.0
    while _engine.stats()["faults"] == before and time.monotonic() < deadline:
        sum(i * i for i in range(2000))  # CPU time: samples
    caught.append(_engine.stats()["faults"] - before)
with open(sys.argv[1], "w") as stream:
    json.dump(caught, stream)
if sys.argv[2] == "crash":  # a fault of the program's own is not swallowed
    ctypes.string_at(0)
"""


def test_a_sample_whose_reads_fault_is_dropped_and_the_program_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Before: a frame read at the wrong moment (PyTorch's imports at 1 kHz, 57 runs in 92 on
    # the H200, 11 in 16 here with CPU torch) killed the program with SIGSEGV in read_frame.
    program = tmp_path / "faulting.py"
    program.write_text(FAULTING)
    truth = tmp_path / "caught.json"
    out = tmp_path / "m"
    args = ["-e", "CPUTIME@1000", "-o", str(out), PYTHON, str(program), str(truth), "run"]
    assert pyrun_main(args) == 0
    assert json.loads(truth.read_text()) == [1, 1, 1]
    (main,) = [p for p in read_profiles(out) if p.thread == 0]
    assert main.total(CPU) > 0  # the other samples are there
    # A fault that is not the sampler's still ends the program as it would without pyrun.
    crash = tmp_path / "c"
    args = ["-e", "CPUTIME@1000", "-o", str(crash), PYTHON, str(program), str(truth), "crash"]
    assert pyrun_main(args) == 128 + signal.SIGSEGV
    assert "SIGSEGV" in capfd.readouterr().err
