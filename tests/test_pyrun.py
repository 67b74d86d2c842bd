"""pyrun end to end: run the small programs in ``tests/programs`` under ``pyrun`` and read back
what it wrote with the format readers (:mod:`pyhpctk.formats`), never with pyrun's own code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.analysis.compare import read_view
from pyhpctk.analysis.context import LexicalType, Relation
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run as run_pyprof
from pyhpctk.cli.pyrun import main
from pyhpctk.formats import hpcrun, hpctrace, logical
from pyhpctk.formats.hpcrun_model import HpcrunProfile, placeholder_text
from pyhpctk.formats.inspect import verify_path
from pyhpctk.measure.launch.pythonargs import missing_script

PROGRAMS = Path(__file__).resolve().parent / "programs"
PYTHON = sys.executable
NAME = re.compile(
    r"^(?P<exe>.+)-(?P<rank>\d{6})-(?P<thread>\d{3})-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<gen>\d+)$"
)
LAUNCHER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_MCA_ess_base_jobid",
    "PMI_RANK",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "PMI_KVSNAME",
    "MV2_COMM_WORLD_RANK",
    "PALS_RANKID",
    "FLUX_TASK_RANK",
    "FLUX_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "COBALT_JOBID",
    "JOB_ID",
)


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside any batch system or MPI launcher; some then simulate one."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@dataclass
class Measured:
    """One ``.hpcrun`` file read back, with its Python frames named through the logical file."""

    path: Path
    profile: HpcrunProfile
    labels: dict[int, str]  # node id -> "^Primary", "| Main  ", "func_hi", "<module> x.py"
    parent: dict[int, int]
    values: dict[int, dict[int, float]]  # node id -> metric index -> value

    @property
    def thread(self) -> int:
        return int(self.profile.header("thread-id"))

    @property
    def pid(self) -> int:
        return int(self.profile.header("process-id"))

    def metric(self, name: str) -> int:
        return [m.name for m in self.profile.metrics].index(name)

    def total(self, metric_name: str) -> float:
        metric = self.metric(metric_name)
        return sum(v.get(metric, 0.0) for v in self.values.values())

    def path_to(self, node: int) -> list[str]:
        labels = []
        while node:
            labels.append(self.labels[node])
            node = self.parent[node]
        return labels[::-1]

    def nodes_named(self, label: str) -> list[int]:
        return [node for node, text in self.labels.items() if text == label]

    def inclusive(self, label: str, metric_name: str) -> float:
        """The metric summed over every node with ``label`` on its path (counted once)."""
        metric = self.metric(metric_name)
        return sum(
            values.get(metric, 0.0)
            for node, values in self.values.items()
            if label in self.path_to(node)
        )


def read_measurements(directory: Path) -> list[Measured]:
    """Every profile in ``directory``, each checked by the format's own verifier."""
    found = []
    for path in sorted(directory.glob("*.hpcrun")):
        profile = hpcrun.read(path)
        assert hpcrun.verify(profile) == [], path
        stanzas = {}
        natives = {m.id: os.path.basename(m.path) for m in profile.load_modules}
        for module in profile.load_modules:
            if not module.path.startswith("logical/"):
                continue  # a native library (issue #17)
            metadata = logical.read(directory / module.path)
            assert logical.verify(metadata) == []
            stanzas[module.id] = metadata.by_fid()
        labels: dict[int, str] = {}
        parent: dict[int, int] = {}
        for record in profile.cct:
            node, lm, ip = int(record["id"]), int(record["lm_id"]), int(record["lm_ip"])
            parent[node] = int(record["parent_id"])
            if lm == 0:
                labels[node] = placeholder_text(ip)
            elif lm not in stanzas:  # a native frame: (load module, offset)
                labels[node] = f"<native> {natives[lm]}"
            else:
                stanza = stanzas[lm][ip >> 32]
                labels[node] = stanza.funcname or f"<module> {os.path.basename(stanza.filename)}"
        values: dict[int, dict[int, float]] = {}
        node_ids, metrics, decoded = profile.decoded_values()
        for node, metric, value in zip(node_ids, metrics, decoded, strict=True):
            values.setdefault(int(node), {})[int(metric)] = float(value)
        found.append(Measured(path, profile, labels, parent, values))
    return found


def pyrun(*args: str) -> int:
    return main(list(args))


def chain_under(measured: Measured, fence: str) -> list[str]:
    """The function names from the root to func_lo.

    A Python frame is a node per (function, line), as hpcrun writes logical frames, so func_lo
    may be several sibling nodes (one per line sampled); they must all lie on one path of
    function names, which is the one path pyprof shows.
    """
    paths = {tuple(measured.path_to(lo)) for lo in measured.nodes_named("func_lo")}
    assert len(paths) == 1, paths
    (path,) = paths
    assert path[:2] == ("^Primary", fence), path
    return list(path)


def test_one_thread_call_path_is_script_then_hi_mid_lo(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "call_chain.py"), "0.3") == 0
    (measured,) = read_measurements(out)
    assert measured.thread == 0
    assert chain_under(measured, "| Main  ") == [
        "^Primary",
        "| Main  ",
        "<module> call_chain.py",
        "func_hi",
        "func_mid",
        "func_lo",
    ]
    assert measured.inclusive("func_lo", "CPUTIME (sec)") > 0.2
    assert verify_path(out).exit_code == 0


def test_profile_follows_hpcruns_conventions(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "call_chain.py"), "0.1") == 0
    (measured,) = read_measurements(out)
    theirs = hpcrun.read(next((reference / "meas" / "small.m").glob("*.hpcrun")))
    ours = measured.profile
    assert [name for name, _ in ours.nvpairs] == [name for name, _ in theirs.nvpairs]
    (metric,) = ours.metrics
    (their_metric,) = theirs.metrics
    assert (metric.name, metric.description, metric.flags, metric.period) == (
        their_metric.name,
        their_metric.description,
        their_metric.flags,
        their_metric.period,
    )
    assert ours.id_names == theirs.id_names
    # NODE(LOGIC_LOCAL, hostid, 0) ... THREAD(LOGIC_ONLY, t, t), as hpcrun writes a thread.
    kinds = [int(k) for k in ours.id_tuple["kind"]]
    assert kinds[0] == (1 << 14) | 1 and kinds[-1] == (3 << 14) | 3
    assert int(ours.id_tuple["physical"][0]) == int(ours.header("host-id"), 16)
    ids = [int(i) for i in ours.cct["id"]]
    assert ids[0] == 12 and all(i % 2 == 0 for i in ids)  # no trace: no retained ids
    match = NAME.match(measured.path.stem)
    assert match is not None
    assert match["exe"] == ours.header("program-name") == os.path.basename(PYTHON)
    assert int(match["rank"]) == 0 and int(match["thread"]) == 0
    assert int(match["host"], 16) == int(ours.header("host-id"), 16)
    assert int(match["pid"]) == measured.pid and match["gen"] == "0"
    assert ours.load_modules[0].path.startswith("logical/python.")


def test_each_of_three_threads_has_the_chain(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "call_chain.py"), "0.15", "threads") == 0
    measured = read_measurements(out)
    assert sorted(m.thread for m in measured) == [0, 1, 2, 3]
    assert len({m.pid for m in measured}) == 1
    for m in measured:
        if m.thread == 0:
            assert m.nodes_named("func_lo") == []
            continue
        path = chain_under(m, "| Thread")
        assert path[-3:] == ["func_hi", "func_mid", "func_lo"]
        assert m.inclusive("func_lo", "CPUTIME (sec)") > 0.1


def test_traces_reference_retained_nodes(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-t", "-o", str(out), PYTHON, str(PROGRAMS / "call_chain.py"), "0.2") == 0
    (measured,) = read_measurements(out)
    trace = hpctrace.read(measured.path.with_suffix(".hpctrace"))
    assert hpctrace.verify(trace) == []
    assert hpctrace.verify_trace(trace, measured.profile) == []
    times = [int(t) for t in trace.records["time"]]
    assert len(times) >= 10
    assert times == sorted(times)
    assert int(measured.profile.header("trace-min-time")) == times[0]
    assert int(measured.profile.header("trace-max-time")) == times[-1]
    referenced = {int(n) for n in trace.records["node_id"]}
    assert all(node % 2 == 1 and node in measured.labels for node in referenced)
    assert any(measured.labels[node] == "func_lo" for node in referenced)
    assert verify_path(out).exit_code == 0


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_multiprocessing_children_are_measured(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "children.py"), mode, "0.15") == 0
    measured = read_measurements(out)
    parent = [m for m in measured if "func_lo" not in m.labels.values()]
    children = [m for m in measured if "func_lo" in m.labels.values()]
    assert len(children) == 1
    (child,) = children
    assert child.pid not in {m.pid for m in parent}
    assert chain_under(child, "| Main  ")[-3:] == ["func_hi", "func_mid", "func_lo"]
    assert child.inclusive("func_lo", "CPUTIME (sec)") > 0.08
    assert child.thread == 0
    assert verify_path(out).exit_code == 0


def test_subprocess_children_are_measured(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "children.py"), "subprocess", "0.1") == 0
    measured = read_measurements(out)
    assert len({m.pid for m in measured}) == 2
    (child,) = [m for m in measured if m.nodes_named("func_lo")]
    assert chain_under(child, "| Main  ")[2] == "<module> call_chain.py"


def test_python_started_by_a_shell_script_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHON", PYTHON)
    out = tmp_path / "m"
    assert pyrun("-o", str(out), str(PROGRAMS / "wrapper.sh"), "0.1") == 0
    (measured,) = read_measurements(out)
    assert chain_under(measured, "| Main  ")[-1] == "func_lo"


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("exception", 1),
        ("exit", 3),
        ("sigint", 128 + signal.SIGINT),
        ("sigterm", 128 + signal.SIGTERM),
        ("os_exit", 5),
        ("own_sigterm", 7),
    ],
)
def test_profiles_survive_every_way_of_ending(tmp_path: Path, how: str, status: int) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "ending.py"), how, "0.15") == status
    (measured,) = read_measurements(out)
    assert chain_under(measured, "| Main  ")[-3:] == ["func_hi", "func_mid", "func_lo"]
    assert measured.inclusive("func_lo", "CPUTIME (sec)") > 0.1
    assert verify_path(out).exit_code == 0


def test_a_hard_kill_leaves_the_last_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "m"
    args = ["--checkpoint", "0.2", "-o", str(out), PYTHON, str(PROGRAMS / "ending.py"), "kill9"]
    assert pyrun(*args, "0.1") == 128 + signal.SIGKILL
    (measured,) = read_measurements(out)
    assert measured.inclusive("func_lo", "CPUTIME (sec)") > 0.05
    assert not list(out.glob("**/*.tmp"))


def test_program_handlers_timers_and_threads_keep_working(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "handlers.py")) == 0
    assert sorted(m.thread for m in read_measurements(out)) == [0, 1]


def test_realtime_counts_blocked_time_and_cputime_does_not(tmp_path: Path) -> None:
    program = [PYTHON, str(PROGRAMS / "realtime.py"), "0.3", "0.1"]
    assert pyrun("-e", "REALTIME", "-o", str(tmp_path / "real"), *program) == 0
    assert pyrun("-e", "CPUTIME@2000", "-o", str(tmp_path / "cpu"), *program) == 0
    (real,) = read_measurements(tmp_path / "real")
    (cpu,) = read_measurements(tmp_path / "cpu")
    assert [m.name for m in real.profile.metrics] == ["REALTIME (sec)"]
    assert real.inclusive("sleeper", "REALTIME (sec)") == pytest.approx(0.3, abs=0.06)
    assert real.inclusive("burner", "REALTIME (sec)") >= 0.08
    assert cpu.inclusive("sleeper", "CPUTIME (sec)") < 0.02
    assert cpu.inclusive("burner", "CPUTIME (sec)") == pytest.approx(0.1, abs=0.03)


def test_cpu_time_attributed_equals_the_process_cpu_time(tmp_path: Path) -> None:
    """At the default rate (CPUTIME@5000) the profile holds the process's CPU time within 10%.

    The process's CPU time includes interpreter start-up and pyrun's own sampler thread, which
    are not the program's; the bar leaves room for them.
    """
    out = tmp_path / "m"
    cpu_file = tmp_path / "process-cpu-seconds"
    # 2 s of CPU, measured by the program (a fixed number of rounds took 2.5 s on the machine
    # it was written on and 1 s on a faster one): the fixed costs outside the program
    # (start-up, the sampler thread, about 0.1 s on a loaded 2-core machine) stay well inside
    # the bar.
    program = [PYTHON, str(PROGRAMS / "split.py"), str(cpu_file), "--cpu-seconds", "2"]
    assert pyrun("-o", str(out), *program) == 0
    (measured,) = read_measurements(out)
    process_cpu = float(cpu_file.read_text())
    assert process_cpu > 1.5, "the program must run long enough for a stable answer"
    attributed = measured.total("CPUTIME (sec)")
    assert abs(attributed - process_cpu) <= 0.10 * process_cpu, (attributed, process_cpu)


@pytest.mark.timing  # run alone, after the parallel tests (Makefile: unit)
def test_a_one_to_three_split_of_cpu_time_comes_out_within_5_points(tmp_path: Path) -> None:
    out = tmp_path / "m"
    cpu_file = tmp_path / "process-cpu-seconds"
    # 1000 samples/s: a share estimated from n samples has a standard deviation of
    # sqrt(0.25 * 0.75 / n), 3 points for the ~200 samples of one second at the default rate,
    # 1.4 points for ~1000: enough for "within 5 points" to test pyrun, not luck. One second
    # of CPU as the program measures it, not a number of rounds that lasts a second only on
    # a machine of one speed.
    program = [PYTHON, str(PROGRAMS / "split.py"), str(cpu_file), "--cpu-seconds", "1"]
    assert pyrun("-e", "CPUTIME@1000", "-o", str(out), *program) == 0
    (measured,) = read_measurements(out)
    light = measured.inclusive("light", "CPUTIME (sec)")
    heavy = measured.inclusive("heavy", "CPUTIME (sec)")
    assert 100 * heavy / (light + heavy) == pytest.approx(75, abs=5), (light, heavy)


def test_short_threads_one_after_another_each_get_a_profile(tmp_path: Path) -> None:
    out = tmp_path / "m"
    assert pyrun("-o", str(out), PYTHON, str(PROGRAMS / "threads_many.py"), "6") == 0
    measured = read_measurements(out)
    assert sorted(m.thread for m in measured) == list(range(7))
    assert sum(1 for m in measured if m.nodes_named("func_lo")) >= 5


def test_threads_running_before_measurement_began_are_measured(tmp_path: Path) -> None:
    out = tmp_path / "m"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([PYTHON, str(PROGRAMS / "late_start.py"), str(out)], check=True, env=env)
    measured = read_measurements(out)
    (worker,) = [m for m in measured if m.thread != 0]
    assert chain_under(worker, "| Thread")[-3:] == ["func_hi", "func_mid", "func_lo"]


def test_unwritable_output_directory_is_reported_before_the_program_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    marker = tmp_path / "program-ran"
    status = pyrun("-o", str(blocker / "m"), "sh", "-c", f"touch {marker}")
    assert status == 2
    assert "cannot write measurements" in capsys.readouterr().err
    assert not marker.exists()


def test_a_non_python_command_runs_and_is_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pyrun("-o", str(tmp_path / "m"), "sh", "-c", "echo hello; exit 4") == 4
    captured = capsys.readouterr()
    assert "nothing was measured" in captured.err
    assert not (tmp_path / "m").exists()


def test_a_missing_command_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pyrun("-o", str(tmp_path / "m"), "no-such-command-pyrun-test") == 127
    assert "command not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arguments",
    [
        ["missing.py"],
        ["-X", "dev", "-uB", "missing.py", "arg"],
        ["-W", "error", "--", "missing.py"],
    ],
)
def test_a_mistyped_script_is_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str]
) -> None:
    """Before: Python started, said it could not open the file, and the directory it left
    refused the corrected run ("holds the measurements of another run")."""
    output = tmp_path / "m"
    assert pyrun("-o", str(output), PYTHON, *arguments) == 2
    err = capsys.readouterr().err
    assert "missing.py: no such file: Python would not start it" in err
    assert len(err.strip().splitlines()) == 1
    assert not output.exists()
    script = tmp_path / "right.py"
    script.write_text("print('ran')\n")
    assert pyrun("-o", str(output), PYTHON, str(script)) == 0


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (("python3", "-c", "pass", "missing.py"), None),  # -c: the rest is sys.argv
        (("python3", "-m", "json.tool", "missing.py"), None),
        (("python3", "-", "missing.py"), None),  # the script comes from stdin
        (("sh", "missing.py"), None),  # not Python: its business
        (("python3.12", "-Wignore", "missing.py"), "missing.py"),
        (("python", "--check-hash-based-pycs", "always", "missing.py"), "missing.py"),
    ],
)
def test_only_a_python_command_lines_script_is_looked_for(
    command: tuple[str, ...], missing: str | None
) -> None:
    problem = missing_script(command, f"/usr/bin/{command[0]}")
    assert (problem is None) == (missing is None), problem
    if missing is not None:
        assert problem is not None and problem.startswith(f"{missing}: no such file")


def test_list_events_and_bad_events(capsys: pytest.CaptureFixture[str]) -> None:
    assert pyrun("-L") == 0
    listing = capsys.readouterr().out
    assert "CPUTIME" in listing and "REALTIME" in listing
    assert pyrun("-e", "CYCLES@100", "true") == 2
    assert "unknown event" in capsys.readouterr().err


def test_default_directories_never_mix_two_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert pyrun(PYTHON, str(PROGRAMS / "call_chain.py"), "0.02") == 0
    first = tmp_path / "hpctoolkit-call_chain-measurements"
    second = tmp_path / "hpctoolkit-call_chain-measurements-2"
    assert len(read_measurements(first)) == 1
    assert len(read_measurements(second)) == 1


@pytest.mark.parametrize(
    ("env", "rank", "directory"),
    [
        (
            {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"},
            3,
            "hpctoolkit-call_chain-measurements-4242.0",
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "2", "OMPI_MCA_ess_base_jobid": "99"},
            2,
            "hpctoolkit-call_chain-measurements-99",
        ),
        (
            {"PMI_RANK": "5", "PMIX_NAMESPACE": "mpich-7"},
            5,
            "hpctoolkit-call_chain-measurements-mpich-7",
        ),
    ],
)
def test_ranks_and_directories_follow_the_launcher(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    rank: int,
    directory: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for _ in range(2):  # two ranks of one launch share the directory
        assert pyrun(PYTHON, str(PROGRAMS / "call_chain.py"), "0.02") == 0
    measured = read_measurements(tmp_path / directory)
    assert len(measured) == 2
    for m in measured:
        match = NAME.match(m.path.stem)
        assert match is not None and int(match["rank"]) == rank
        assert m.profile.header("mpi-rank") == str(rank)
        kinds = [int(k) & 0x3FFF for k in m.profile.id_tuple["kind"]]
        assert kinds == [1, 2, 3]  # NODE, RANK, THREAD
        assert int(m.profile.id_tuple["physical"][1]) == rank
    job = env.get("SLURM_JOB_ID", "")
    assert {m.profile.header("job-id") for m in measured} == {job}


def _names(path: tuple[object, ...]) -> list[str]:
    """A database context path as ``entry N`` / ``[line] FILE`` / ``[function] NAME`` /
    ``[instruction]`` (native frames: pyrun records them below the Python lines) steps."""
    steps = []
    for label in path:
        assert isinstance(label, tuple)
        if label[0] == "entry":
            steps.append(f"entry {label[1]}")
            continue
        relation, lexical_type, function, file = label[:4]
        if int(lexical_type) == int(LexicalType.FUNCTION):
            assert function is not None and int(relation) == int(Relation.CALL)
            steps.append(f"[function] {function[0]}")
        elif int(lexical_type) == int(LexicalType.INSTRUCTION):
            steps.append("[instruction]")  # a native frame without structure (issue #17)
        else:
            assert int(lexical_type) == int(LexicalType.LINE) and isinstance(file, str)
            steps.append(f"[line] {os.path.basename(file)}")
    return steps


@pytest.mark.parametrize("threads", [False, True])
def test_pyprof_shows_script_hi_mid_lo_once_per_thread(tmp_path: Path, threads: bool) -> None:
    out, db = tmp_path / "m", tmp_path / "db"
    args = [PYTHON, str(PROGRAMS / "call_chain.py"), "0.1", *(["threads"] if threads else [])]
    assert pyrun("-t", "-o", str(out), *args) == 0
    report = run_pyprof(ProfOptions.build([out], output=db))
    # native frames (libc under a sleeping thread...) without pystruct: the hint, and nothing else
    assert all(
        "have no structure file" in p or "has no structure file" in p for p in report.problems
    ), report.problems
    view = read_view(db)
    paths = view.paths()
    lo = [ctx for ctx, path in paths.items() if path and _names(path)[-1] == "[function] func_lo"]
    assert len(lo) == 1, [_names(paths[c]) for c in lo]
    chain = ["[function] func_hi", "[line] call_chain.py", "[function] func_mid"]
    chain += ["[line] call_chain.py", "[function] func_lo"]
    names = _names(paths[lo[0]])
    if threads:
        assert names[0] == "entry 2" and names[-5:] == chain
    else:
        assert names == ["entry 1", "[line] call_chain.py", *chain]
    below = {
        c
        for c, p in paths.items()
        if len(p) > len(paths[lo[0]]) and p[: len(paths[lo[0]])] == paths[lo[0]]
    }
    below.add(lo[0])
    with_lo = [
        p for p in view.profiles[1:] if float(p.value[np.isin(p.ctx, sorted(below))].sum()) > 0
    ]
    assert len(with_lo) == (3 if threads else 1)


def test_the_command_inherits_the_launchers_descriptors(tmp_path: Path) -> None:
    """MPICH's hydra hands each rank its PMI connection as an inherited descriptor (PMI_FD)."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        code = f"import os; os.write({write_end}, b'connected')"
        assert pyrun("-o", str(tmp_path / "m"), PYTHON, "-c", code) == 0
        os.close(write_end)
        write_end = -1
        assert os.read(read_end, 100) == b"connected"
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


@pytest.mark.mpi
def test_mpiexec_ranks_share_one_directory_with_their_rank_numbers(tmp_path: Path) -> None:
    """A real launch: ``mpiexec -n 2 pyrun python app.py`` (the MPICH of the dev environment)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    assert mpiexec.exists(), "the dev environment installs MPICH (pip install mpich)"
    pyrun_script = Path(sys.executable).parent / "pyrun"
    out = tmp_path / "m"
    run = subprocess.run(
        [
            str(mpiexec),
            "-n",
            "2",
            str(pyrun_script),
            "-o",
            str(out),
            PYTHON,
            str(PROGRAMS / "call_chain.py"),
            "0.02",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    measured = read_measurements(out)
    ranks = sorted(int(NAME.match(m.path.stem)["rank"]) for m in measured)  # type: ignore[index]
    assert ranks == [0, 1]
    assert {m.profile.header("mpi-rank") for m in measured} == {"0", "1"}
    assert len({m.pid for m in measured}) == 2
