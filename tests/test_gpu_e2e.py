"""``pyrun -e gpu=nvidia -t`` → ``pyprof`` on a real GPU: CuPy and PyTorch programs (issue #6).

Marked ``gpu``: CI deselects these; they run on the device machine
(``tests/data/gpu/device_session.sh``). Expected values come from the programs themselves: the
launch counts and byte counts they issue, and for PyTorch the kernel count ``torch.profiler``
sees for the same steps in a separate run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyhpctk.analysis import pipeline
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.cli.main import main as pyhpctk_main
from pyhpctk.present.api import open_database

pytestmark = pytest.mark.gpu

CUPY_PROGRAM = textwrap.dedent(
    """\
    import sys
    import cupy as cp
    import numpy as np

    launches = int(sys.argv[1])
    x = cp.ones(1024, dtype=cp.float32)
    host = np.ones(1 << 20, dtype=np.float32)
    cp.cuda.Device().synchronize()
    for _ in range(launches):
        x = x * 1.0001  # LAUNCH
    for _ in range(3):
        device = cp.asarray(host)  # H2D
        back = cp.asnumpy(device)  # D2H
    cp.cuda.Device().synchronize()  # SYNC
    """
)

TORCH_PROGRAM = textwrap.dedent(
    """\
    import json
    import sys
    import torch

    def main(steps):
        layers = [torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)]
        model = torch.nn.Sequential(*layers).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.randn(64, 256, device="cuda")
        target = torch.randint(0, 8, (64,), device="cuda")
        for _ in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)  # FORWARD
            loss.backward()  # BACKWARD
            optimizer.step()  # OPTIMIZER
        torch.cuda.synchronize()

    steps, mode = int(sys.argv[1]), sys.argv[2]
    torch.zeros(1)  # CPU only: CUDA starts inside the measured region
    if mode == "profile":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            main(steps)
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = [n for n in names if not n.startswith(("Memcpy", "Memset"))]
        print(json.dumps({"kernels": len(kernels), "names": sorted(set(kernels))}))
    else:
        main(steps)
    """
)


def _line(source: str, marker: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def _values(db: Path, name: str, metric: str) -> dict[str, float]:
    """Inclusive ``metric`` per ``file: line`` label of ``name``, and the program total."""
    arrays = open_database(db).arrays([metric])
    out: dict[str, float] = {"<total>": float(arrays[f"{metric} (I)"][0])}
    for label, value in zip(arrays["label"], arrays[f"{metric} (I)"], strict=True):
        # pyview names a file by its path below the program's root, which other files of the
        # run move (on the device, wheels installed with --target under /tmp): the basename
        # decides, and the key is ``name: line``.
        path, _, line = str(label).rpartition(": ")
        if path.rsplit("/", 1)[-1] == name:
            key = f"{name}: {line}"
            out[key] = out.get(key, 0.0) + float(value)
    return out


def _measure(
    tmp_path: Path, source: str, name: str, *args: str, hook: str = "c"
) -> tuple[Path, str]:
    program = tmp_path / name
    program.write_text(source)
    out = tmp_path / "m"
    pyrun = [
        sys.executable,
        "-c",
        "import sys; from pyhpctk.cli.pyrun import main; sys.exit(main())",
    ]
    run = subprocess.run(
        [
            *pyrun,
            "-t",
            "-e",
            f"gpu=nvidia,hook={hook}",
            "-o",
            str(out),
            sys.executable,
            str(program),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    db = tmp_path / "db"
    pipeline.run(ProfOptions.build([str(out)], output=str(db)))
    assert pyhpctk_main(["verify", str(db)]) == 0
    assert (db / "trace.db").exists()
    return db, run.stderr


def test_cupy_program_counts_bytes_and_lines(tmp_path: Path) -> None:
    launches = 5000
    db, stderr = _measure(tmp_path, CUPY_PROGRAM, "cupy_prog.py", str(launches))
    assert "without a known operation" not in stderr, stderr
    assert "lost" not in stderr, stderr
    launch = f"cupy_prog.py: {_line(CUPY_PROGRAM, '# LAUNCH')}"
    h2d = f"cupy_prog.py: {_line(CUPY_PROGRAM, '# H2D')}"
    d2h = f"cupy_prog.py: {_line(CUPY_PROGRAM, '# D2H')}"
    assert _values(db, "cupy_prog.py", "GKER:COUNT")[launch] == launches
    assert _values(db, "cupy_prog.py", "GXCOPY:H2D (B)")[h2d] == 3 * 4 * (1 << 20)
    assert _values(db, "cupy_prog.py", "GXCOPY:D2H (B)")[d2h] == 3 * 4 * (1 << 20)
    traces = [p for p in (tmp_path / "m").glob("*.hpctrace") if int(p.name.split("-")[2]) >= 500]
    assert traces, "one trace per GPU stream"


def test_torch_training_steps_match_torch_profiler(tmp_path: Path) -> None:
    steps = 20
    program = tmp_path / "torch_prog.py"
    program.write_text(TORCH_PROGRAM)
    reference = subprocess.run(
        [sys.executable, str(program), str(steps), "profile"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    expected = json.loads(reference.stdout.strip().splitlines()[-1])
    assert expected["kernels"] >= 5 * steps
    db, stderr = _measure(tmp_path, TORCH_PROGRAM, "torch_prog.py", str(steps), "plain")
    counts = _values(db, "torch_prog.py", "GKER:COUNT")
    assert counts["<total>"] == expected["kernels"], (counts, expected, stderr)
    forward = f"torch_prog.py: {_line(TORCH_PROGRAM, '# FORWARD')}"
    optimizer = f"torch_prog.py: {_line(TORCH_PROGRAM, '# OPTIMIZER')}"
    assert counts[forward] > 0 and counts[optimizer] > 0
    assert "without a known operation" not in stderr, stderr


def test_the_python_hook_measures_too(tmp_path: Path) -> None:
    """hook=python (cupti-python's callbacks) is the fallback where the C hook is not built."""
    db, stderr = _measure(tmp_path, CUPY_PROGRAM, "cupy_prog.py", "300", hook="python")
    launch = f"cupy_prog.py: {_line(CUPY_PROGRAM, '# LAUNCH')}"
    assert _values(db, "cupy_prog.py", "GKER:COUNT")[launch] == 300, stderr
