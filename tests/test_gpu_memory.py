"""GPU memory with its stacks (issue #37 item 2), without a GPU: a program whose fake allocator
tells pyrun's tracker what CuPy's MemoryHook, PyTorch's allocator history and raw cudaMalloc
would (tests/data/gpu/fake_allocator.py, through the hooks' own entry points), measured with
``pyrun -e gpu=simulated,memory``, then pyprof and pyview: bytes allocated, peak live and live at
the process's peak under each allocating line, the timeline in the trace export and the HTML
report, and the out-of-memory report, against what the program is known to allocate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pyhpctk.analysis import pipeline
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.sources import copy_gpu_memory
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.formats import gpu_memory
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import memory, memory_files, shutdown
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.memory_hooks import TorchAllocator, torch_refusal
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session
from pyhpctk.present.api import open_database
from pyhpctk.present.memory import report_section

PROGRAM = Path(__file__).resolve().parent / "data" / "gpu" / "fake_allocator.py"
MIB = 1 << 20
#: The truth, per ``# SITE`` line: (bytes allocated, allocations, peak live, live at peak).
TRUTH = {
    "weights": (4 * MIB, 1, 4 * MIB, 4 * MIB),
    "activations": (6 * MIB, 6, 3 * MIB, 0),
    "workspace": (4 * MIB, 2, 2 * MIB, 0),
    "raw": (1 * MIB, 1, 1 * MIB, 0),
    "torch": (8 * MIB, 1, 8 * MIB, 8 * MIB),
}
METRICS = ("GMEMLIVE:ALLOC (B)", "GMEMLIVE:COUNT", "GMEMLIVE:PEAK (B)", "GMEMLIVE:ATPEAK (B)")


def site_line(name: str) -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# SITE {name}"))


def measure_program(out: Path, program: Path, *args: str) -> int:
    return pyrun_main(
        ["-e", "gpu=simulated,memory", "-o", str(out), sys.executable, str(program), *args]
    )


def measure(out: Path, *args: str) -> int:
    return measure_program(out, PROGRAM, *args)


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("memory") / "m"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENBLAS_NUM_THREADS", "1")
        assert measure(out) == 0
    db = out.parent / "db"
    pipeline.run(ProfOptions.build([str(out)], output=str(db)))
    return db


def inclusive(db: Path, line: int, metric: str) -> float:
    arrays = open_database(db).arrays([metric])
    hits = [
        float(value)
        for label, value in zip(arrays["label"], arrays[f"{metric} (I)"], strict=True)
        if str(label).rsplit("/", 1)[-1] == f"fake_allocator.py: {line}"
    ]
    assert hits, f"no context for fake_allocator.py:{line}"
    return sum(hits)


@pytest.mark.parametrize("site", sorted(TRUTH))
def test_each_allocating_line_has_its_bytes_peak_and_live_at_peak(
    database: Path, site: str
) -> None:
    found = tuple(inclusive(database, site_line(site), metric) for metric in METRICS)
    assert found == TRUTH[site], dict(zip(METRICS, found, strict=True))


def test_the_timeline_is_in_the_trace_export(database: Path, tmp_path: Path) -> None:
    export = tmp_path / "trace.json"
    assert pyview_main([str(database), "--trace-export", str(export)]) == 0
    counters = [e for e in json.loads(export.read_text())["traceEvents"] if e["ph"] == "C"]
    assert {e["name"].split(" (")[0] for e in counters} == {"GPU 0 memory"}
    allocated = [e["args"]["allocated"] for e in counters]
    reserved = [e["args"]["reserved"] for e in counters]
    times = [e["ts"] for e in counters]
    assert times == sorted(times) and times[0] >= 0
    assert max(allocated) == 12 * MIB  # weights 4 + torch 8 (the steps' 9 came before)
    assert allocated[-1] == 12 * MIB
    # CuPy's pool grew 16 MiB, the raw 1 MiB came and went, PyTorch's segment is 10 MiB
    assert reserved[0] == 16 * MIB and max(reserved[:-2]) == 17 * MIB
    assert reserved[-1] == 26 * MIB
    # the steps' transient peak, twice: 4 + 3 + 2
    assert allocated.count(9 * MIB) == 2


def test_the_database_holds_the_memory_file_with_each_allocators_peak(database: Path) -> None:
    (data,) = gpu_memory.read_all(database)  # copied by pyprof from the measurement
    assert data.peak_bytes == 12 * MIB
    assert data.source_peaks == {"torch": 8 * MIB, "cupy": 9 * MIB, "cuda": 1 * MIB}
    assert data.sources == ["cuda", "cupy", "torch"]
    first = data.top_sites[0]
    assert (first["at_peak"], first["count"], first["live"]) == (8 * MIB, 1, 8 * MIB)
    assert str(first["stack"][0]).startswith("torch_block (")  # type: ignore[index]
    assert [site["sources"] for site in data.top_sites] == [["torch"], ["cupy"]]


def test_the_html_report_shows_the_peak_and_the_largest_sites(
    database: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.html"
    assert pyview_main([str(database), "--html", str(report)]) == 0
    text = report.read_text()
    section = text[text.index('<section id="gpu-memory">') :]
    assert "peak 12.00 MiB allocated" in section
    assert section.index("torch_block") < section.index("load_weights")  # 8 MiB, then 4
    assert "activations" not in section[: section.index("</table>")]  # nothing live at peak


@pytest.mark.parametrize("how", ["oom", "cupy-oom"])
def test_an_out_of_memory_error_leaves_its_report(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], how: str
) -> None:
    out = tmp_path / "m"
    assert measure(out, how) == 1  # the program dies of its exception
    reports = sorted((out / "gpumem").glob("oom-*.txt"))
    assert len(reports) == 1
    lines = reports[0].read_text().splitlines()
    assert lines[0] == "out of memory on device 0: 3.00 GiB asked for (3221225472 bytes)"
    assert lines[2].startswith("live when it failed: 12.00 MiB (12582912 bytes) in 2 allocation")
    assert lines[3] == "device 0: 12.00 MiB allocated, 26.00 MiB reserved by the allocators"
    first = lines.index("sites by live bytes (innermost frame first):") + 1
    assert lines[first].startswith("  1. 8.00 MiB live (8388608 bytes, 66.7 %)")
    assert lines[first + 1].strip().startswith("torch_block (")
    assert any(line.strip().startswith("load_weights (") for line in lines[first:])
    assert f"fake_allocator.py:{site_line('weights')})" in "\n".join(lines)
    err = capfd.readouterr().err
    assert f"out-of-memory report: {reports[0]}" in err  # pyrun's summary points to it
    timeline = json.loads(next((out / "gpumem").glob("memory-*.json")).read_text())
    assert timeline["oom_reports"] == [reports[0].name]


def test_memory_takes_no_value_and_is_listed(capfd: pytest.CaptureFixture[str]) -> None:
    assert pyrun_main(["-e", "gpu=simulated,memory=yes", sys.executable, "-c", "pass"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["pyrun: error: gpu=simulated: memory takes no value (say gpu=simulated,memory)"]
    assert pyrun_main(["-L"]) == 0
    listing = capfd.readouterr().out
    assert "      memory                 also every allocation and free of PyTorch" in listing


def test_a_pools_own_cudamalloc_is_not_counted_twice() -> None:
    """CUPTI sees the cudaMalloc behind a pool's segment: the pool reports it, once."""
    pool, raw = memory.Events(), memory.Events()
    pool.add(1, memory.RESERVE, memory.TORCH, 0, 0x1000, 10 * MIB, -1)
    pool.add(2, memory.ALLOC, memory.TORCH, 0, 0x1000, 4 * MIB, 0)
    raw.add(1, memory.RESERVE, memory.CUDA, 0, 0x1000, 10 * MIB, 1)  # the same segment
    raw.add(3, memory.RESERVE, memory.CUDA, 0, 0x9000, 2 * MIB, 1)  # NCCL's own
    raw.add(4, memory.FREE, memory.CUPY, 0, 0x5000, 0, -1)  # allocated before tracking began
    result = memory.replay([pool, raw], 2)
    assert result.alloc_bytes.tolist() == [4 * MIB, 2 * MIB]
    assert result.peak_bytes == 6 * MIB
    assert result.timelines[0][2][-1] == 12 * MIB  # reserved: the segment once, and NCCL's
    assert result.source_peaks == [4 * MIB, 0, 2 * MIB]  # torch, cupy, cuda
    assert result.unknown_frees == 1


def test_a_site_allocating_through_two_allocators_keeps_each_ones_bytes_at_peak() -> None:
    """A Python line whose PyTorch call also made cuBLAS cudaMalloc its workspace (the device's
    conv.py:548 and linear.py:134): its bytes at the peak, by allocator, in the memory file."""
    torch, raw = memory.Events(), memory.Events()
    torch.add(1, memory.RESERVE, memory.TORCH, 0, 0x10000, 64 * MIB, -1)
    torch.add(2, memory.ALLOC, memory.TORCH, 0, 0x10000, 32 * MIB, 0)  # the layer's output
    raw.add(3, memory.RESERVE, memory.CUDA, 0, 0x90000, 3 * MIB, 0)  # cuBLAS's workspace
    torch.add(4, memory.ALLOC, memory.TORCH, 0, 0x20000, 5 * MIB, 1)  # another line, torch only
    torch.add(5, memory.ALLOC, memory.TORCH, 0, 0x30000, 7 * MIB, 0)  # freed before the peak
    torch.add(6, memory.FREE, memory.TORCH, 0, 0x30000, 0, -1)
    torch.add(7, memory.ALLOC, memory.TORCH, 0, 0x40000, 9 * MIB, 1)  # the peak: 49 MiB
    torch.add(8, memory.FREE, memory.TORCH, 0, 0x40000, 0, -1)
    result = memory.replay([torch, raw], 2)
    assert result.peak_bytes == 49 * MIB
    tracker: Any = SimpleNamespace(
        sites=[memory.Site(1, ()), memory.Site(1, ())],
        session=SimpleNamespace(functions=SimpleNamespace(stanzas=[])),
    )
    top = memory_files._top(tracker, result.at_peak, result)
    assert [(site["at_peak"], site["sources"], site["at_peak_by_source"]) for site in top] == [
        (35 * MIB, ["torch", "cuda"], {"torch": 32 * MIB, "cuda": 3 * MIB}),
        (14 * MIB, ["torch"], {"torch": 14 * MIB}),
    ]
    # the HTML report's table says the split where a site has one
    page = report_section([gpu_memory.MemoryFile(1, ["cuda", "torch"], 49 * MIB, 7, top_sites=top)])
    assert page.count("<tr><td>") == 2
    assert "<td>35.00 MiB<br>(torch 32.00 MiB, cuda 3.00 MiB)</td>" in page
    assert "<td>14.00 MiB</td>" in page


def test_only_the_pytorch_releases_known_are_hooked() -> None:
    assert torch_refusal("2.14.1+cu130") == ""
    assert torch_refusal("2.14.0") == ""
    assert torch_refusal("2.11.0+cu130") == ""  # the device's
    assert torch_refusal("2.15.0") == (
        "pyrun: gpu memory: PyTorch 2.15.0 is not supported (supported: 2.11.x to 2.14.x; its"
        " allocator's private API may differ): PyTorch's memory is not measured"
    )


SEEN: dict[str, object] = {}


def _record_2_11(
    enabled: str = "all", context: str = "all", stacks: str = "all", device: object = None
) -> None:
    """A release whose history takes no ``skip_actions`` (as 2.11's)."""
    SEEN.update(enabled=enabled, context=context, stacks=stacks)


def _record_2_11_skipping(
    enabled: str = "all",
    context: str = "all",
    stacks: str = "all",
    skip_actions: list[str] | None = None,
) -> None:
    """2.11 as the device's (2.11.0) is: it takes ``skip_actions`` but knows no ``annotate``,
    and refuses the whole call for it (seen on the H100: PyTorch's memory went unmeasured)."""
    known = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
             "segment_map", "segment_unmap", "snapshot", "oom"}  # fmt: skip
    for action in skip_actions or ():
        if action not in known:
            raise RuntimeError(f"Unknown TraceEntry action: {action}")
    SEEN.update(enabled=enabled, context=context, stacks=stacks, skip_actions=skip_actions)


def _record_2_14(
    enabled: str = "all",
    context: str = "all",
    stacks: str = "all",
    skip_actions: list[str] | None = None,
    record_cuda: bool = True,
) -> None:
    SEEN.update(enabled=enabled, context=context, stacks=stacks, skip_actions=skip_actions)


@pytest.mark.parametrize(
    "record", [_record_2_11, _record_2_11_skipping, _record_2_14], ids=["2.11", "2.11.0", "2.14"]
)
def test_the_allocator_history_is_asked_with_the_arguments_its_release_takes(
    record: Any,
) -> None:
    observers: list[object] = []
    SEEN.clear()
    torch = SimpleNamespace(
        cuda=SimpleNamespace(memory=SimpleNamespace(_record_memory_history_impl=record)),
        _C=SimpleNamespace(_cuda_attach_out_of_memory_observer=observers.append),
    )
    tracker = SimpleNamespace(problems=[])
    allocator = TorchAllocator(tracker, torch)  # type: ignore[arg-type]
    allocator.enable()
    assert tracker.problems == [] and allocator.enabled
    assert SEEN["stacks"] == "python" and SEEN["context"] == "alloc", SEEN
    if "skip_actions" in SEEN:  # what the release knows of pyrun's list, no more
        assert "free_requested" in SEEN["skip_actions"], SEEN
    assert observers == [allocator.out_of_memory]


PYRUN = (sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", "gpu=simulated,memory")
TORCH_PROGRAM = """
import torch
from pyhpctk.measure.gpu import memory
from pyhpctk.measure.gpu.memory_hooks import TorchAllocator
tracker = memory.current()
print([type(h).__name__ for h in tracker.hooks], torch.cuda.is_initialized())
"""


def test_torch_imported_later_is_hooked_without_starting_cuda(tmp_path: Path) -> None:
    torch_path = Path("/work/torch-venv/lib/python3.11/site-packages")
    env_path = str(torch_path) if torch_path.is_dir() else ""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], env={"PYTHONPATH": env_path}, capture_output=True
    )
    if probe.returncode:
        pytest.skip("no torch here")
    program = tmp_path / "uses_torch.py"
    program.write_text(TORCH_PROGRAM)
    run = subprocess.run(
        [*PYRUN, "-o", str(tmp_path / "m"), sys.executable, str(program)],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "'TorchAllocator'] False" in run.stdout  # hooked; CUDA left to start lazily


def nccl_site(issue: Callable[[], None]) -> None:
    issue()


def workspace_site(issue: Callable[[], None]) -> None:
    issue()


def test_raw_cudamalloc_outside_the_pools_comes_from_cuptis_records(tmp_path: Path) -> None:
    """CUPTI's MEMORY2 records (ALLOC/FREE rows with their address), matched to the operations
    that asked: device memory only, a pool's own segment once (the pool's)."""
    mib = [1, 2, 2, 3, 100, 8]
    ops = np.zeros(len(mib), dtype=rec.OPERATION_DTYPE)
    ops["correlation"] = np.arange(1, len(mib) + 1)
    ops["kind"] = [act.ALLOC, act.ALLOC, act.FREE, act.ALLOC, act.ALLOC, act.ALLOC]
    ops["site"] = [0, 1, 1, 0, 0, 0]
    rows = act.empty_activities(len(mib))
    rows["kind"], rows["correlation"] = ops["kind"], ops["correlation"]
    rows["memory_kind"] = [3, 3, 3, 3, 2, 3]  # the 100 MiB are pinned host memory
    rows["start"] = rows["end"] = np.arange(1, len(mib) + 1) * 1000
    rows["bytes"] = np.array(mib) * MIB
    rows[act.ADDRESS] = [0x1000, 0x2000, 0x2000, 0x3000, 0x4000, 0x5000]
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    backend = SimulatedBackend(rec.Recording(act.DeviceLimits(), [], ops, rows, [len(mib)]))
    monitor = GpuMonitor(session, session.add_metric_kind(gm.gpu_metric_kind()), backend=backend)
    tracker = memory.MemoryTracker(session, session.add_metric_kind(memory.memory_metric_kind()))
    monitor.inside.memory = tracker
    segment = {"action": "segment_alloc", "addr": 0x5000, "size": 8 * MIB, "time_us": 6}
    tracker.take_torch({"device_traces": [[segment]]})  # PyTorch's segment at the same address
    backend.start(monitor)
    backend.replay_thread(0, (nccl_site, workspace_site))
    backend.deliver_recorded()
    shutdown(monitor, report=False)
    result = tracker.replay()
    by_function = {
        memory_files.site_frames(tracker, i)[0].split(" (")[0]: i for i in range(len(tracker.sites))
    }
    nccl, workspace = by_function["nccl_site"], by_function["workspace_site"]
    found = [
        (int(r.alloc_bytes[i]), int(r.peak[i]), int(r.at_peak[i]))
        for r in (result,)
        for i in (nccl, workspace)
    ]
    assert found == [(4 * MIB, 4 * MIB, 4 * MIB), (2 * MIB, 2 * MIB, 0)]
    assert result.peak_bytes == 4 * MIB
    assert result.timelines[0][2][-1] == 12 * MIB  # reserved: 1 + 3 raw and the 8 MiB segment


def test_cuptis_memory_records_keep_their_address() -> None:
    from pyhpctk.measure.gpu.cupti.records import convert

    layout = np.dtype(
        [
            *(("kind", "<u4"), ("memory_operation_type", "<u4"), ("memory_kind", "<u2")),
            *(("pad", "<u2", 3), ("correlation_id", "<u4"), ("timestamp", "<u8")),
            *(("bytes", "<u8"), ("address", "<u8"), ("device_id", "<u4"), ("pad2", "<u4")),
        ]
    )
    records = np.zeros(2, dtype=layout)
    records["memory_operation_type"] = [1, 2]  # CUPTI's ALLOCATION, RELEASE
    records["memory_kind"] = 3
    records["address"] = 0x7F00_0000_1000
    rows = convert(act.ALLOC, records, lambda pointer: -1)
    assert rows["kind"].tolist() == [act.ALLOC, act.FREE]
    assert rows[act.ADDRESS].tolist() == [0x7F00_0000_1000] * 2


class Tensor:
    """Stands for an array a function holds while it allocates."""


def test_tracking_keeps_no_frame_and_so_none_of_its_arrays(tmp_path: Path) -> None:
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    tracker = memory.MemoryTracker(session, session.add_metric_kind(memory.memory_metric_kind()))

    def layer() -> weakref.ref[Tensor]:
        activations = Tensor()
        tracker.allocated(memory.CUPY, 0, 0x1000, 64)
        return weakref.ref(activations)

    held = layer()
    assert held() is None  # the function returned: its arrays are freed, as without pyrun
    assert memory_files.site_frames(tracker, 0)[0].startswith("layer (")


def test_pyprof_copies_only_pyruns_memory_files_never_through_a_link_nor_over_another(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not the program's")
    secret.chmod(0o600)
    first, second, db = tmp_path / "m1" / "gpumem", tmp_path / "m2" / "gpumem", tmp_path / "db"
    for folder, text in ((first, '{"first": 1}'), (second, '{"second": 2}')):
        folder.mkdir(parents=True)
        (folder / "memory-7.json").write_text(text)  # one pid on two hosts
        (folder / "memory-7.json").chmod(0o600)
    (first / "oom-7-1.txt").symlink_to(secret)  # a hand-made measurement
    (first / "notes.txt").write_text("no file of pyrun's")
    os.mkfifo(first / "oom-7-2.txt")  # would block a plain open
    db.mkdir()
    assert copy_gpu_memory([first.parent, second.parent], db) == 2
    copied = {path.name: path for path in (db / "gpumem").iterdir()}
    assert sorted(copied) == ["memory-7-2.json", "memory-7.json"]
    assert copied["memory-7.json"].read_text() == '{"first": 1}'
    assert copied["memory-7-2.json"].read_text() == '{"second": 2}'
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in copied.values())
    assert gpu_memory.paths(db) == sorted(copied.values())  # both read back


def test_a_damaged_memory_file_is_a_warning_and_the_report_is_still_written(
    database: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "db"
    shutil.copytree(database, damaged)
    (path,) = (damaged / "gpumem").glob("memory-*.json")
    path.write_text(path.read_text()[:100])
    report = tmp_path / "report.html"
    assert pyview_main([str(damaged), "--html", str(report)]) == 0
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"warning: {path}: file: ")
    assert line.endswith(": this GPU memory timeline is left out")
    assert 'id="gpu-memory"' not in report.read_text()


def test_a_pytorch_release_not_known_is_refused_in_one_line_at_import(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "old_torch.py"
    program.write_text("import sys\nimport torch\nprint('imported', file=sys.stderr)\n")
    torch_package = tmp_path / "torch" / "__init__.py"  # found beside the program
    torch_package.parent.mkdir()
    torch_package.write_text("__version__ = '2.10.0+cu126'\n")
    assert measure_program(tmp_path / "m", program) == 0
    lines = capfd.readouterr().err.splitlines()
    refusal = (
        "pyrun: gpu memory: PyTorch 2.10.0+cu126 is not supported (supported: 2.11.x to 2.14.x; its"
        " allocator's private API may differ): PyTorch's memory is not measured"
    )
    assert lines.count(refusal) == 1
    assert lines.index(refusal) < lines.index("imported")  # said at the import


class Encoder:
    def forward(self) -> int:
        return 1  # where PyTorch's frame says the encoder allocated


class Decoder:
    def forward(self) -> int:
        return 2  # where PyTorch's frame says the decoder allocated


def test_pytorchs_frames_are_named_as_pyrun_names_the_code_that_ran(tmp_path: Path) -> None:
    """PyTorch's history names a frame (file, line, co_name): the function that ran there is
    found among those pyrun registered, so that its sites meet the sampled tree."""
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    tracker = memory.MemoryTracker(session, session.add_metric_kind(memory.memory_metric_kind()))
    for method in (Encoder.forward, Decoder.forward):  # as sampling registers code that ran
        session.functions.register(method.__code__)
    line = Decoder.forward.__code__.co_firstlineno + 1
    frames = [
        {"filename": __file__, "line": line, "name": "forward"},
        {"filename": __file__, "line": 7, "name": "<module>"},
        {"filename": "/opt/lib/never_seen.py", "line": 3, "name": "helper"},
    ]
    site = tracker.site_of_frames(frames)
    assert memory_files.site_frames(tracker, site) == [
        f"Decoder.forward ({__file__}:{line})",
        f"<module> ({__file__}:7)",
        "helper (/opt/lib/never_seen.py:3)",
    ]
    assert tracker.site_of_frames(list(frames)) == site  # the same stack, the same site


def test_pytorchs_expandable_segments_are_reserved_as_mapped(tmp_path: Path) -> None:
    """``expandable_segments:True``: PyTorch maps ranges into a segment and unmaps them."""
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    tracker = memory.MemoryTracker(session, session.add_metric_kind(memory.memory_metric_kind()))
    base = 0x7F00_0000_0000
    trace = [
        {"action": "segment_map", "addr": base, "size": 2 * MIB, "time_us": 1},
        {"action": "alloc", "addr": base, "size": MIB, "time_us": 2, "frames": []},
        {"action": "segment_map", "addr": base + 2 * MIB, "size": 4 * MIB, "time_us": 3},
        {"action": "segment_unmap", "addr": base + 2 * MIB, "size": 4 * MIB, "time_us": 4},
        {"action": "segment_free", "addr": base + 8 * MIB, "size": 0, "time_us": 5},  # unknown
    ]
    tracker.take_torch({"device_traces": [trace]})
    reserved = tracker.replay().timelines[0][2]
    assert reserved == [2 * MIB, 2 * MIB, 6 * MIB, 2 * MIB, 2 * MIB]


def test_a_process_after_exec_under_the_same_pid_overwrites_nothing(tmp_path: Path) -> None:
    """Each of two trackers of one pid (a process and the one it ``exec``'d) keeps its files."""
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    written = []
    for size in (MIB, 2 * MIB):
        tracker = memory.MemoryTracker(session, memory.memory_metric_kind())
        tracker.allocated(memory.CUPY, 0, 0x1000, size)
        written.append(memory_files.out_of_memory(tracker, 0, size))
        written.append(memory_files.write_timeline(tracker, tracker.replay()))
    names = [Path(path).name for path in written]
    pid = os.getpid()
    assert names == [
        f"oom-{pid}-1.txt",
        f"memory-{pid}.json",
        f"oom-{pid}-2.txt",
        f"memory-{pid}-2.json",
    ]
    peaks = [data.peak_bytes for data in gpu_memory.read_all(tmp_path)]
    assert sorted(peaks) == [MIB, 2 * MIB]
    assert "1.00 MiB live" in Path(written[0]).read_text()
