"""PC sampling inside GPU kernels (issue #7): hpcrun's GINS/GSAMP metrics below each kernel.

CI: the metric table against ``meas/loops-cuda-nvidiapc-t.m``, the attribution rules on hand-made
rows, and ``pyrun -e gpu=simulated,pc=RECORDING`` end to end (a recording made from the
reference measurement's own gpubin). Tests marked ``gpu`` run on the H200 (``device_pc.sh``):
CUPTI's PC sampling through ctypes, and ``pyrun -e gpu=nvidia,pc`` on the ground-truth kernel.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.errors import FormatError, UsageError
from pyhpctk.formats import hpcrun
from pyhpctk.formats.hpcrun_model import placeholder_ip
from pyhpctk.measure.gpu import parse_gpu_event, pc_period
from pyhpctk.measure.gpu.cupti import pcsampling as pcs

REPO = Path(__file__).resolve().parent.parent
RECORDER = REPO / "tests" / "data" / "gpu" / "record_pc.py"
DEMO = REPO / "examples" / "gpu_demo.py"
PC_MEAS = "meas/loops-cuda-nvidiapc-t.m"
PERIOD = 4096
SELECTED = "smsp__pcsamp_warps_issue_stalled_selected"
LONG_SB = "smsp__pcsamp_warps_issue_stalled_long_scoreboard"
WAIT = "smsp__pcsamp_warps_issue_stalled_wait"
WAIT_NI = WAIT + "_not_issued"


def _rows(spec: list[tuple[int, int, int, int]]) -> np.ndarray:
    """Rows from (pc offset, reason, samples, correlation)."""
    rows = np.zeros(len(spec), pcs.SAMPLE_DTYPE)
    for i, (offset, reason, samples, correlation) in enumerate(spec):
        rows[i] = (1, offset, 0, reason, samples, correlation, 0)
    return rows


def test_the_30_instruction_metrics_are_written_as_hpcrun_writes_them(
    reference: Path, tmp_path: Path
) -> None:
    path = next((reference / PC_MEAS).glob("*-000-*.hpcrun"))
    theirs = hpcrun.read(path).metrics[:30]
    profile = _simulated_profile(reference, tmp_path)
    first = [m.name for m in profile.metrics].index("GINS:BLK_EXEC_CNT")
    ours = profile.metrics[first : first + 30]
    for mine, hpcruns in zip(ours, theirs, strict=True):
        assert (mine.name, mine.description, mine.flags, mine.period) == (
            hpcruns.name,
            hpcruns.description,
            hpcruns.flags,
            hpcruns.period,
        )
        # formulas count metrics from the kind's first one: shift the reference's by ``first``
        shifted = re.sub(r"#(\d+)", lambda m: f"#{int(m.group(1)) + first}", hpcruns.formula)
        assert (mine.formula, mine.format) == (shifted, hpcruns.format)
    assert profile.metrics[first + 30].name == "GPUOP (sec)"  # then the activity metrics


def test_stall_reasons_fall_into_hpcruns_categories() -> None:
    assert pcs.stall_category(SELECTED) == ""
    assert pcs.stall_category(LONG_SB) == "GMEM"
    assert pcs.stall_category(WAIT_NI) == "IDEP"
    assert pcs.stall_category("smsp__pcsamp_warps_issue_stalled_barrier") == "SYNC"
    assert pcs.stall_category("smsp__pcsamp_warps_issue_stalled_no_instructions") == "IFET"
    assert pcs.stall_category("smsp__pcsamp_warps_issue_stalled_something_new") == "OTHR"


def test_samples_become_gins_and_stalls_times_the_period() -> None:
    reasons = [SELECTED, LONG_SB, WAIT, WAIT_NI]
    rows = _rows(
        [(0x0, 0, 5, 9), (0x10, 1, 3, 9), (0x10, 0, 2, 9), (0x20, 2, 7, 9), (0x20, 3, 4, 9)]
    )
    got = pcs.attribute_samples(rows, reasons, ["k"], {"k": 0x300}, PERIOD, 17, 2, 40)
    assert got.values == {
        (0x300, "GINS"): 5 * PERIOD,
        (0x310, "GINS"): 5 * PERIOD,
        (0x310, "GINS:STL_ANY"): 3 * PERIOD,
        (0x310, "GINS:STL_GMEM"): 3 * PERIOD,
        (0x310, "GINS:LAT"): 3 * PERIOD,
        (0x310, "GINS:LAT_COV"): 3 * PERIOD,  # no not-issued sample: all of it covered
        # 7 samples of warps waiting at 0x20, 4 of them on cycles nothing issued: GINS counts
        # the 7 once (the _not_issued variant is a subset, not more samples)
        (0x320, "GINS"): 7 * PERIOD,
        (0x320, "GINS:STL_ANY"): 7 * PERIOD,
        (0x320, "GINS:STL_IDEP"): 7 * PERIOD,
        (0x320, "GINS:LAT"): 7 * PERIOD,
        (0x320, "GINS:LAT_UCV"): 4 * PERIOD,
        (0x320, "GINS:LAT_COV"): 3 * PERIOD,
    }
    assert pcs.sample_count(rows, reasons) == 5 + 3 + 2 + 7
    assert got.kernel_values == {
        "GSAMP:TOT": 17,
        "GSAMP:DRP": 2,
        "GSAMP:EXP": 40,
        "GSAMP:PER (cyc)": PERIOD,
    }


def test_rows_of_unknown_functions_are_left_out() -> None:
    rows = _rows([(0x10, 0, 5, 1)])
    rows["function"] = 1
    got = pcs.attribute_samples(rows, [SELECTED], ["k", "other"], {"k": 0x300}, PERIOD)
    assert got.values == {}


def test_expected_samples_are_one_per_sm_per_period() -> None:
    # 1 ms at 2 GHz on 100 SMs with a 1000-cycle period: 2e6 cycles / 1000 * 100 SMs.
    assert pcs.expected_samples(1_000_000, 2_000_000, 100, 1000) == 200_000


def test_the_period_option() -> None:
    assert pc_period(parse_gpu_event("gpu=nvidia")) == 0
    assert pc_period(parse_gpu_event("gpu=nvidia,pc")) == 12
    assert pc_period(parse_gpu_event("gpu=nvidia,pc,period=9")) == 9
    assert pc_period(parse_gpu_event("gpu=nvidia,pc,period=1024")) == 10
    for bad in ("period=3", "period=1000", "period=x"):
        with pytest.raises(UsageError):
            pc_period(parse_gpu_event(f"gpu=nvidia,pc,{bad}"))


def test_a_broken_recording_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"kernel": "k", "rows": {"samples": [1]}}')
    with pytest.raises(FormatError, match="PC recording"):
        pcs.load_recording(str(path))
    path.write_bytes(b"\xff\x00")
    with pytest.raises(FormatError, match="PC recording"):
        pcs.load_recording(str(path))


def _reference_recording(reference: Path, path: Path) -> dict[str, object]:
    """A PC recording of the reference kernel ``_Z8kernmainv`` (2 launches, 3 reasons)."""
    gpubin = next((reference / PC_MEAS / "gpubins").glob("*.gpubin")).read_bytes()
    spec = [(0x0, 2, 5, 11), (0x10, 0, 3, 11), (0x10, 1, 4, 11), (0x20, 0, 2, 11)]
    spec += [(0x10, 1, 6, 12), (0x20, 2, 1, 12)]
    rows = _rows(spec)
    recording = {
        "kernel": "_Z8kernmainv",
        "launches": 2,
        "period_exponent": 12,
        "device": {"sm_count": 132, "clock_khz": 1_980_000},
        "kernels_ns": 2_000_000,
        "reasons": [SELECTED, LONG_SB, WAIT],
        "functions": ["_Z8kernmainv"],
        "dropped_samples": 4,
        "rows": {name: rows[name].tolist() for name in pcs.SAMPLE_DTYPE.names or ()},
        "cubins": [{"base64": base64.b64encode(gpubin).decode()}],
    }
    path.write_text(json.dumps(recording))
    return recording


def _gpu_nodes(
    profile: hpcrun.HpcrunProfile,
) -> tuple[dict[int, tuple[int, int, int]], dict[tuple[int, str], float]]:
    """(node id → (parent, ip, flags)) of every node below a GPUKernl placeholder; values."""
    cct = profile.cct
    kernl = placeholder_ip("GPUKernl")
    placeholders = set(cct["id"][cct["lm_ip"] == kernl].tolist())
    below = {
        int(r["id"]): (int(r["parent_id"]), int(r["lm_ip"]), int(r["flags"]))
        for r in cct
        if int(r["parent_id"]) in placeholders
    }
    names = [m.name for m in profile.metrics]
    nodes, metrics, decoded = profile.decoded_values()
    values = {
        (int(n), names[int(m)]): float(v)
        for n, m, v in zip(nodes.tolist(), metrics.tolist(), decoded.tolist(), strict=True)
    }
    return below, values


def _simulated_profile(reference: Path, tmp_path: Path) -> hpcrun.HpcrunProfile:
    """``pyrun -e gpu=simulated,pc=RECORDING`` of one demo step; the main thread's profile."""
    from pyhpctk.cli.pyrun import main as pyrun_main

    recording = tmp_path / "pc.json"
    _reference_recording(reference, recording)
    out = tmp_path / "m"
    status = pyrun_main(
        [
            "-e",
            f"gpu=simulated,pc={recording}",
            "-o",
            str(out),
            sys.executable,
            str(DEMO),
            "1",
            "--simulated",
        ]
    )
    assert status == 0
    return hpcrun.read(next(out.glob("*-000-*.hpcrun")))


def test_pyrun_simulated_pc_puts_instructions_under_each_kernel(
    reference: Path, tmp_path: Path
) -> None:
    profile = _simulated_profile(reference, tmp_path)
    below, values = _gpu_nodes(profile)
    # One step of the demo launches 4 kernels from one line: launches replay 11, 12, 11, 12.
    kernel = [n for n, (_, ip, flags) in below.items() if flags & 1]
    assert len(kernel) == 1
    entry = below[kernel[0]][1]
    by_offset = {ip - entry: n for n, (_, ip, flags) in below.items() if not flags & 1}
    assert sorted(by_offset) == [0x10, 0x20]
    assert all(below[n][2] == 0 for n in by_offset.values())  # "unwound" = 0
    k, n10, n20 = kernel[0], by_offset[0x10], by_offset[0x20]
    assert values[(k, "GINS")] == 2 * 5 * PERIOD  # offset 0 shares the kernel's node
    assert values[(k, "GINS:STL_IDEP")] == 2 * 5 * PERIOD
    assert values[(n10, "GINS")] == 2 * (3 + 4 + 6) * PERIOD
    assert values[(n10, "GINS:STL_ANY")] == values[(n10, "GINS:STL_GMEM")] == 2 * 10 * PERIOD
    assert values[(n20, "GINS")] == 2 * (2 + 1) * PERIOD
    assert values[(n20, "GINS:STL_IDEP")] == 2 * 1 * PERIOD
    assert (n20, "GINS:STL_GMEM") not in values
    assert values[(k, "GSAMP:TOT")] == 2 * (14 + 7)
    assert values[(k, "GSAMP:DRP")] == 4 * 2
    assert values[(k, "GSAMP:PER (cyc)")] == PERIOD
    per_launch = pcs.expected_samples(1_000_000, 1_980_000, 132, PERIOD)
    assert values[(k, "GSAMP:EXP")] == 4 * per_launch
    assert values[(k, "GKER:COUNT")] == 4


# -- on the H200 ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_cupti_pc_sampling_records_the_ground_truth_kernel(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    subprocess.run(
        [
            sys.executable,
            str(RECORDER),
            str(out),
            "--period",
            "10",
            "--launches",
            "2",
            "--iters",
            "4000",
        ],
        check=True,
    )
    data = json.loads(out.read_text())
    recording = pcs.load_recording(str(out))
    assert len(recording.reasons) >= 20 and SELECTED in recording.reasons
    assert recording.kernel in recording.functions
    assert len(recording.rows) and int(recording.rows["samples"].sum()) > 1000
    crcs = {c["crc"] for c in data["cubins"]}
    assert set(recording.rows["cubin_crc"].tolist()) <= crcs
    launches = set(recording.rows["correlation"].tolist())
    assert len(launches) == 2 and 0 not in launches  # serialized: one id per launch


@pytest.mark.gpu
def test_pyrun_nvidia_pc_samples_instructions_under_the_kernel(tmp_path: Path) -> None:
    out = tmp_path / "m"
    subprocess.run(
        [
            *(sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", "gpu=nvidia,pc,period=10"),
            *("-o", str(out), sys.executable, str(RECORDER), "x", "--no-sampling"),
            *("--launches", "3", "--iters", "4000"),
        ],
        check=True,
    )
    profile = hpcrun.read(next(out.glob("*-000-*.hpcrun")))
    below, values = _gpu_nodes(profile)
    kernels = [n for n, (_, _, flags) in below.items() if flags & 1]
    instructions = [n for n, (_, _, flags) in below.items() if not flags & 1]
    assert kernels and len(instructions) > 10
    gins = sum(values.get((n, "GINS"), 0.0) for n in below)
    measured = sum(values.get((n, "GSAMP:TOT"), 0.0) for n in kernels)
    # GINS counts the samples of reasons (not CUPTI's counters) in functions of the gpubin
    assert measured > 0 and 0.9 * measured * 1024 <= gins <= measured * 1024
    assert all(values.get((n, "GSAMP:PER (cyc)")) == 1024 for n in kernels)
    assert len(list((out / "gpubins").glob("*.gpubin"))) >= 1


H200 = REPO / "tests" / "data" / "gpu" / "pc_gt_h200.json"


def test_every_h200_stall_reason_has_a_category() -> None:
    recording = pcs.load_recording(str(H200))  # the 40 reasons CUPTI reported on the H200
    categories = {r: pcs.stall_category(r) for r in recording.reasons}
    assert len(categories) == 40
    counters = {r for r, c in categories.items() if c == "?"}
    assert counters == {"smsp__pcsamp_sample_count", "smsp__pcsamp_samples_data_dropped"}
    issued = {r for r, c in categories.items() if c == ""}
    assert issued == {SELECTED, SELECTED + "_not_issued"}
    assert set(categories.values()) - {"?", ""} <= set(pcs.STALL_SUFFIXES)


def _measure_h200_samples(tmp_path: Path, first: int | None = None) -> tuple[Path, int]:
    """pyrun (simulated GPU, PC samples) on the demo with the H200's ground-truth cubin.

    Each instruction of ``.text.gt_kernel`` (``first``: its first so many) gets one synthetic
    "selected" sample per launch (that session's CUPTI returned no samples, docs/gpu.md).
    Returns the measurement directory and the number of sampled instructions.
    """
    from pyhpctk.cli.pyrun import main as pyrun_main
    from pyhpctk.measure.gpu.cubin import ELF64_HEADER, ELF64_SECTION, kernel_entries

    data = json.loads(H200.read_text())
    cubin = base64.b64decode(data["cubins"][0]["base64"])
    entry = kernel_entries(cubin)["gt_kernel"]
    header = np.frombuffer(cubin, ELF64_HEADER, count=1)[0]
    sections = np.frombuffer(
        cubin, ELF64_SECTION, count=int(header["e_shnum"]), offset=int(header["e_shoff"])
    )
    size = int(sections["sh_size"][sections["sh_offset"] == entry][0])
    offsets = list(range(0, size, 16))[:first]  # one sample on every instruction
    selected = data["reasons"].index(SELECTED)
    data["functions"] = ["gt_kernel"]
    data["rows"] = {
        "cubin_crc": [data["cubins"][0]["crc"]] * len(offsets),
        "pc_offset": offsets,
        "function": [0] * len(offsets),
        "reason": [selected] * len(offsets),
        "samples": [1] * len(offsets),
        "correlation": [1] * len(offsets),
        "range": [0] * len(offsets),
    }
    tmp_path.mkdir(exist_ok=True)
    recording = tmp_path / "pc.json"
    recording.write_text(json.dumps(data))
    out = tmp_path / "m"
    demo = [sys.executable, str(DEMO), "1", "--simulated"]
    assert pyrun_main(["-e", f"gpu=simulated,pc={recording}", "-o", str(out), *demo]) == 0
    return out, len(offsets)


def test_h200_cubin_samples_rebuild_the_device_call_chain(tmp_path: Path) -> None:
    """pyrun (simulated, PC samples) → pystruct --gpucfg yes → pyprof on the H200's cubin.

    The cubin and device data were recorded on the H200 (``record_pc.py``); each instruction of
    ``.text.gt_kernel`` gets one synthetic "selected" sample per launch (so every count below is
    known exactly): the device CCT must hang the chain ``gt_kernel → top → mid → leaf`` below
    the kernel, with each instruction counted once.
    """
    from test_gpu_inst import gins_view

    out, n_offsets = _measure_h200_samples(tmp_path)
    view, paths, inclusive = gins_view(out)
    procedures = {
        ident: tuple(label[2][0] for label in paths[ident] if label[0] == 1 and label[2])
        for ident in view.contexts
    }
    chain = ("<gpu kernel>", "gt_kernel", "$gt_kernel$top", "$gt_kernel$mid", "$gt_kernel$leaf")
    own = {i for i in view.contexts if paths[i][-1][0] == 1}  # contexts that are procedures
    leaf = [i for i, names in procedures.items() if names[-5:] == chain and i in own]
    assert len(leaf) == 1
    kernel = [i for i, names in procedures.items() if names[-2:] == chain[:2] and i in own]
    launches = 4  # one demo step: 4 launches, each answered by the recorded launch
    total = sum(inclusive.get(i, 0.0) for i in kernel)
    assert total > 0 and total <= n_offsets * launches * PERIOD
    # leaf's instructions (every statement of its P scope, loops included) are all below the chain
    from pyhpctk.formats import hpcstruct

    structure = hpcstruct.read(next((out / "structs").glob("*gpucfg-yes.hpcstruct")))
    leaf_scope = next(
        s for s in structure.modules[0].walk() if s.tag == "P" and s.name == "$gt_kernel$leaf"
    )
    instructions = sum(
        len(range(lo, hi, 16))
        for s in leaf_scope.walk()
        if s.tag in ("S", "C")
        for lo, hi in s.ranges
    )
    assert inclusive[leaf[0]] == instructions * launches * PERIOD


def test_without_structure_files_the_captured_cubins_line_map_names_device_code(
    tmp_path: Path,
) -> None:
    """pyprof on a GPU measurement nobody ran pystruct on: the gpubin the program loaded is in
    the measurement directory, so its DWARF line map gives functions and lines (issue #5, item 6)
    instead of bare instruction offsets."""
    from pyhpctk.analysis.compare import view_of_aggregate
    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import aggregate

    out, _ = _measure_h200_samples(tmp_path)
    assert not (out / "structs").exists()
    database = aggregate(ProfOptions.build([str(out)]))
    assert any("DWARF line map" in problem for problem in database.problems)
    view = view_of_aggregate(database)
    functions = {
        label[2][0] for _, label in view.contexts.values() if label[0] != "entry" and label[2]
    }
    assert {"gt_kernel", "$gt_kernel$leaf", "$gt_kernel$shared_fn"} <= functions


def test_pyprof_reads_the_lines_of_a_captured_cubins_named_functions_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framework's cubin holds thousands of kernels, a run launches a few: pyprof read every
    kernel's lines (PyTorch's 27 cubins of one measurement, 100 s). Only the functions that hold
    an offset the profiles name are analyzed, each as the whole analysis gives it, the others
    listed by their symbols."""
    from pyhpctk.analysis import structures
    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import aggregate
    from pyhpctk.structure import cubin as cubin_structure

    data = json.loads(H200.read_text())
    image = base64.b64decode(data["cubins"][0]["base64"])
    path = tmp_path / "gt.gpubin"
    path.write_bytes(image)
    full = structures.line_map_structure(path, "gpubins/gt.gpubin")
    assert full is not None
    kernel = full.procedure_at(min(full.procedures))
    assert kernel is not None and kernel[-1].attrs["n"] == "gt_kernel"
    entry = kernel[-1].ranges[0][0]
    sampled = [entry + 16 * k for k in range(8)]
    analyzed: list[str] = []
    plain = cubin_structure.plain_scope

    def counted(proc, info):  # type: ignore[no-untyped-def]
        analyzed.append(proc.link_name)
        return plain(proc, info)

    monkeypatch.setattr(cubin_structure, "plain_scope", counted)
    restricted = structures.line_map_structure(path, "gpubins/gt.gpubin", sampled)
    assert restricted is not None and analyzed == ["gt_kernel"]
    for address in sampled:  # each named address classified as the whole analysis does
        got, want = restricted.lookup(address), full.lookup(address)
        assert got is not None and want is not None
        assert [(s.tag, s.attrs) for s in got] == [(s.tag, s.attrs) for s in want]
    assert set(restricted.procedures) == set(full.procedures)  # the others by their symbols
    # pyprof passes the offsets its profiles name: a measurement sampled in gt_kernel alone
    out, _ = _measure_h200_samples(tmp_path / "run", first=len(sampled))
    analyzed.clear()
    aggregate(ProfOptions.build([str(out)]))
    assert analyzed == ["gt_kernel"], analyzed


def test_rank_0s_early_classifiers_serve_only_trees_whose_gpu_offsets_they_hold() -> None:
    """pyprof-mpi classifies rank 0's frames while the other ranks read, then reuses those
    classifiers for the merged tree: a captured cubin's lines were read for rank 0's offsets
    only, so another rank's offset in that cubin (a PC sample elsewhere) needs new ones."""
    from pyhpctk.analysis.expand_plan import ClassifierInputs

    cubin = "gpubins/k.gpubin"
    early = ClassifierInputs(frozenset({cubin}), (), (), ((cubin, frozenset({16, 32})),))
    assert early.covers(ClassifierInputs(frozenset({cubin}), (), (), ((cubin, frozenset({16})),)))
    assert not early.covers(
        ClassifierInputs(frozenset({cubin}), (), (), ((cubin, frozenset({16, 48})),))
    )
    assert not early.covers(ClassifierInputs(frozenset({cubin, "lib.so"}), (), (), ()))


@pytest.mark.parametrize("gpucfg", ["no", "yes"])
def test_pystruct_analyzes_a_cubin_in_its_sampled_functions_without_gpucfg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpucfg: str
) -> None:
    """``--functions sampled`` (``auto`` for a cubin of more than 64 KiB of code) analyzes a cubin
    in the functions that hold a sampled offset only, with symbols for the rest, as a large host
    binary; not with ``--gpucfg yes``, whose call graph needs every caller's call sites."""
    from pyhpctk.cli.pystruct import main as pystruct_main
    from pyhpctk.formats import hpcstruct

    out, _ = _measure_h200_samples(tmp_path, first=8)  # samples in gt_kernel alone
    capsys.readouterr()
    arguments = ["--functions", "sampled", "--gpucfg", gpucfg, "--no-cache", str(out)]
    assert pystruct_main(arguments) == 0
    written = capsys.readouterr().err
    (path,) = (out / "structs").glob(f"*.gpubin*gpucfg-{gpucfg}.hpcstruct")
    procedures = [s for s in hpcstruct.read(path).modules[0].walk() if s.tag == "P"]
    with_lines = {
        p.name for p in procedures if any(s.tag == "S" and s.attrs["l"] != "0" for s in p.walk())
    }
    assert len(procedures) == 8
    if gpucfg == "no":
        assert with_lines == {"gt_kernel"}, with_lines
        assert "1 of 8 procedures analyzed" in written, written
    else:
        assert len(with_lines) == 8, with_lines


# -- recordings of the ground-truth kernel with recursion (record_pc.py, device_pc.sh) --------

DENSE = REPO / "tests" / "data" / "gpu" / "pc_gt_dense_h200.json"


def _sampled_recordings() -> list[Path]:
    """Recordings of the current ground-truth kernel that hold samples (skipped until then)."""
    found = []
    for path in (H200, DENSE):
        if path.exists():
            data = json.loads(path.read_text())
            if data["rows"]["samples"] and "rec->rec" in data.get("calls_per_thread", {}):
                found.append(path)
    return found


def check_accounting(recording: pcs.PcRecording) -> None:
    """cupti_pcsampling.h: totalSamples = user samples (each once) + non-user + dropped."""
    acc = recording.accounting()
    assert acc["total"] > 0
    assert acc["base"] + acc["non_user"] + acc["dropped"] == acc["total"], acc
    assert acc["not_issued"] <= acc["base"], acc
    # per instruction and reason, the not-issued samples are a subset of the reason's
    rows, reasons = recording.rows, recording.reasons
    by_key = {
        (int(r["pc_offset"]), int(r["correlation"]), reasons[int(r["reason"])]): int(r["samples"])
        for r in rows
    }
    for (pc, correlation, reason), samples in by_key.items():
        if pcs.is_not_issued(reason):
            base = by_key.get((pc, correlation, reason[: -len("_not_issued")]), 0)
            assert samples <= base, (hex(pc), reason)


@pytest.mark.parametrize("path", _sampled_recordings() or [None], ids=lambda p: str(p))
def test_recorded_samples_add_up_to_cuptis_total(path: Path | None) -> None:
    if path is None:
        pytest.skip("no H200 recording of the recursion kernel yet (device_pc.sh record)")
    check_accounting(pcs.load_recording(str(path)))


def check_edge_weights_within(recording_path: Path, tmp_path: Path, tolerance: float) -> None:
    """pyrun (replay) → pystruct → pyprof: shared_fn's B:A split within ``tolerance`` of 3:1."""
    from pyhpctk.cli.pyrun import main as pyrun_main
    from test_gpu_inst import _tree

    out = tmp_path / "m"
    demo = [sys.executable, str(DEMO), "1", "--simulated"]
    assert pyrun_main(["-e", f"gpu=simulated,pc={recording_path}", "-o", str(out), *demo]) == 0
    tree = _tree(out)
    site = {k[-2]: v for k, v in tree.items() if k[1:2] == ("gt_kernel",) and k[-1] == "shared_fn"}
    assert len(site) == 2, site
    a, b = (site[line] for line in sorted(site, key=lambda s: int(s.split()[1])))
    calls = json.loads(recording_path.read_text())["calls_per_thread"]
    truth = calls["gt_kernel->shared_fn@B"] / calls["gt_kernel->shared_fn@A"]
    assert abs((b / a) / truth - 1) <= tolerance, (b / a, truth)


@pytest.mark.parametrize(
    "path", [p for p in _sampled_recordings() if p == DENSE] or [None], ids=lambda p: str(p)
)
def test_pc_samples_rebuild_the_1_to_3_edge_weights_within_10_percent(
    path: Path | None, tmp_path: Path
) -> None:
    if path is None:
        pytest.skip("no dense H200 recording of the recursion kernel yet (device_pc.sh record)")
    check_edge_weights_within(path, tmp_path, 0.10)


@pytest.mark.gpu
def test_h200_dense_samples_add_up_and_rebuild_edge_weights(tmp_path: Path) -> None:
    """On the device: record densely (period 2^8, many calls), then the two checks above."""
    out = tmp_path / "dense.json"
    subprocess.run(
        [
            *(sys.executable, str(RECORDER), str(out), "--period", "8", "--launches", "6"),
            *("--iters", "16", "--reps", "400"),
        ],
        check=True,
    )
    check_accounting(pcs.load_recording(str(out)))
    check_edge_weights_within(out, tmp_path, 0.10)


def test_pc_replay_of_the_recursion_kernel_checks_edge_weights(tmp_path: Path) -> None:
    """CI for the 10% check's path: samples proportional to the synthetic exact counts
    (tests/test_gpu_inst.py) on the nvcc cubin, as one "selected" sample per thread-level
    execution / warps, replayed as PC samples."""
    from test_gpu_inst import synthetic_recording

    counts = synthetic_recording(tmp_path / "inst.json", tmp_path)
    columns = counts["rows"]  # type: ignore[index]
    warps = 264 * 128 // 32
    n = len(columns["inst"])
    recording = {
        **{k: counts[k] for k in ("kernel", "calls_per_thread", "launches", "cubins", "device")},
        "period_exponent": 12,
        "kernels_ns": 2_000_000,
        "reasons": [SELECTED, SELECTED + "_not_issued"],
        "functions": counts["functions"],
        "rows": {
            "cubin_crc": columns["cubin_crc"],
            "pc_offset": columns["pc_offset"],
            "function": [0] * n,
            "reason": [0] * n,
            "samples": [c // warps for c in columns["inst"]],
            "correlation": columns["correlation"],
            "range": [0] * n,
        },
    }
    path = tmp_path / "pc.json"
    path.write_text(json.dumps(recording))
    check_edge_weights_within(path, tmp_path, 1e-9)


def test_the_warp_issue_rate_is_a_taxonomy_formula_over_gins(reference: Path) -> None:
    """Issue #7 item 5: (samples - stalled samples) / samples, opt-in beside hpcprof's roots."""
    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import aggregate
    from pyhpctk.analysis.taxonomy import WARP_ISSUE_RATE, default_yaml
    from pyhpctk.present import formula as fx
    from pyhpctk.present.taxonomy import parse_taxonomy

    db = aggregate(ProfOptions.build([str(reference / PC_MEAS)]))
    plain = default_yaml(db.metrics, db.formulas, db.partials)
    text = default_yaml(db.metrics, db.formulas, db.partials, extra=[WARP_ISSUE_RATE])
    assert text.startswith(plain) and len(text) > len(plain)  # hpcprof's part unchanged
    roots = {m.name: m for m in parse_taxonomy(text)}
    assert {"GSAMP:UTIL", "GKER:OCC_THR"} <= set(roots)  # utilization, occupancy: hpcrun's own
    issue = roots[WARP_ISSUE_RATE.name]
    assert {inp.metric for inp in issue.inputs.values()} == {"GINS", "GINS:STL_ANY"}
    assert issue.inclusive is not None
    data = {"GINS": np.array([400.0, 10.0]), "GINS:STL_ANY": np.array([300.0, 10.0])}
    columns = {ref: data[inp.metric] for ref, inp in issue.inputs.items()}
    assert fx.evaluate(issue.inclusive, columns.__getitem__, 2).tolist() == [25.0, 0.0]
    # without PC sampling metrics the root is not written
    cpu = aggregate(ProfOptions.build([str(reference / "meas" / "small.m")]))
    assert default_yaml(cpu.metrics, cpu.formulas, cpu.partials, extra=[WARP_ISSUE_RATE]) == (
        default_yaml(cpu.metrics, cpu.formulas, cpu.partials)
    )


def test_pyprof_derived_writes_the_issue_rate_and_pyview_computes_it(
    reference: Path, tmp_path: Path
) -> None:
    """``pyprof --derived`` on hpcrun's PC-sampling measurement: the rate is in the database's
    taxonomy and pyview's value at the root is 100 (GINS - GINS:STL_ANY) / GINS of its own
    columns; without the flag the taxonomy is hpcprof's (the exact tests check its bytes)."""
    from pyhpctk.cli.pyprof import main as pyprof_main
    from pyhpctk.present.api import open_database

    plain, derived = tmp_path / "plain", tmp_path / "derived"
    assert pyprof_main(["-o", str(plain), str(reference / PC_MEAS)]) == 0
    assert pyprof_main(["-o", str(derived), "--derived", str(reference / PC_MEAS)]) == 0
    assert "GINS:ISSUE (%)" not in (plain / "metrics" / "default.yaml").read_text()
    assert "GINS:ISSUE (%)" in (derived / "metrics" / "default.yaml").read_text()
    database = open_database(derived)
    arrays = database.arrays(["GINS", "GINS:STL_ANY", "GINS:ISSUE (%)"])
    gins, stalled = arrays["GINS (I)"][0], arrays["GINS:STL_ANY (I)"][0]
    assert gins > 0
    assert arrays["GINS:ISSUE (%) (I)"][0] == pytest.approx(100 * (gins - stalled) / gins)
