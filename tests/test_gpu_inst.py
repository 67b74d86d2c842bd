"""Exact instruction counts inside GPU kernels (issue #7): CUPTI SASS metrics, GINS:SIMD_*.

CI: the ctypes / numpy layouts against ``cupti_sass_metrics.h`` (compiled with the C compiler
where the CUDA headers are), the attribution rules on hand-made rows, and the whole chain
``pyrun -e gpu=simulated,inst=RECORDING`` → ``pystruct --gpucfg yes`` → ``pyprof`` on the
ground-truth kernel of ``tests/data/gpu/record_pc.py``: with exact counts the reconstructed
call-edge weights are exact (1:3 at the two sites of ``shared_fn``, the recursion counts).

Recordings: ``tests/data/gpu/inst_gt_h200.json`` (``record_pc.py --inst`` on the H200) when it
exists; until then, and always besides it, a *synthetic* recording on
``tests/data/gpu/gt_sm90.cubin`` — the recorder's ``SOURCE`` built by
``nvcc -cubin -arch=sm_90 -lineinfo`` (CUDA 13.0) — whose call instructions carry warps x the
ground-truth calls per thread and whose other instructions carry warps x the calls of their
function (loop trip counts are not modelled: they do not enter the edge weights). Call sites
come from ``nvdisasm``, independently of pystruct. Tests marked ``gpu`` record on the device.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyhpctk.errors import FormatError, UsageError
from pyhpctk.formats import hpcrun
from pyhpctk.measure.gpu import inst_counting, parse_gpu_event
from pyhpctk.measure.gpu.cupti import sassmetrics as sm

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "gpu"
RECORDER = DATA / "record_pc.py"
CUBIN = DATA / "gt_sm90.cubin"
H200 = DATA / "inst_gt_h200.json"
DEMO = REPO / "examples" / "gpu_demo.py"
HEADERS = Path("/usr/local/cuda/include")
DEMO_LAUNCHES = 4  # one step of examples/gpu_demo.py --simulated launches 4 kernels
GRID = (264, 128)

sys.path.insert(0, str(DATA))
import record_pc  # noqa: E402  (the recorder's kernel source and ground truth)


def _nvdisasm() -> str:
    from pyhpctk.structure.cubin import find_nvdisasm

    tool = find_nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm")
    return tool


_LABEL = re.compile(r"^(\$?[A-Za-z_][\w$]*):\s*$")
_CALL = re.compile(r"/\*([0-9a-f]+)\*/\s+CALL\.\S+\s+`\((\$?[\w$]+)\)")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]+)\*/\s+\S")


def _short(name: str) -> str:
    return name.rsplit("$", 1)[-1] if name.startswith("$") else name


def disassembly(cubin: bytes, tmp: Path) -> tuple[dict[int, str], list[tuple[str, str, int]]]:
    """(instruction offset in ``.text.gt_kernel`` → function, [(caller, callee, offset)])."""
    path = tmp / "k.cubin"
    path.write_bytes(cubin)
    text = subprocess.run(
        [_nvdisasm(), "-c", str(path)], capture_output=True, text=True, check=True
    ).stdout
    section = text[text.index(".text.gt_kernel:") :]
    owner: dict[int, str] = {}
    calls: list[tuple[str, str, int]] = []
    function = record_pc.KERNEL
    for line in section.splitlines():
        label = _LABEL.match(line.strip())
        if label and not label.group(1).startswith("."):
            function = _short(label.group(1))
            continue
        if line.startswith("//---") and owner:
            break  # the next section
        instruction = _INSTRUCTION.search(line)
        if instruction:
            owner[int(instruction.group(1), 16)] = function
        call = _CALL.search(line)
        if call:
            calls.append((function, _short(call.group(2)), int(call.group(1), 16)))
    return owner, calls


def edge_names(calls: list[tuple[str, str, int]]) -> dict[int, str]:
    """Call instruction offset → its ``calls_per_thread`` key (``@A``/``@B`` in address order)."""
    names: dict[int, str] = {}
    seen: Counter[tuple[str, str]] = Counter()
    for caller, callee, offset in sorted(calls, key=lambda c: c[2]):
        key = f"{caller}->{callee}"
        if key == "gt_kernel->shared_fn":
            key += "@" + "AB"[seen[(caller, callee)]]
        seen[(caller, callee)] += 1
        names[offset] = key
    return names


def invocations(calls: dict[str, int]) -> dict[str, int]:
    """Calls per thread of each function (the kernel runs once)."""
    result: dict[str, int] = defaultdict(int)
    result[record_pc.KERNEL] = 1
    for edge, count in calls.items():
        result[edge.split("->")[1].split("@")[0]] += count
    return result


def synthetic_recording(path: Path, tmp: Path, launches: int = 2) -> dict[str, object]:
    """An ``--inst`` recording on the nvcc cubin (module docstring), written to ``path``."""
    cubin = CUBIN.read_bytes()
    owner, calls = disassembly(cubin, tmp)
    truth = record_pc.CALLS
    sites = edge_names(calls)
    per_function = invocations(truth)
    warps = GRID[0] * GRID[1] // 32
    offsets = sorted(owner)
    per_thread = [truth[sites[o]] if o in sites else per_function[owner[o]] for o in offsets]
    columns: dict[str, list[int]] = {name: [] for name in sm.INST_DTYPE.names or ()}
    for launch in range(1, launches + 1):
        for offset, count in zip(offsets, per_thread, strict=True):
            values = (1, 0, 0, offset, count * warps, count * warps * 32, launch)
            for name, value in zip(sm.INST_DTYPE.names or (), values, strict=True):
                columns[name].append(value)
    recording = {
        "format": "inst",
        "kernel": record_pc.KERNEL,
        "calls_per_thread": truth,
        "launches": launches,
        "grid": list(GRID),
        "device": {"sm_count": 132, "clock_khz": 1_980_000, "warp_size": 32},
        "kernels_ns": 1_000_000 * launches,
        "functions": [record_pc.KERNEL],
        "rows": columns,
        "cubins": [{"base64": base64.b64encode(cubin).decode(), "crc": 1}],
    }
    path.write_text(json.dumps(recording))
    return recording


def _recordings() -> list[str]:
    return ["synthetic", *(["h200"] if H200.exists() else [])]


def _recording(which: str, tmp: Path) -> Path:
    if which == "h200":
        return H200
    path = tmp / "inst.json"
    synthetic_recording(path, tmp)
    return path


# -- layouts against the header --------------------------------------------------------------


def _header_layouts(tmp: Path) -> dict[str, int]:
    """offsetof / STRUCT_SIZE of every declared structure, from the C compiler and the header."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not (HEADERS / "cupti_sass_metrics.h").exists():
        pytest.skip("no C compiler or no CUDA headers")
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <cupti_sass_metrics.h>",
        "#include <cupti_profiler_target.h>",
        "#include <cupti_target.h>",
        "int main(void) {",
    ]
    for name, kind in sm.PARAM_STRUCTS.items():
        for field_name, _ in kind._fields_:
            lines.append(f'printf("{name}.{field_name} %zu\\n", offsetof({name}, {field_name}));')
    for name in sm.STRUCT_SIZES:
        lines.append(f'printf("{name} %zu\\n", (size_t){name}_STRUCT_SIZE);')
    for name in SASS_DATA_FIELDS:
        lines.append(
            f'printf("CUpti_SassMetrics_Data.{name} %zu\\n",'
            f" offsetof(CUpti_SassMetrics_Data, {name}));"
        )
    lines += [
        'printf("sizeof.CUpti_SassMetrics_Data %zu\\n", sizeof(CUpti_SassMetrics_Data));',
        'printf("sizeof.CUpti_SassMetrics_InstanceValue %zu\\n",'
        " sizeof(CUpti_SassMetrics_InstanceValue));",
        "return 0; }",
    ]
    source = tmp / "layout.c"
    source.write_text("\n".join(lines))
    binary = tmp / "layout"
    subprocess.run([compiler, f"-I{HEADERS}", str(source), "-o", str(binary)], check=True)
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in (line.split() for line in out.splitlines())}


#: SASS_DATA's fields by their header names.
SASS_DATA_FIELDS = {
    "structSize": "size",
    "pPriv": "priv",
    "cubinCrc": "cubin_crc",
    "functionIndex": "function_index",
    "functionName": "function_name",
    "pcOffset": "pc_offset",
    "pInstanceValues": "instance_values",
}


def test_sass_metrics_layouts_match_the_header(tmp_path: Path) -> None:
    header = _header_layouts(tmp_path)
    for name, kind in sm.PARAM_STRUCTS.items():
        for field_name, _ in kind._fields_:
            assert getattr(kind, field_name).offset == header[f"{name}.{field_name}"], (
                name,
                field_name,
            )
    for name, size in sm.STRUCT_SIZES.items():
        assert size == header[name], name
    for theirs, ours in SASS_DATA_FIELDS.items():
        assert sm.SASS_DATA.fields[ours][1] == header[f"CUpti_SassMetrics_Data.{theirs}"]
    assert sm.SASS_DATA.itemsize == header["sizeof.CUpti_SassMetrics_Data"]
    assert sm.INSTANCE_VALUE.itemsize == header["sizeof.CUpti_SassMetrics_InstanceValue"]


# -- rows and metrics --------------------------------------------------------------------------


def test_cupti_records_become_one_row_per_instruction_whatever_the_record_split() -> None:
    """One record per (instruction, metric) or one per instruction: the same rows."""
    ids = {11: "inst", 22: "threads"}
    # per (instruction, metric): pc 0x10 twice (inst, threads), pc 0x20 twice
    data = np.zeros(4, sm.SASS_DATA)
    data["cubin_crc"] = 7
    data["pc_offset"] = [0x10, 0x10, 0x20, 0x20]
    values = np.zeros((4, 1), sm.INSTANCE_VALUE)
    values["metric_id"] = [[11], [22], [11], [22]]
    values["value"] = [[3], [96], [5], [100]]
    split = sm.rows_of_records(data, values, np.zeros(4, np.int32), ids)
    joined = sm.rows_of_records(
        data[[0, 2]],
        np.array([[(11, 3), (22, 96)], [(11, 5), (22, 100)]], sm.INSTANCE_VALUE),
        np.zeros(2, np.int32),
        ids,
    )
    for rows in (split, joined):
        assert rows["pc_offset"].tolist() == [0x10, 0x20]
        assert rows["inst"].tolist() == [3, 5]
        assert rows["threads"].tolist() == [96, 100]
        assert rows["cubin_crc"].tolist() == [7, 7]


def test_counts_become_gins_and_simd_lanes() -> None:
    rows = np.zeros(3, sm.INST_DTYPE)
    rows["pc_offset"] = [0x0, 0x10, 0x20]
    rows["inst"] = [4, 2, 0]
    rows["threads"] = [128, 40, 0]
    got = sm.attribute_counts(rows, ["k"], {"k": 0x300})
    assert got.values == {
        (0x300, "GINS"): 4,
        (0x300, "GINS:SIMD_TOT"): 128,
        (0x300, "GINS:SIMD_ACT"): 128,
        (0x310, "GINS"): 2,
        (0x310, "GINS:SIMD_TOT"): 64,
        (0x310, "GINS:SIMD_ACT"): 40,
        (0x310, "GINS:SIMD_WST"): 24,
    }
    assert got.kernel_values == {}
    rows["function"] = 1  # a function the gpubin does not have
    assert sm.attribute_counts(rows, ["k", "other"], {"k": 0x300}).values == {}


@given(
    st.lists(
        st.tuples(st.integers(0, 2**40), st.integers(0, 32)).map(lambda t: (t[0], t[0] * t[1])),
        min_size=1,
        max_size=20,
    ),
    st.lists(st.integers(0, 10**12), min_size=1, max_size=6).filter(lambda w: sum(w) > 0),
)
def test_split_counts_keep_every_total_and_follow_the_weights(
    counts: list[tuple[int, int]], weights: list[int]
) -> None:
    rows = np.zeros(len(counts), sm.INST_DTYPE)
    rows["inst"] = [warps for warps, _ in counts]
    rows["threads"] = [threads for _, threads in counts]
    rows["pc_offset"] = np.arange(len(counts)) * 16
    parts = sm.split_counts(rows, weights)
    assert len(parts) == len(weights)
    total = sum(weights)
    for row, (warps, threads) in enumerate(counts):
        got = [(int(part["inst"][row]), int(part["threads"][row])) for part in parts]
        assert sum(w for w, _ in got) == warps and sum(t for _, t in got) == threads
        for (part_warps, part_threads), weight in zip(got, weights, strict=True):
            assert abs(part_warps * total - warps * weight) < total  # within one execution
            assert part_threads <= 32 * part_warps  # never more threads than its warps hold
            if warps:
                assert abs(part_threads * warps - threads * part_warps) < warps
    for part in parts:
        assert (part["pc_offset"] == rows["pc_offset"]).all()


def test_split_counts_refuse_weights_that_add_up_to_nothing() -> None:
    with pytest.raises(ValueError, match="more than 0"):
        sm.split_counts(np.zeros(1, sm.INST_DTYPE), [0, 0])


def test_the_inst_option() -> None:
    assert inst_counting(parse_gpu_event("gpu=nvidia,inst"))
    assert not inst_counting(parse_gpu_event("gpu=nvidia,pc"))
    assert inst_counting(parse_gpu_event("gpu=simulated,inst=r.json"))
    for bad in ("gpu=nvidia,pc,inst", "gpu=simulated,inst", "gpu=nvidia,inst=3"):
        with pytest.raises(UsageError):
            inst_counting(parse_gpu_event(bad))


def test_a_broken_inst_recording_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"format": "inst", "kernel": "k", "rows": {"inst": [1]}}')
    with pytest.raises(FormatError, match="instruction count recording"):
        sm.load_inst_recording(str(path))
    path.write_text('{"format": "pc"}')
    with pytest.raises(FormatError, match="not an instruction count recording"):
        sm.load_inst_recording(str(path))


def test_the_checked_in_cubin_is_the_recorders_kernel(tmp_path: Path) -> None:
    """Provenance: nvcc (where present) builds the same functions and call sites from SOURCE."""
    owner, calls = disassembly(CUBIN.read_bytes(), tmp_path)
    assert set(edge_names(calls).values()) == set(record_pc.CALLS)
    assert set(owner.values()) == set(invocations(record_pc.CALLS))
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return
    source = tmp_path / "gt_kernel.cu"
    source.write_text(record_pc.SOURCE)
    built = tmp_path / "gt.cubin"
    subprocess.run(
        [nvcc, "-cubin", "-arch=sm_90", "-lineinfo", "-o", str(built), str(source)], check=True
    )
    fresh_owner, fresh_calls = disassembly(built.read_bytes(), tmp_path)
    assert sorted(fresh_calls) == sorted(calls)
    assert Counter(fresh_owner.values()) == Counter(owner.values())


# -- end to end: pyrun (simulated) → pystruct --gpucfg yes → pyprof ---------------------------


def _measure(recording: Path, tmp: Path) -> Path:
    from pyhpctk.cli.pyrun import main as pyrun_main

    out = tmp / "m"
    demo = [sys.executable, str(DEMO), "1", "--simulated"]
    assert pyrun_main(["-e", f"gpu=simulated,inst={recording}", "-o", str(out), *demo]) == 0
    return out


def _values_by_placeholder(out: Path) -> dict[int, dict[int, dict[str, float]]]:
    """Values per ``GPUKernl`` placeholder (one per calling context) and instruction offset
    (from the kernel entry), from the main thread's profile."""
    from pyhpctk.formats.hpcrun_model import placeholder_ip

    profile = hpcrun.read(next(out.glob("*-000-*.hpcrun")))
    cct = profile.cct
    kernl = placeholder_ip("GPUKernl")
    placeholders = set(cct["id"][cct["lm_ip"] == kernl].tolist())
    below = {int(r["id"]): r for r in cct if int(r["parent_id"]) in placeholders}
    entry = next(int(r["lm_ip"]) for r in below.values() if int(r["flags"]) & 1)
    names = [m.name for m in profile.metrics]
    nodes, metrics, decoded = profile.decoded_values()
    values: dict[int, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for node, metric, value in zip(nodes.tolist(), metrics.tolist(), decoded.tolist(), strict=True):
        if node in below:
            row = below[node]
            at = values[int(row["parent_id"])][int(row["lm_ip"]) - entry]
            at[names[metric]] = at.get(names[metric], 0.0) + value
    return values


def _instruction_values(out: Path) -> dict[int, dict[str, float]]:
    """Values per instruction offset (from the kernel entry), summed over the placeholders."""
    values: dict[int, dict[str, float]] = defaultdict(dict)
    for per_offset in _values_by_placeholder(out).values():
        for offset, named in per_offset.items():
            for name, value in named.items():
                values[offset][name] = values[offset].get(name, 0.0) + value
    return values


def _window_counts(recording: sm.InstRecording, launches: int) -> dict[int, int]:
    """GINS per instruction offset of ``launches`` replayed launches (each the next group)."""
    groups = recording.launch_groups()
    counts: dict[int, int] = defaultdict(int)
    for launch in range(launches):
        for row in groups[launch % len(groups)]:
            counts[int(row["pc_offset"])] += int(row["inst"])
    return {offset: count for offset, count in counts.items() if count}


@pytest.mark.parametrize("which", _recordings())
def test_pyrun_simulated_inst_puts_exact_counts_on_each_instruction(
    which: str, tmp_path: Path
) -> None:
    path = _recording(which, tmp_path)
    recording = sm.load_inst_recording(str(path))
    values = _instruction_values(_measure(path, tmp_path))
    expected = _window_counts(recording, DEMO_LAUNCHES)  # each launch replays the next group
    assert {o: int(v.get("GINS", 0)) for o, v in values.items()} == expected
    for v in values.values():
        assert v["GINS:SIMD_TOT"] == 32 * v["GINS"]
        assert v["GINS:SIMD_ACT"] + v.get("GINS:SIMD_WST", 0) == v["GINS:SIMD_TOT"]
        assert not any(name.startswith("GSAMP") for name in v)


TWO_LINES = """
from pyhpctk.measure.gpu import simulated_runtime

gpu = simulated_runtime()


def once():
    gpu.launch()


def thrice():
    for _ in range(3):
        gpu.launch()


once()
thrice()
gpu.synchronize()
"""


def _kernel_gins_by_python_line(out: Path) -> dict[tuple[str, int], float]:
    """Inclusive GINS of each ``<gpu kernel>`` context, keyed by the Python function and line
    that launched it."""
    view, paths, inclusive = gins_view(out)
    result: dict[tuple[str, int], float] = defaultdict(float)
    for ident in view.contexts:
        path = paths[ident]
        if path[-1][0] == "entry" or path[-1][2] is None or path[-1][2][0] != "<gpu kernel>":
            continue
        functions = [label[2][0] for label in path[1:-1] if label[2] is not None]
        result[(functions[-1], int(path[-2][4]))] += inclusive.get(ident, 0.0)
    return result


@pytest.mark.parametrize("which", _recordings())
def test_counts_of_launches_from_two_lines_are_split_between_them(
    which: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """CUPTI gives one total for all counted launches; pyrun splits it between the calling
    contexts by the launches' GPU time (equal here: the simulated launches take the same)."""
    from pyhpctk.cli.pyrun import main as pyrun_main

    path = _recording(which, tmp_path)
    recording = sm.load_inst_recording(str(path))
    program = tmp_path / "two_lines.py"
    program.write_text(TWO_LINES)
    out = tmp_path / "m"
    event = f"gpu=simulated,inst={path}"
    assert pyrun_main(["-e", event, "-o", str(out), sys.executable, str(program)]) == 0
    assert "split among 2 calling contexts" in capfd.readouterr().err
    # per instruction: one placeholder per line, the parts adding up to the window's total
    window = _window_counts(recording, 4)
    parts = [
        {o: int(v["GINS"]) for o, v in per_offset.items() if "GINS" in v}
        for per_offset in _values_by_placeholder(out).values()
    ]
    assert len(parts) == 2
    first, second = sorted(parts, key=lambda p: sum(p.values()))
    offsets = set(first) | set(second)
    assert {o: first.get(o, 0) + second.get(o, 0) for o in offsets} == window
    for offset in offsets:  # one launch in four, to one execution
        assert abs(4 * first.get(offset, 0) - window[offset]) < 4
    # and in pyprof's tree, under the Python functions that launched them: 1:3
    tree = _kernel_gins_by_python_line(out)
    lines = TWO_LINES.splitlines()
    launch_lines = [i for i, text in enumerate(lines, 1) if "gpu.launch()" in text]
    assert sorted(tree) == [("once", launch_lines[0]), ("thrice", launch_lines[1])]
    total = sum(window.values())
    once, thrice = tree[("once", launch_lines[0])], tree[("thrice", launch_lines[1])]
    assert once + thrice == total
    assert abs(4 * once - total) < 4 * len(window)


@pytest.mark.parametrize("which", _recordings())
def test_call_instruction_counts_are_the_ground_truth_call_counts(
    which: str, tmp_path: Path
) -> None:
    """GINS at each call instruction = warps x calls per thread x launches, exactly."""
    path = _recording(which, tmp_path)
    recording = sm.load_inst_recording(str(path))
    values = _instruction_values(_measure(path, tmp_path))
    _, calls = disassembly(recording.cubins[0], tmp_path)
    sites = edge_names(calls)
    assert set(sites.values()) == set(recording.calls_per_thread)
    for offset, edge in sites.items():
        expected = recording.warps * recording.calls_per_thread[edge] * DEMO_LAUNCHES
        assert values[offset]["GINS"] == expected, edge


def gins_view(out: Path) -> tuple[Any, dict[int, Any], dict[int, float]]:
    """pystruct --gpucfg yes, then pyprof, on measurement ``out``: the view, each context's path
    of labels and its inclusive GINS (the summary profile's)."""
    from pyhpctk.analysis.compare import view_of_aggregate
    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import aggregate
    from pyhpctk.cli.pystruct import main as pystruct_main

    assert pystruct_main(["--gpucfg", "yes", "-q", str(out)]) == 0
    view = view_of_aggregate(aggregate(ProfOptions.build([str(out)])))
    gins = next(i for i, n in view.metric_names.items() if n == ("GINS", "execution"))
    summary = view.profiles[1]
    inclusive = {
        int(c): float(v)
        for c, m, v in zip(summary.ctx, summary.metric, summary.value, strict=True)
        if m == gins
    }
    return view, view.paths(), inclusive


def _tree(out: Path) -> dict[tuple[str, ...], float]:
    """Inclusive GINS of every context of pyprof's database, keyed by its path of names."""
    view, paths, inclusive = gins_view(out)

    def name(label: tuple[object, ...]) -> str:
        if label[0] != "entry" and label[2]:
            return _short(str(label[2][0]))  # type: ignore[index]
        if label[0] != "entry" and label[1] == 2:
            return f"line {label[4]}"
        return str(label[1])

    result: dict[tuple[str, ...], float] = defaultdict(float)
    for ident in view.contexts:
        key = tuple(name(label) for label in paths[ident])
        if "<gpu kernel>" in key:
            result[key[key.index("<gpu kernel>") :]] += inclusive.get(ident, 0.0)
    return result


CHAIN = ("gt_kernel", "top", "mid", "leaf")


def _below(tree: dict[tuple[str, ...], float], *names: str) -> float:
    """Inclusive GINS of every context whose path ends with ``names``."""
    return sum(v for k, v in tree.items() if k[-len(names) :] == names)


@pytest.mark.parametrize("which", _recordings())
def test_exact_counts_rebuild_the_gpu_cct_with_exact_edge_weights(
    which: str, tmp_path: Path
) -> None:
    path = _recording(which, tmp_path)
    recording = sm.load_inst_recording(str(path))
    tree = _tree(_measure(path, tmp_path))
    kernel = ("<gpu kernel>", "gt_kernel")
    groups = recording.launch_groups()
    total = sum(int(groups[i % len(groups)]["inst"].sum()) for i in range(DEMO_LAUNCHES))
    assert tree[kernel] == total  # every count lands below the kernel, once
    # shared_fn's cost is split between its two call sites exactly as their counts: 1:3
    site = {k[-2]: v for k, v in tree.items() if k[:2] == kernel and k[-1] == "shared_fn"}
    assert len(site) == 2, site
    a, b = (site[line] for line in sorted(site, key=lambda s: int(s.split()[1])))
    calls = recording.calls_per_thread
    assert b / a == pytest.approx(
        calls["gt_kernel->shared_fn@B"] / calls["gt_kernel->shared_fn@A"], rel=1e-12
    )
    # the chain below the kernel: gt_kernel -> top -> mid -> leaf, through their call lines
    chains = [k for k, v in tree.items() if v and [n for n in k if n in CHAIN] == list(CHAIN)]
    assert chains and all(k[-1] != "leaf" or k.index("leaf") > k.index("mid") for k in chains)
    # recursion collapsed: rec never below rec, ping/pong never below each other
    for key in tree:
        for function in ("rec", "ping", "pong"):
            assert key.count(function) <= 1, key
        assert not ({"ping", "pong"} <= set(key)), key
    assert _below(tree, "rec") > 0 and _below(tree, "ping") > 0 and _below(tree, "pong") > 0


# -- on the H200 ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_cupti_sass_metrics_count_the_ground_truth_kernel_exactly(tmp_path: Path) -> None:
    """``record_pc.py --inst``: one launch's counts are the ground truth at every call site,
    and three launches in the counting window count three times as much everywhere."""

    def record(launches: int) -> sm.InstRecording:
        out = tmp_path / f"inst{launches}.json"
        subprocess.run(
            [
                *(sys.executable, str(RECORDER), str(out), "--inst"),
                *("--launches", str(launches), "--iters", "64"),
            ],
            check=True,
        )
        return sm.load_inst_recording(str(out))

    one, three = record(1), record(3)
    (single,) = one.launch_groups()
    (triple,) = three.launch_groups()
    assert len(single) > 50
    _, calls = disassembly(one.cubins[-1], tmp_path)
    counts = {int(r["pc_offset"]): int(r["inst"]) for r in single}
    for offset, edge in edge_names(calls).items():
        assert counts[offset] == one.warps * one.calls_per_thread[edge], edge
    threads = {int(r["pc_offset"]): int(r["threads"]) for r in single}
    assert all(threads[o] == 32 * counts[o] for o in edge_names(calls))
    assert {int(r["pc_offset"]): int(r["inst"]) for r in triple} == {
        o: 3 * c for o, c in counts.items()
    }


@pytest.mark.gpu
def test_pyrun_nvidia_inst_counts_instructions_under_the_kernel(tmp_path: Path) -> None:
    """pyrun counts from cudaProfilerStart() on: the recorder's warm-up and 3 launches."""
    out = tmp_path / "m"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", "gpu=nvidia,inst"),
            *("-o", str(out), sys.executable, str(RECORDER), "x", "--no-sampling"),
            *("--profiler-start", "--launches", "3", "--iters", "64"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "CUPTI counted gt_kernel (" in result.stderr, result.stderr
    assert "while 4 kernel launches ran" in result.stderr, result.stderr
    values = _instruction_values(out)
    gins = {o: v["GINS"] for o, v in values.items() if "GINS" in v}
    assert len(gins) > 50
    launches = 1 + 3  # the recorder's warm-up launch and the 3 timed ones
    warps = GRID[0] * GRID[1] // 32
    calls = None
    for gpubin in (out / "gpubins").glob("*.gpubin"):
        with contextlib.suppress(ValueError):  # not the module of gt_kernel
            calls = disassembly(gpubin.read_bytes(), tmp_path)[1]
    assert calls is not None
    for offset, edge in edge_names(calls).items():
        assert gins[offset] == warps * record_pc.CALLS[edge] * launches, edge
    # the warm-up launch and the 3 timed ones come from two lines: CUPTI's totals are split
    # between them by the launches' GPU time, which follows the counts (within 10 %)
    assert "split among 2 calling contexts" in result.stderr, result.stderr
    tree = _kernel_gins_by_python_line(out)
    assert len(tree) == 2, tree
    warm_up, timed = (tree[key] for key in sorted(tree, key=lambda k: k[1]))
    assert timed / warm_up == pytest.approx(3, rel=0.1), (warm_up, timed)


def test_ctypes_structures_are_what_cupti_reads() -> None:
    """structSize is never sizeof (padding): Enable is 25 bytes of a 32-byte structure."""
    enable = sm.STRUCT_SIZES["CUpti_SassMetricsEnable_Params"]
    assert enable == sm._Enable.enableLazyPatching.offset + 1
    assert ctypes.sizeof(sm._Enable) > enable
