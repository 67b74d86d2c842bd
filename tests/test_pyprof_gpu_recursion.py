"""Recursive GPU call graphs: PC samples placed on device call paths exactly as hpcprof places
them (issue #20, item 2).

Inputs built here: nvcc's cubins of ``tests/data/cubin/units/recursion.cu`` (direct recursion in
``fact``; ``even``/``odd`` called by the kernel ``mutual`` at both members; ``ping``/``pong``
called by the kernel ``entered_once`` at ``pong`` only) → ``pystruct --gpucfg yes`` → a
measurement written with pyhpctk's hpcrun writer, laid out as hpcrun lays out PC sampling: below
each launch's ``<gpu kernel>`` placeholder the kernel's own unwound frame and one non-unwound
frame per sampled instruction, with ``GINS`` samples placed by (function, source line) → pyprof
→ the database read back.

The expected contexts and values are worked out by hand from hpcprof's rules (the docstring of
:mod:`pyhpctk.analysis.device_calls`; struct finalizer and ``ContextReconstruction`` in
HPCToolkit's ``src/lib/profile``):

* the root of a cycle is the member Tarjan's search over the *reversed* call graph reaches first,
  starting from the functions in file order: nvcc places ``odd`` before ``even`` and ``ping``
  before ``pong`` (checked below), so ``odd`` and ``ping`` are roots;
* an edge into a root also brings the other members; an edge into another member brings that
  member only: ``mutual`` → ``odd`` (line 49) brings ``odd`` and ``even``, ``mutual`` → ``even``
  (line 48) only ``even``;
* ``entered_once`` → ``pong`` enters at a non-root, so ``ping`` keeps no caller: it becomes an
  entry of its own that was never launched, and its samples lose their values (hpcprof's factor
  0) while its contexts stay, right below the placeholder;
* a sample reached by several paths is split by the ``GINS`` samples at the call instructions.
"""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from measurement_helpers import cpu_profile, profile_name
from pyhpctk.analysis.compare import read_view
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pystruct import main as pystruct_main
from pyhpctk.formats import hpcrun, hpcstruct
from pyhpctk.formats.hpcrun_model import LoadModule, MetricDescriptor, metric_flags, placeholder_ip
from pyhpctk.formats.hpcstruct_model import Scope

CUBINS = Path(__file__).parent / "data" / "cubin"
KERNELS = ("entered_once", "mutual", "direct")

# GINS samples per kernel launch: (function, source line) -> samples; on a call line, the call
# instruction itself (see _addresses).
SAMPLES: dict[str, dict[tuple[str, int], float]] = {
    "entered_once": {
        ("entered_once", 53): 4.0,  # calls pong
        ("pong", 37): 10.0,
        ("pong", 40): 6.0,  # calls ping
        ("ping", 31): 8.0,
        ("ping", 34): 2.0,  # calls pong
    },
    "mutual": {
        ("mutual", 48): 3.0,  # calls even
        ("mutual", 49): 1.0,  # calls odd
        ("odd", 22): 12.0,
        ("odd", 25): 4.0,  # calls even
        ("even", 16): 20.0,
        ("even", 19): 8.0,  # calls odd
    },
    "direct": {
        ("direct", 44): 5.0,  # calls fact
        ("fact", 7): 30.0,
        ("fact", 10): 9.0,  # calls fact
    },
}
CALL_LINES = {("entered_once", 53), ("pong", 40), ("ping", 34), ("mutual", 48), ("mutual", 49)}
CALL_LINES |= {("odd", 25), ("even", 19), ("direct", 44), ("fact", 10)}

# Inclusive GINS of every context below each launch's placeholder, by hand (module docstring).
EXPECTED: dict[str, dict[tuple[str, ...], float]] = {
    "entered_once": {
        (): 20.0,  # ping's 10 samples reach no launched kernel: dropped, as hpcprof drops them
        ("entered_once",): 20.0,
        ("entered_once", "line 52"): 0.0,  # the kernel's own frame (its entry), no GINS
        ("entered_once", "line 53"): 20.0,
        ("entered_once", "line 53", "pong"): 16.0,
        ("entered_once", "line 53", "pong", "line 37"): 10.0,
        ("entered_once", "line 53", "pong", "line 40"): 6.0,
        ("ping",): 0.0,  # the never-launched entry ping, with its sampled lines
        ("ping", "line 31"): 0.0,
        ("ping", "line 34"): 0.0,
    },
    "mutual": {
        (): 48.0,
        ("mutual",): 48.0,
        ("mutual", "line 47"): 0.0,
        # even's 28 samples are split 3:1 between its two call paths (3 and 1 GINS at the calls)
        ("mutual", "line 48"): 3.0 + 21.0,
        ("mutual", "line 48", "even"): 21.0,
        ("mutual", "line 48", "even", "line 16"): 15.0,
        ("mutual", "line 48", "even", "line 19"): 6.0,
        # odd only below line 49 (the call into the cycle's root), even there too
        ("mutual", "line 49"): 1.0 + 16.0 + 7.0,
        ("mutual", "line 49", "odd"): 16.0,
        ("mutual", "line 49", "odd", "line 22"): 12.0,
        ("mutual", "line 49", "odd", "line 25"): 4.0,
        ("mutual", "line 49", "even"): 7.0,
        ("mutual", "line 49", "even", "line 16"): 5.0,
        ("mutual", "line 49", "even", "line 19"): 2.0,
    },
    "direct": {
        (): 44.0,
        ("direct",): 44.0,
        ("direct", "line 43"): 0.0,
        ("direct", "line 44"): 44.0,
        ("direct", "line 44", "fact"): 39.0,  # fact once: its call to itself adds no level
        ("direct", "line 44", "fact", "line 7"): 30.0,
        ("direct", "line 44", "fact", "line 10"): 9.0,
    },
}


def _short(name: str) -> str:
    """``mutual(int*, int)`` -> ``mutual``; ``$_Z6mutualPii$_Z4eveni`` -> ``even``."""
    if name.startswith("$"):
        match = re.fullmatch(r"_Z(\d+)(\w+)", name.rsplit("$", 1)[-1])
        assert match is not None, name
        return match.group(2)[: int(match.group(1))]
    return name.split("(", 1)[0]


def _procedures(structure: Path) -> dict[str, Scope]:
    """The ``P`` scopes of a structure file by short name, in file order."""
    (module,) = hpcstruct.read(structure).modules
    return {_short(s.name): s for s in module.walk() if s.tag == "P"}


def _addresses(procedures: dict[str, Scope]) -> dict[tuple[str, int], int]:
    """(function, line) -> an instruction of that line: the call for a call line."""
    found: dict[tuple[str, int], int] = {}
    for name, procedure in procedures.items():
        for scope in procedure.walk():
            if scope.tag in ("S", "C") and scope.ranges:
                key = (name, scope.line)
                if scope.tag == "C" or key not in found:
                    found[key] = scope.ranges[0][0]
    return found


def _check_layout(procedures: dict[str, Scope]) -> None:
    """The facts of nvcc's output the expected values rest on (a rebuild could change them)."""
    order = list(procedures)
    assert order.index("ping") < order.index("pong") and order.index("odd") < order.index("even")
    entry = {name: p.ranges[0][0] for name, p in procedures.items()}
    calls = {
        (name, scope.line, scope.call_target)
        for name, p in procedures.items()
        for scope in p.walk()
        if scope.tag == "C"
    }
    assert calls == {
        ("entered_once", 53, entry["pong"]),
        ("pong", 40, entry["ping"]),
        ("ping", 34, entry["pong"]),
        ("mutual", 48, entry["even"]),
        ("mutual", 49, entry["odd"]),
        ("odd", 25, entry["even"]),
        ("even", 19, entry["odd"]),
        ("direct", 44, entry["fact"]),
        ("fact", 10, entry["fact"]),
    }


def _measure(tmp_path: Path, arch: str) -> Path:
    """The measurement: cubin captured, its structure (pystruct), three launches' samples."""
    measurement = tmp_path / "app.m"
    (measurement / "gpubins").mkdir(parents=True)
    gpubin = measurement / "gpubins" / f"recursion_{arch}.gpubin"
    shutil.copyfile(CUBINS / f"recursion_lineinfo_{arch}.cubin", gpubin)
    structure = measurement / "structs" / f"{gpubin.name}-gpucfg-yes.hpcstruct"
    structure.parent.mkdir()
    assert pystruct_main(["--gpucfg", "yes", "-q", str(gpubin), "-o", str(structure)]) == 0
    procedures = _procedures(structure)
    _check_layout(procedures)
    address = _addresses(procedures)
    assert set(CALL_LINES) <= set(address) and all(
        k in address for s in SAMPLES.values() for k in s
    )
    app, cubin = 1, 2
    nodes = [
        (2, 0, 0, placeholder_ip("^Primary"), 1),
        (4, 2, 0, placeholder_ip("| Main  "), 1),
        (6, 4, app, 0x40, 1),
    ]
    values: dict[int, dict[int, float]] = {}
    ident = 8
    for number, kernel in enumerate(KERNELS):
        launch, placeholder, frame = ident, ident + 2, ident + 4
        nodes += [
            (launch, 6, app, 0x100 + 0x10 * number, 1),  # the host line launching the kernel
            (placeholder, launch, 0, placeholder_ip("GPUKernl"), 1),
            (frame, placeholder, cubin, procedures[kernel].ranges[0][0], 1),  # the kernel
        ]
        values[frame] = {1: 1.0}  # GKER:COUNT, on the kernel's frame as hpcrun puts it
        ident += 6
        for where, samples in SAMPLES[kernel].items():
            nodes.append((ident, placeholder, cubin, address[where], 0))
            values[ident] = {0: samples}
            ident += 2
    metrics = [
        MetricDescriptor("GINS", "GPU instructions", metric_flags(value_format=2)),
        MetricDescriptor("GKER:COUNT", "launches", metric_flags(value_format=2, move_to_proc=True)),
    ]
    modules = [LoadModule(app, "/bin/app"), LoadModule(cubin, str(gpubin))]
    hpcrun.write(cpu_profile(modules, nodes, values, metrics), measurement / profile_name())
    return measurement


def _gpu_trees(database: Path) -> dict[str, dict[tuple[str, ...], float]]:
    """Per launch (by its kernel): every context below its placeholder -> inclusive GINS."""
    view = read_view(database)
    paths = view.paths()
    gins = next(i for i, n in view.stat_names.items() if n[:2] == ("GINS", "execution"))
    summary = next(p for p in view.profiles if p.id_tuple is None)
    inclusive: dict[int, float] = defaultdict(float)
    for ctx, metric, value in zip(summary.ctx, summary.metric, summary.value, strict=True):
        if metric == gins:
            inclusive[int(ctx)] = float(value)

    def name(label: tuple[object, ...]) -> str:
        if label[2]:
            return _short(str(label[2][0]))  # type: ignore[index]
        return f"line {label[4]}" if label[1] == 2 else f"instruction {label[6]:#x}"

    trees: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
    by_host = {0x100 + 0x10 * number: kernel for number, kernel in enumerate(KERNELS)}
    for ident, path in paths.items():
        names = [name(label) if label[0] != "entry" else "entry" for label in path]
        if "<gpu kernel>" not in names:
            continue
        below = names.index("<gpu kernel>")
        kernel = by_host[int(path[below - 1][6])]  # type: ignore[call-overload]
        trees[kernel][tuple(names[below + 1 :])] = inclusive.get(ident, 0.0)
    return trees


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_recursive_device_calls_are_placed_as_hpcprof_places_them(
    tmp_path: Path, arch: str
) -> None:
    measurement = _measure(tmp_path, arch)
    database = tmp_path / "db"
    report = run(ProfOptions.build([measurement], output=database))
    trees = _gpu_trees(database)
    for kernel in KERNELS:
        assert trees[kernel] == pytest.approx(EXPECTED[kernel], rel=1e-12), kernel
    (dropped,) = [p for p in report.problems if "reach no launched kernel" in p]
    assert "2 instruction(s) (10 GINS) in $_Z12entered_oncePii$_Z4pingi" in dropped


@pytest.mark.parametrize("memory_limit", [None, 1 << 16], ids=["whole", "capped"])
def test_pyprof_mpi_places_recursive_samples_as_pyprof(
    tmp_path: Path, memory_limit: int | None
) -> None:
    """The distributed driver (one rank; capped: profiles read twice, GINS kept for weights)."""
    from pyhpctk.analysis.comm import SerialComm
    from pyhpctk.analysis.compare import compare
    from pyhpctk.analysis.distributed import run_distributed

    measurement = _measure(tmp_path, "sm_75")
    run(ProfOptions.build([measurement], output=tmp_path / "serial"))
    report = run_distributed(
        ProfOptions.build([measurement], output=tmp_path / "mpi"), SerialComm(), memory_limit
    )
    assert any("reach no launched kernel" in p for p in report.problems)
    assert compare(read_view(tmp_path / "serial"), read_view(tmp_path / "mpi")) == []
    assert _gpu_trees(tmp_path / "mpi")["mutual"] == pytest.approx(EXPECTED["mutual"], rel=1e-12)
