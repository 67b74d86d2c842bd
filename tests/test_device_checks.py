"""The device scripts' own checks (tests/data/gpu), on what a device run gives them but made here:
a check that is wrong fails a device run that measured right (issue #37's device round), or
passes one that did not.

- ``window_check.py`` (item 3): the kernels of a window of a long job are the database's, every
  thread's: a training step's backward kernels are launched by autograd's thread, which runs no
  slot function; kernels leaked from outside the window fail it.
- ``ranges_device.py`` (item 1): torch.profiler's kernels of a module are its ops' kernels, not
  the ``record_function``'s own GPU user annotation (listed among the range's kernels under the
  range's name); pyrun's kernels under a module's range, by thread and name, from the
  database's whole tree, are what the program launched there (the PyTorch stand-in on the
  simulated GPU).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.present import api

GPU_DATA = Path(__file__).resolve().parent / "data" / "gpu"
SECOND = 1_000_000_000
#: The window job's step as the device ran it: 8 kernels launched by the main thread (forward,
#: loss, optimizer), 11 by autograd's (backward)
FORWARD, BACKWARD = 8, 11


class WindowDatabase:
    """What ``open_database`` gives window_check.py: the root, the main thread with the slots
    the window overlapped, autograd's thread (no slot frame), and ``leaked`` kernels of steps
    outside the window on the main thread, in no slot."""

    def __init__(self, steps_by_slot: dict[int, int], leaked: int = 0) -> None:
        self.metric_names = ["REALTIME (sec)", "GKER:COUNT"]
        steps = sum(steps_by_slot.values())
        rows = [
            ("python3", 0.0, 0.0),  # the root: filled below
            ("main thread", 0.0, steps * FORWARD + leaked),
            *(
                (f"window_job.py: slot_{slot:03d}", count * 0.02, count * FORWARD)
                for slot, count in steps_by_slot.items()
            ),
            ("autograd thread", 0.0, steps * BACKWARD),
            ("<GPU kernel> volta_sgemm_128x64_nn", 0.0, steps),  # a kernel's own row
        ]
        seconds = sum(row[1] for row in rows)
        kernels = steps * (FORWARD + BACKWARD) + leaked
        rows[0] = ("python3", seconds, kernels)
        self.rows = rows

    def arrays(self, metrics: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"label": np.array([row[0] for row in self.rows], dtype=object)}
        for column, name in ((1, "REALTIME (sec)"), (2, "GKER:COUNT")):
            if name in metrics:
                out[f"{name} (I)"] = np.array([float(row[column]) for row in self.rows])
        return out


def window_check(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    database: WindowDatabase,
) -> tuple[int, str]:
    """window_check.py run as device_window.sh runs it on a 30-second window from 225 s to
    255 s of a job of 10-second slots and a step every 20 ms (slots 22 to 25)."""
    slots = [(i * 10 * SECOND, (i + 1) * 10 * SECOND) for i in range(30)]
    steps = [list(range(start, end, SECOND // 50)) for start, end in slots]
    log = tmp_path / "log.json"
    log.write_text(json.dumps({"slots": slots, "steps": steps}))
    monkeypatch.setattr(api, "open_database", lambda path: database)
    argv = [str(GPU_DATA / "window_check.py"), "db", str(log)]
    monkeypatch.setattr(sys, "argv", [*argv, str(225 * SECOND), str(255 * SECOND), "19"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(argv[0], run_name="__main__")
    return int(exit_.value.code or 0), capsys.readouterr().out


#: the window's 1500 steps, by the slot each started in
WINDOW_STEPS = {22: 250, 23: 500, 24: 500, 25: 250}


def test_the_window_check_counts_the_kernels_of_every_thread(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The device's window (30.3 s of 30.7 in the slots, every kernel kept) was failed for the
    backward kernels autograd's thread launched outside the slots."""
    failures, out = window_check(monkeypatch, capsys, tmp_path, WindowDatabase(WINDOW_STEPS))
    assert "FAIL" not in out and failures == 0, out
    assert "PASS: kernels 28500 (all threads), the window's 1500 steps x 19 = 28500" in out


def test_the_window_check_fails_kernels_from_outside_the_window(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Kernels of the steps before the window (pyrun kept what it should have left out) in no
    slot's context: only the whole database's count sees them."""
    database = WindowDatabase(WINDOW_STEPS, leaked=20 * 1500 * 19)
    failures, out = window_check(monkeypatch, capsys, tmp_path, database)
    assert failures == 1, out
    assert "FAIL: kernels 598500 (all threads), the window's 1500 steps x 19 = 28500" in out


def ranges_device() -> dict[str, Any]:
    return runpy.run_path(str(GPU_DATA / "ranges_device.py"), run_name="ranges_device")


def event(
    name: str, kernels: tuple[str, ...] = (), children: tuple[Any, ...] = (), **more: Any
) -> Any:
    found = [SimpleNamespace(name=kernel) for kernel in kernels]
    fields = {"sequence_nr": -1, "is_user_annotation": False, **more}
    return SimpleNamespace(name=name, kernels=found, cpu_children=list(children), **fields)


def test_torch_profilers_count_of_a_module_leaves_out_its_ranges_gpu_annotation() -> None:
    """As torch.profiler (kineto) gives a step of ``fc``: the TARGET range's event lists its
    GPU user annotation (named as the range) among its kernels, beside the addmm's gemm and
    a bias copy; the backward node of the addmm runs two gemms and a reduction."""
    script = ranges_device()
    gemm, reduce = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "reduce_kernel"
    target = "TARGET fc (Linear)"
    addmm = event("aten::addmm", (gemm, "Memcpy DtoD (Device -> Device)"), sequence_nr=7)
    step = [
        event(target, (target,), (event("aten::linear", (), (addmm,)),), is_user_annotation=True),
        event(
            "autograd::engine::evaluate_function: AddmmBackward0",
            (),
            (event("aten::mm", (gemm,)), event("aten::mm", (gemm,)), event("aten::sum", (reduce,))),
            sequence_nr=7,
        ),
        event(
            "autograd::engine::evaluate_function: ReluBackward0",
            (),
            (event("aten::threshold_backward", ("elementwise_kernel",)),),
            sequence_nr=6,
        ),
    ]
    events = [*step, *step, *step]  # three steps
    # (the events' list holds every event; walk() finds the children from the tops)
    ranges = script["range_names"](events)
    counts = script["profiler_counts"](
        events, "fc (Linear)", lambda e: script["kernel_names"](e, ranges)
    )
    assert (counts["forward"], counts["backward"], counts["total"]) == (3, 9, 12)
    assert counts["forward_kernels"] == {gemm: 3} and counts["forward_per_call"] == [1, 1, 1]
    assert counts["backward_kernels"] == {gemm: 6, reduce: 3}


def test_kernel_names_of_both_sides_match_without_void_parameters_and_gpubin() -> None:
    key = ranges_device()["kernel_key"]
    template = "at::native::elementwise_kernel<128, 2, (anonymous namespace)::f<float> >"
    assert key(f"void {template}(int, float (*)(float))") == template  # CUPTI's, kineto's
    assert key(f"{template}(int, float (*)(float)) [3fa9.gpubin]") == template  # pyrun's
    assert key("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n") == "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n"


def test_pyruns_kernels_under_a_modules_range_by_thread_and_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ranges_device.py's check lists pyrun's kernels under each target module: the stand-in
    model's, whose truth the program writes (forward on the main thread, backward on the
    worker thread)."""
    programs = Path(__file__).resolve().parent / "programs"
    monkeypatch.setenv("PYTHONPATH", str(programs / "fake_torch"))
    truth_file, out, database = tmp_path / "truth.json", tmp_path / "m", tmp_path / "db"
    command = ["--ranges", "-e", "gpu=simulated", "-o", str(out), sys.executable]
    assert pyrun_main([*command, str(programs / "ranges_model.py"), str(truth_file), "3"]) == 0
    run(ProfOptions.build([out], output=database))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    script = ranges_device()
    labels = {"fc1 (Linear)", "act (ReLU)", "fc2 (Linear)"}
    found = script["PyrunKernels"](str(database)).under(labels)
    truth = json.loads(truth_file.read_text())["kernels"]
    for label in labels:
        threads: dict[str, Counter[str]] = found[label]
        assert sum(names.total() for names in threads.values()) == truth[label], (label, found)
        assert "main thread" in threads, (label, found)  # the forward pass
        assert len(threads) == 2, (label, found)  # and the backward's worker thread
    # where pyrun has kernels of a name, by range (the placeholder's name here: no gpubin)
    elsewhere = script["PyrunKernels"](str(database)).elsewhere({"<gpu kernel>"})
    assert elsewhere["<gpu kernel>", "fc1 (Linear)"] == truth["fc1 (Linear)"], elsewhere
    assert sum(elsewhere.values()) == sum(truth.values()), (elsewhere, truth)
    counted = script["pyrun_counts"](str(database))  # pyview --ranges: the same totals
    assert {label: counted[label] for label in labels} == {label: truth[label] for label in labels}
