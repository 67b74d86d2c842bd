"""Several GPUs and ranks, end to end through the simulated backend (issue #22).

Two ranks replay a recording of two devices (every ``nccl_2dev_*.json``: made by
``make_multi_fixture.py derive`` from a one-device recording and labelled SYNTHETIC; from the
hand-made base, and from the H200's ``record_nccl.py`` recording once it is there, see
docs/gpu.md), launched
the way torchrun launches workers (``tests/programs/minirun.py`` sets torchrun's variables; CI
has no PyTorch) with pyrun inside the launcher and outside it. Every expected number comes from
the fixture itself: which kernels are NCCL's (by name), which site issued each, their times.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.analysis import pipeline
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.cli.main import main as pyhpctk_main
from pyhpctk.core.communication import is_communication
from pyhpctk.formats import hpcrun
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.present import open_database
from pyhpctk.present.overlap import overlap_report
from pyhpctk.present.waits import collective_waits

DATA = Path(__file__).parent / "data" / "gpu"
FIXTURES = sorted(DATA.glob("nccl_2dev_*.json"))
PROGRAMS = Path(__file__).parent / "programs"
REPLAY = PROGRAMS / "rank_replay.py"
LAUNCHER = PROGRAMS / "minirun.py"
PYRUN = [sys.executable, "-m", "pyhpctk.cli.pyrun"]


def _site_lines() -> dict[int, int]:
    """Recorded site s % 8 → the line of rank_replay.py that issues it (``# SITE s``)."""
    out = {}
    for number, text in enumerate(REPLAY.read_text().splitlines(), start=1):
        if "# SITE " in text:
            out[int(text.rsplit("# SITE ", 1)[1])] = number
    return out


def _run(command: list[str], cwd: Path) -> None:
    env = dict(os.environ)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "without a known operation" not in done.stderr, done.stderr


@pytest.fixture(scope="module", params=FIXTURES, ids=lambda path: path.stem)
def fixture(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


@pytest.fixture(scope="module")
def recording(fixture: Path) -> rec.Recording:
    return rec.load(fixture)


@pytest.fixture(scope="module")
def inside(tmp_path_factory: pytest.TempPathFactory, fixture: Path) -> Path:
    """``minirun --nproc-per-node 2 pyrun -t -e gpu=... -o m python rank_replay.py``."""
    where = tmp_path_factory.mktemp("inside")
    gpu = f"gpu=simulated,recording={fixture}"
    command = [sys.executable, str(LAUNCHER), "--nproc-per-node", "2", *PYRUN, "-t", "-e", gpu]
    _run([*command, "-o", "m", sys.executable, str(REPLAY)], where)
    pipeline.run(ProfOptions.build([str(where / "m")], output=str(where / "d")))
    return where


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory, fixture: Path) -> Path:
    """``pyrun -t -e gpu=... -o m python minirun --nproc-per-node 2 python rank_replay.py``."""
    where = tmp_path_factory.mktemp("outside")
    gpu = f"gpu=simulated,recording={fixture}"
    command = [*PYRUN, "-t", "-e", gpu, "-o", "m", sys.executable, str(LAUNCHER)]
    _run([*command, "--nproc-per-node", "2", sys.executable, str(REPLAY)], where)
    pipeline.run(ProfOptions.build([str(where / "m")], output=str(where / "d")))
    return where


def _expected_streams(recording: rec.Recording) -> set[tuple[int, int, int, int]]:
    """(rank, device, context, stream) of every stream a rank's threads used; rank r replays
    device r. Activities no recorded operation started (the driver's own, correlation 0) are
    not replayed by a rank (they belong to no thread of it)."""
    rows = recording.activities
    issued = np.isin(rows["correlation"], recording.operations["correlation"])
    rows = rows[issued & (rows["correlation"] != 0)]
    return {
        (int(d), int(d), int(c), int(s))
        for d, c, s in zip(rows["device"], rows["context"], rows["stream"], strict=True)
    }


def _stream_tuples(measurement: Path) -> set[tuple[int, int, int, int]]:
    """(rank, device, context, stream) from the id tuple of every stream profile."""
    found = set()
    for path in measurement.glob("*.hpcrun"):
        if int(path.name.split("-")[2]) < 500:
            continue
        elements = hpcrun.read(path).id_tuple
        pairs = zip(elements["kind"].tolist(), elements["physical"].tolist(), strict=True)
        by_kind = {kind & 0x3FFF: physical for kind, physical in pairs}
        kinds = [int(k) & 0x3FFF for k in elements["kind"]]
        assert kinds == [1, 4, 2, 5, 6], kinds  # NODE GPUDEVICE RANK GPUCONTEXT GPUSTREAM
        found.add((by_kind[2], by_kind[4], by_kind[5], by_kind[6]))
    return found


@pytest.mark.parametrize("layout", ["inside", "outside"])
def test_every_rank_device_and_stream_has_its_profile(
    layout: str, recording: rec.Recording, request: pytest.FixtureRequest
) -> None:
    where: Path = request.getfixturevalue(layout)
    assert _stream_tuples(where / "m") == _expected_streams(recording)
    assert pyhpctk_main(["verify", str(where / "m")]) == 0
    ranks = {int(p.name.split("-")[1]) for p in (where / "m").glob("*-00[0-9]-*.hpcrun")}
    assert ranks == {0, 1}
    exp = open_database(where / "d").experiment
    gpu = {(p.rank, p.element("GPUDEVICE"), p.element("GPUSTREAM")) for p in exp.profiles
           if p.is_gpu}  # fmt: skip
    assert gpu == {(r, d, s) for r, d, _, s in _expected_streams(recording)}
    cpu_ranks = {p.rank for p in exp.profiles if not p.is_gpu}
    # pyrun outside the launcher also measures the launcher: a process of no rank
    assert cpu_ranks == ({0, 1, None} if layout == "outside" else {0, 1})


def _communication_by_site(recording: rec.Recording, device: int) -> Counter[int]:
    """Communication kernels of ``device`` per recorded site (``% 8``, the program's lines)."""
    names = recording.functions
    rows = recording.activities
    kernels = rows[(rows["kind"] == act.KERNEL) & (rows["device"] == device)]
    comm = kernels[[is_communication(names[f]) for f in kernels["function"].tolist()]]
    site_of = dict(
        zip(
            recording.operations["correlation"].tolist(),
            recording.operations["site"].tolist(),
            strict=True,
        )
    )
    return Counter(site_of[c] % 8 for c in comm["correlation"].tolist())


def test_communication_lands_under_the_line_that_issued_it_on_both_ranks(
    inside: Path, recording: rec.Recording
) -> None:
    exp = open_database(inside / "d").experiment
    metric = exp.metric("GCOMM:COUNT")
    prop = metric.prop_id("execution")
    assert prop is not None
    lines = _site_lines()
    tree = exp.tree
    observed: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    rank_of = {p.index: p.rank for p in exp.profiles}
    for node in range(tree.size):
        if tree.file_name(node) is None or not tree.file_name(node).endswith("rank_replay.py"):
            continue
        site = next((s for s, n in lines.items() if n == int(tree.line[node])), None)
        if site is None:
            continue
        profiles, values = exp.values.context_profiles(int(tree.ctx_id[node]), prop)
        for profile, value in zip(profiles.tolist(), values.tolist(), strict=True):
            observed[rank_of[profile]][site] += int(value)
    for rank in (0, 1):
        expected = _communication_by_site(recording, rank)
        assert expected and sum(expected.values()) > 0
        assert +observed[rank] == expected, rank


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_overlap_report_agrees_with_the_nccl_kernel_times_of_the_fixture(
    inside: Path, recording: rec.Recording
) -> None:
    """Communication per rank within 2 % of the NCCL kernels' recorded time, and compute,
    overlap and copies as interval arithmetic over the fixture gives them (the slow oracle)."""
    report = {share.rank: share for share in overlap_report(open_database(inside / "d").experiment)}
    assert set(report) == {0, 1}
    names = recording.functions
    for device in (0, 1):
        rows = recording.activities[recording.activities["device"] == device]
        kernels = rows[rows["kind"] == act.KERNEL]
        comm_mask = np.array([is_communication(names[f]) for f in kernels["function"].tolist()])
        spans = [(int(s), int(e)) for s, e in zip(kernels["start"], kernels["end"], strict=True)]
        comm = [span for span, is_comm in zip(spans, comm_mask, strict=True) if is_comm]
        compute = [span for span, is_comm in zip(spans, comm_mask, strict=True) if not is_comm]
        share = report[device]
        nccl_ns = sum(end - start for start, end in comm)
        assert nccl_ns > 0
        assert abs(share.communication_kernel_ns - nccl_ns) <= 0.02 * nccl_ns
        both = _intersection(_union(comm), _union(compute))
        assert share.overlap_ns == both
        assert both > 0 or "make_multi_fixture.py base" not in recording.note  # by construction
        assert share.communication_ns + share.overlap_ns == _length(_union(comm))
        assert share.compute_ns + share.overlap_ns == _length(_union(compute))
        parts = (share.compute_ns, share.communication_ns, share.overlap_ns, share.copy_ns)
        assert sum(parts) + share.idle_ns == share.window_ns


def test_waits_across_ranks_are_the_start_skews_of_the_fixture(
    inside: Path, recording: rec.Recording
) -> None:
    """Device 1 is device 0 shifted later (make_multi_fixture.py): rank 1 arrives last at every
    collective and rank 0 waits the skew, or its whole kernel where that is shorter."""
    waits = collective_waits(open_database(inside / "d").experiment)
    names = recording.functions
    starts: dict[int, list[tuple[int, int]]] = {}
    for device in (0, 1):
        rows = recording.activities[recording.activities["device"] == device]
        kernels = rows[rows["kind"] == act.KERNEL]
        comm = [
            (int(s), int(e))
            for s, e, f in zip(kernels["start"], kernels["end"], kernels["function"], strict=True)
            if is_communication(names[int(f)])
        ]
        starts[device] = sorted(comm)
    expected = sum(
        max(0, min(late[0], early[1]) - early[0])
        for early, late in zip(starts[0], starts[1], strict=True)
    )
    assert waits.instances == len(starts[0]) and not waits.unmatched
    assert expected > 0 and waits.wait_ns == pytest.approx(expected)
    assert [rank for rank, _ in waits.by_rank] == [1]
    assert sum(value for *_, value in waits.by_cause) == pytest.approx(expected)


def test_pyview_prints_the_overlap_per_rank_and_stream(
    inside: Path, recording: rec.Recording
) -> None:
    command = [sys.executable, "-m", "pyhpctk.cli.pyview", str(inside / "d"), "--overlap"]
    done = subprocess.run([*command, "--blame"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "rank 0: window" in text and "rank 1: window" in text
    rank_1 = [stream for stream in _expected_streams(recording) if stream[0] == 1]
    assert text.count("GPUDEVICE 1 / RANK 1") == len(rank_1)  # a line per stream of rank 1
    assert "rank 1 arrived last" in text


MPIEXEC = Path(sys.executable).parent / "mpiexec"  # the dev extra's mpich, beside python


@pytest.mark.mpi
def test_pyprof_mpi_writes_the_same_database_of_every_rank(inside: Path) -> None:
    if not MPIEXEC.exists():
        raise FileNotFoundError(f"{MPIEXEC}: no mpiexec (the dev extra installs mpich)")
    command = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "pyhpctk.cli.pyprof_mpi"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    output = inside / "d-mpi"
    done = subprocess.run(
        [*command, "-o", str(output), str(inside / "m")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("meta.db", "profile.db", "cct.db", "trace.db"):
        assert (output / name).read_bytes() == (inside / "d" / name).read_bytes(), name
