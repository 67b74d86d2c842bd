"""GPU metric table, GPU binaries, recordings and the ``gpu=`` event syntax."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from pyhpctk.errors import FormatError, FormatWarning, UsageError
from pyhpctk.formats import hpcrun
from pyhpctk.measure.gpu import GpuSpec, parse_gpu_event
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.cubin import gpubin_name, kernel_entries, save_gpubin
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.gpu.simulated import recording as rec

FIXTURE = Path(DEFAULT_RECORDING)
MEAS = "meas/loops-cuda-nvidia-t.m"


def _reference_profile(reference: Path) -> hpcrun.HpcrunProfile:
    path = next((reference / MEAS).glob("*-000-*.hpcrun"))
    return hpcrun.read(path)


def test_metric_table_is_hpcruns_name_for_name_flag_for_flag(reference: Path) -> None:
    profile = _reference_profile(reference)
    assert len(gm.GPU_METRICS) == len(profile.metrics)
    for ours, theirs in zip(gm.GPU_METRICS, profile.metrics, strict=True):
        assert (ours.name, ours.description, ours.flags(), ours.period) == (
            theirs.name,
            theirs.description,
            theirs.flags,
            theirs.period,
        )
        assert (ours.formula, ours.format) == (theirs.formula, theirs.format)


def test_reference_kernel_values_satisfy_the_accumulator_formulas(reference: Path) -> None:
    # The visible per-kernel metrics are ACUMU / COUNT: check our indices against hpcrun's data.
    profile = _reference_profile(reference)
    _, metrics, values = hpcrun.decoded_values(profile)
    by_metric = dict(zip(metrics.tolist(), values.tolist(), strict=True))
    count = by_metric[gm.GKER_COUNT]
    assert count > 0 and by_metric[gm.GKER] == by_metric[gm.GPUOP]
    formula = gm.GPU_METRICS[gm.metric_index("GKER:BLK_THR")].formula
    assert formula == f"#{gm.GKER_BLK_THR_ACUMU}/#{gm.GKER_COUNT}"
    assert by_metric[gm.GKER_BLK_THR_ACUMU] % count == 0  # a static property summed per launch


def test_kernel_entries_match_pyelftools_on_the_reference_gpubin(reference: Path) -> None:
    gpubin = next((reference / MEAS / "gpubins").glob("*.gpubin"))
    data = gpubin.read_bytes()
    with gpubin.open("rb") as stream:
        elf = ELFFile(stream)
        expected = {
            section.name[len(".text.") :]: section["sh_offset"]
            for section in elf.iter_sections()
            if section.name.startswith(".text.")
        }
    assert expected and kernel_entries(data) == expected
    assert gpubin_name(data) == gpubin.name  # hpcrun names a gpubin by its content's md5


def test_gpubins_are_saved_once_under_their_hash(tmp_path: Path, reference: Path) -> None:
    data = next((reference / MEAS / "gpubins").glob("*.gpubin")).read_bytes()
    first = save_gpubin(str(tmp_path), data)
    assert save_gpubin(str(tmp_path), data) == first
    assert Path(first).read_bytes() == data
    assert [p.name for p in (tmp_path / "gpubins").iterdir()] == [gpubin_name(data)]


@pytest.mark.parametrize(
    ("mutate", "section"),
    [
        (lambda b: b"\x7fXLF" + b[4:], "ELF header"),
        (lambda b: b[:40], "ELF header"),
        (lambda b: b[:0x28] + (10**9).to_bytes(8, "little") + b[0x30:], "ELF section table"),
    ],
)
def test_bad_gpu_binaries_raise_format_errors(
    reference: Path, mutate: object, section: str
) -> None:
    data = next((reference / MEAS / "gpubins").glob("*.gpubin")).read_bytes()
    with pytest.raises(FormatError, match=section):
        kernel_entries(mutate(data), "x.gpubin")  # type: ignore[operator]


def test_occupancy_is_limited_by_the_scarcest_resource() -> None:
    limits = act.DeviceLimits(
        max_threads_per_sm=2048, max_blocks_per_sm=32, registers_per_sm=65536, shared_per_sm=102400
    )
    kernels = act.empty_activities(4)
    kernels["block_threads"] = [32, 256, 256, 1024]
    kernels["registers"] = [16, 128, 32, 32]
    kernels["static_smem"] = [0, 0, 40000, 0]
    active, maximum = act.occupancy(kernels, limits)
    # 1-warp blocks: 32 blocks max; 128 regs x 256 threads: 2 blocks; 40 kB smem: 2 blocks;
    # 1024 threads x 32 regs: 2 blocks by registers and by threads.
    assert maximum.tolist() == [64, 64, 64, 64]
    assert active.tolist() == [32, 16, 16, 64]


def test_the_recorded_fixture_loads_and_round_trips() -> None:
    recording = rec.load(FIXTURE)
    assert len(recording.operations) > 0 and len(recording.activities) > 0
    assert set(recording.threads()) == {0, 1}
    assert sum(recording.buffers) == len(recording.activities)
    kinds = set(recording.activities["kind"].tolist())
    assert {act.KERNEL, act.COPY, act.MEMSET, act.ALLOC, act.FREE, act.SYNC} <= kinds
    again = rec.loads(rec.to_json(recording))
    assert np.array_equal(again.activities, recording.activities)
    assert np.array_equal(again.operations, recording.operations)
    assert again.functions == recording.functions
    assert FIXTURE.stat().st_size < 200_000


def _document() -> dict[str, object]:
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("edit", "section"),
    [
        (lambda d: d.update(format="something else"), "header"),
        (lambda d: d.update(version="2.0"), "header"),
        (lambda d: d["activities"].update(start=[1]), "activities"),
        (lambda d: d["activities"].update(kind=["warp"] * len(d["activities"]["kind"])), "kind"),
        (lambda d: d.update(buffers=[1]), "buffers"),
        (lambda d: d.pop("functions"), "header"),
    ],
)
def test_bad_recordings_raise_format_errors_naming_the_section(edit: object, section: str) -> None:
    document = _document()
    edit(document)  # type: ignore[operator]
    with pytest.raises(FormatError, match=section):
        rec.loads(json.dumps(document), "bad.json")
    with pytest.raises(FormatError, match="json"):
        rec.loads(b"\xff{", "bad.json")


def test_a_newer_minor_recording_version_is_a_warning() -> None:
    document = _document()
    document["version"] = "1.9"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec.loads(json.dumps(document))
    assert any(issubclass(w.category, FormatWarning) for w in caught)


def test_gpu_events_use_hpcruns_syntax() -> None:
    assert parse_gpu_event("gpu=nvidia") == GpuSpec("nvidia")
    assert parse_gpu_event("GPU=AMD") == GpuSpec("amd")
    spec = parse_gpu_event("gpu=simulated,recording=/x.json,buffer=64")
    assert spec.backend == "simulated" and spec.option("recording") == "/x.json"
    assert spec.int_option("buffer", 0) == 64 and spec.int_option("pending", 7) == 7
    assert str(spec) == "gpu=simulated,recording=/x.json,buffer=64"
    with pytest.raises(UsageError, match="unknown GPU backend"):
        parse_gpu_event("gpu=intel")
    with pytest.raises(UsageError, match="bad GPU event"):
        parse_gpu_event("gpu=")
    with pytest.raises(UsageError, match="not a number"):
        parse_gpu_event("gpu=simulated,buffer=many").int_option("buffer", 1)


def test_gpu_specs_travel_whole_in_pyruns_options() -> None:
    from pyhpctk.measure.gpu import is_gpu_event
    from pyhpctk.measure.launch.config import MeasureOptions

    spec = parse_gpu_event("gpu=simulated,recording=/data/run.json,buffer=4")
    env: dict[str, str] = {}
    MeasureOptions("/tmp/x", gpu=str(spec)).export(env)
    arrived = MeasureOptions.from_env(env)
    assert arrived is not None and parse_gpu_event(arrived.gpu) == spec
    assert MeasureOptions("/tmp/x").gpu == ""
    assert is_gpu_event(" GPU=nvidia") and not is_gpu_event("CPUTIME@5000")
