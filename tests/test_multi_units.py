"""Issue #22 piece by piece: torchrun's ranks, NCCL kernel names, devices in id tuples, the
communication metric, the simulated module, the overlap report and the waits across ranks."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from pyhpctk.core.communication import collective_of, is_communication
from pyhpctk.errors import UsageError
from pyhpctk.measure import naming
from pyhpctk.measure.encode import ProfileIdentity
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import install, shutdown
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.cubin import kernel_entries, synthetic_cubin
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.streams import StreamIdentity
from pyhpctk.measure.launch import launcher
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session
from pyhpctk.present.model import Timeline
from pyhpctk.present.overlap import NoOverlapError, overlap_report, render_overlap
from pyhpctk.present.synthetic import Spec, build
from pyhpctk.present.traces import gpu_idle_blame
from pyhpctk.present.waits import NOTHING_TRACED, collective_waits, render_waits

DATA = Path(__file__).parent / "data" / "gpu"
TORCHRUN = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}

# -- torchrun's ranks and launches ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        (TORCHRUN, 1),
        ({**TORCHRUN, "SLURM_PROCID": "0"}, 1),  # srun torchrun: SLURM_PROCID numbers nodes
        ({"RANK": "3", "WORLD_SIZE": "4"}, 3),  # torch.distributed env:// by a launcher of its own
        ({"RANK": "3", "WORLD_SIZE": "4", "PMI_RANK": "2"}, 2),  # an MPI launcher's word first
        ({"RANK": "3"}, None),  # RANK alone is any program's variable
        ({"TORCHELASTIC_RUN_ID": "x", "RANK": "no"}, None),
    ],
)
def test_rank_comes_from_torchrun_and_env_init(env: dict[str, str], rank: int | None) -> None:
    assert naming.rank_from_env(env) == rank


def test_torchrun_launch_keys() -> None:
    parent = os.getppid()
    assert naming.launch_key(TORCHRUN) == f"launch{parent}"  # static: the agent names it
    assert naming.launch_key_is_per_node(TORCHRUN)
    unique = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "4f2c/9"}  # --standalone, --rdzv-id
    assert naming.launch_key(unique) == "torchrun.4f2c_9"
    assert not naming.launch_key_is_per_node(unique)
    slurm = {**unique, "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}  # srun torchrun
    assert naming.launch_key(slurm) == "7.0"
    assert naming.default_output_dir(["python", "train.py"], unique) == (
        "hpctoolkit-train-measurements-torchrun.4f2c_9"
    )


def test_workers_of_one_torchrun_share_a_directory_and_the_next_launch_is_refused(
    tmp_path: Path,
) -> None:
    out = str(tmp_path / "m")
    for rank in ("0", "1"):  # both workers of one agent (this process's parent)
        launcher.prepare_output_dir(out, ("python", "train.py"), {**TORCHRUN, "RANK": rank})
    (tmp_path / "m" / "python-000000-000-0-1-0.hpcrun").write_bytes(b"")
    later = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "another"}
    with pytest.raises(launcher.OutputDirectoryError, match="another run"):
        launcher.prepare_output_dir(out, ("python", "train.py"), later)


# -- NCCL's kernel names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
            ("AllReduce", "Sum", "f32", "RING", "LL"),
        ),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            ("AllReduce", "Sum", "f32", "RING", "LL"),
        ),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_TREE_SIMPLE", ("ReduceScatter", "Sum",
                                                                    "bf16", "NVLS_TREE",
                                                                    "SIMPLE")),
        ("_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE",
         ("SendRecv", "", "", "", "")),
        ("_Z38ncclKernel_AllReduce_RING_LL_Sum_floatP11ncclDevCommmP8ncclWork",
         ("AllReduce", "Sum", "float", "RING", "LL")),
        ("ncclKernel_AllGather_RING_LL128_Sum_int8_t", ("AllGather", "Sum", "int8_t", "RING",
                                                       "LL128")),
        ("_Z13oneRankReduceI13FuncPreMulSumIfEEvPvPKvmm", ("AllReduce", "PreMulSum", "f32", "",
                                                           "")),
        ("_Z24ncclDevKernel_Generic_124ncclDevKernelArgsStorageILm4096EE",
         ("Generic", "", "", "", "")),
    ],
)  # fmt: skip
def test_nccl_kernel_names_say_the_collective(name: str, expected: tuple[str, ...]) -> None:
    found = collective_of(name)
    assert found is not None
    assert (found.operation, found.reduction, found.datatype, found.algorithm,
            found.protocol) == expected  # fmt: skip
    assert is_communication(name)


@pytest.mark.parametrize(
    "name",
    ["_Z6kernelPf", "sm90_xmma_gemm_f32f32", "_ZN2at6native18elementwise_kernelILi128EEvv", ""],
)
def test_other_kernels_are_not_communication(name: str) -> None:
    assert collective_of(name) is None and not is_communication(name)


# -- devices in stream id tuples, the simulated module, recordings ------------------------------


def test_stream_id_tuples_name_the_device() -> None:
    base = ProfileIdentity("python", "/bin/python", "", "", 3, 500, 0x1234, 42)
    kinds = [(k & 0x3FFF, p, lg) for k, p, lg in StreamIdentity(base, 11, 107, 0, 1).id_tuple()]
    assert kinds == [(1, 0x1234, 0), (4, 1, 1), (2, 3, 3), (5, 11, 11), (6, 107, 107)]


def test_the_synthetic_module_holds_every_kernel_as_a_cubin_does(tmp_path: Path) -> None:
    names = ["_Z6kernelPf", collective_name := "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "k2"]
    cubin = synthetic_cubin([*names, names[0]])
    entries = kernel_entries(cubin)
    assert list(entries) == names
    path = tmp_path / "m.gpubin"
    path.write_bytes(cubin)
    with path.open("rb") as stream:
        elf = ELFFile(stream)
        assert elf["e_machine"] == "EM_CUDA"
        symbols = {s.name: s for s in elf.get_section_by_name(".symtab").iter_symbols() if s.name}
        for name, offset in entries.items():
            section = elf.get_section(symbols[name]["st_shndx"])
            assert section.name == f".text.{name}" and section["sh_offset"] == offset
    assert collective_name in symbols


def test_recording_version_1_2_keeps_the_kernel_module_flag() -> None:
    base = rec.load(DATA / "nccl_synthetic.json")
    assert base.kernel_module
    again = rec.loads(rec.to_json(base))
    assert again.kernel_module and again.functions == base.functions
    older = json.loads((DATA / "graphs_synthetic.json").read_text())
    assert older["version"] == "1.1" and not rec.loads(json.dumps(older)).kernel_module


def test_the_two_device_fixture_is_its_base_twice(tmp_path: Path) -> None:
    """make_multi_fixture.py derive: device 1 is device 0 with the documented offsets."""
    base = rec.load(DATA / "nccl_synthetic.json")
    two = rec.load(DATA / "nccl_2dev_synthetic.json")
    assert "SYNTHETIC" in base.note and "SYNTHETIC" in two.note
    assert two.devices() == [0, 1] and len(two.activities) == 2 * len(base.activities)
    zero = two.activities[two.activities["device"] == 0]
    one = two.activities[two.activities["device"] == 1]
    assert np.array_equal(
        np.sort(zero, order="correlation"), np.sort(base.activities, order="correlation")
    )
    one = np.sort(one, order="correlation")
    zero = np.sort(zero, order="correlation")
    assert (one["correlation"] - zero["correlation"] == 1 << 28).all()
    assert (one["start"] - zero["start"] == 25_000).all()
    assert (one["context"] - zero["context"] == 10).all()
    assert (one["stream"] - zero["stream"] == 100).all()
    threads = len(base.threads())
    assert two.threads_of_device(1) == [t + threads for t in base.threads_of_device(0)]


# -- the communication metric -----------------------------------------------------------------


def _measure(tmp_path: Path, fixture: Path) -> Session:
    """Replay every thread of ``fixture`` in-process; return the session after shutdown."""
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    monitor = install(session, f"gpu=simulated,recording={fixture}")
    backend = monitor.backend
    for thread in backend.recording.threads():  # type: ignore[union-attr]
        backend.replay(thread)  # type: ignore[union-attr]
    shutdown(monitor, report=False)
    return session


def test_nccl_kernels_get_gcomm_and_other_programs_no_new_metric(tmp_path: Path) -> None:
    plain = _measure(tmp_path / "plain", Path(DEFAULT_RECORDING))
    assert gm.COMM_KIND_NAME not in [kind.name for kind in plain.kinds]
    session = _measure(tmp_path / "nccl", DATA / "nccl_synthetic.json")
    assert gm.COMM_KIND_NAME in [kind.name for kind in session.kinds]
    recording = rec.load(DATA / "nccl_synthetic.json")
    rows = recording.activities[recording.activities["kind"] == act.KERNEL]
    comm = [is_communication(recording.functions[f]) for f in rows["function"].tolist()]
    cct = session.states[threading.get_ident()].cct
    store = cct.kinds[gm.COMM_KIND_NAME]
    count = sum(store.get(node, gm.GCOMM_COUNT) for node in store.slot_of)
    seconds = sum(store.get(node, gm.GCOMM) for node in store.slot_of)
    assert count == sum(comm)
    expected = sum(int(e) - int(s) for (s, e), c in zip(rows[["start", "end"]].tolist(), comm,
                                                         strict=True) if c)  # fmt: skip
    assert seconds == pytest.approx(expected / 1e9)
    gpu = cct.kinds[gm.GPU_KIND_NAME]
    assert sum(gpu.get(node, gm.GKER_COUNT) for node in gpu.slot_of) == len(rows)
    session.finish()


# -- overlap report and waits on experiments whose answers are known by construction ---------


def _program() -> list[Spec]:
    """main → train line → {load_batch, <gpu kernel> → gemm, <gpu kernel> → NCCL, copy}."""
    kernel = Spec(
        "function",
        name="<gpu kernel>",
        module="",
        ctx_id=40,
        children=(Spec("function", name="gemm", module="/k.gpubin", ctx_id=41),),
    )
    nccl = Spec(
        "function",
        name="<gpu kernel>",
        module="",
        ctx_id=50,
        children=(
            Spec(
                "function",
                name="ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                module="/k.gpubin",
                ctx_id=51,
            ),
        ),
    )
    copy = Spec("function", name="<gpu copyin>", module="", ctx_id=60)
    sync = Spec("function", name="<gpu sync>", module="", ctx_id=70)
    load = Spec(
        "function",
        name="load_batch",
        file="t.py",
        ctx_id=30,
        children=(Spec("line", file="t.py", line=9, ctx_id=31, values={"X": (1,)}),),
    )
    line = Spec("line", file="t.py", line=3, ctx_id=3, children=(load, kernel, nccl, copy, sync))
    main = Spec("function", name="main", file="t.py", ctx_id=2, children=(line,))
    return [Spec("entry", name="main thread", ctx_id=1, children=(main,))]  # fmt: skip


def _line(profile: int, pairs: list[tuple[int, int]]) -> Timeline:
    return Timeline(
        profile,
        np.array([t for t, _ in pairs], dtype=np.uint64) + 10_000,
        np.array([c for _, c in pairs], dtype=np.uint32),
    )


def _two_ranks() -> object:
    """Rank 0 computes 0-100, joins the all-reduce at 100 (ends 300); rank 1's CPU is in
    load_batch 0-150, it computes 150-200 and joins at 200 (ends 300): rank 0 waits 100 ns,
    50 of them while rank 1's CPU loaded data and 50 while its GPU computed."""
    traces = [
        _line(1, [(0, 3), (100, 0), (400, 0)]),  # rank 0 CPU
        _line(2, [(0, 41), (100, 0), (320, 60), (330, 70), (360, 0)]),  # rank 0 compute stream
        _line(3, [(100, 51), (300, 0)]),  # rank 0 NCCL stream
        _line(4, [(0, 31), (150, 0), (400, 0)]),  # rank 1 CPU
        _line(5, [(150, 41), (250, 0)]),  # rank 1 compute, 200-250 overlapping its all-reduce
        _line(6, [(200, 51), (300, 0)]),  # rank 1 NCCL stream
    ]
    profiles = [
        (("NODE", 0), ("RANK", 0), ("THREAD", 0)),
        (("NODE", 0), ("GPUDEVICE", 0), ("RANK", 0), ("GPUCONTEXT", 1), ("GPUSTREAM", 7)),
        (("NODE", 0), ("GPUDEVICE", 0), ("RANK", 0), ("GPUCONTEXT", 1), ("GPUSTREAM", 13)),
        (("NODE", 0), ("RANK", 1), ("THREAD", 0)),
        (("NODE", 0), ("GPUDEVICE", 1), ("RANK", 1), ("GPUCONTEXT", 1), ("GPUSTREAM", 7)),
        (("NODE", 0), ("GPUDEVICE", 1), ("RANK", 1), ("GPUCONTEXT", 1), ("GPUSTREAM", 13)),
    ]
    return build(_program(), ["X"], profiles, title="two ranks", traces=traces)


def test_overlap_report_partitions_each_ranks_window() -> None:
    report = overlap_report(_two_ranks())  # type: ignore[arg-type]
    zero, one = report
    assert (zero.rank, zero.window_ns) == (0, 360)
    assert (zero.compute_ns, zero.communication_ns, zero.overlap_ns) == (100, 200, 0)
    assert (zero.copy_ns, zero.idle_ns) == (10, 50)  # 300-320 and the sync 330-360 are idle
    stream7 = zero.streams[0]
    assert (stream7.compute_ns, stream7.copy_ns, stream7.sync_ns) == (100, 10, 30)
    assert (one.rank, one.start_ns, one.window_ns) == (1, 10_150, 150)
    assert (one.compute_ns, one.communication_ns, one.overlap_ns) == (50, 50, 50)
    assert one.communication_kernel_ns == 100 and one.overlap_share == 0.5
    out = io.StringIO()
    render_overlap(report, out)
    assert "rank 1: window 0.000000s" in out.getvalue()
    assert "50.0% of it overlapped with compute" in out.getvalue()


def test_waits_blame_the_late_ranks_cpu_and_gpu_work() -> None:
    waits = collective_waits(_two_ranks())  # type: ignore[arg-type]
    assert waits.instances == 1 and waits.wait_ns == 100
    assert waits.by_rank == ((1, 100.0),)
    assert {(r, where, what): v for r, where, what, v in waits.by_cause} == {
        (1, "cpu", "load_batch"): 50.0,
        (1, "gpu", "gemm"): 50.0,
    }
    out = io.StringIO()
    render_waits(waits, out)
    assert "rank 1 arrived last: 0.000000s (100.0%)" in out.getvalue()
    assert NOTHING_TRACED not in out.getvalue()


def test_idle_blame_keeps_each_rank_to_its_own_threads() -> None:
    """Rank 1's GPU is idle 0-150 while rank 1's CPU is in load_batch: blamed. Rank 0's GPU is
    busy then (taken together, as before issue #22, no instant had every stream idle while a
    CPU was busy, and load_batch got nothing); rank 0's GPU idles only after its CPU did."""
    blame = gpu_idle_blame(_two_ranks())  # type: ignore[arg-type]
    assert blame.by_function == (("load_batch", 150.0),)
    assert blame.blamed_ns == 150


def test_overlap_needs_gpu_streams() -> None:
    cpu_only = build(_program(), ["X"], [(("THREAD", 0),)], traces=[_line(1, [(0, 3), (9, 0)])])
    with pytest.raises(NoOverlapError, match="no GPU stream"):
        overlap_report(cpu_only)
    assert isinstance(NoOverlapError("x"), UsageError)
    assert collective_waits(cpu_only).instances == 0
