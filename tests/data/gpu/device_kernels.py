"""Issue #34's remaining items on the device, one PASS/FAIL line a check (run by device_kernels.sh).

    python3 tests/data/gpu/device_kernels.py OUT

An unchanged program (OUT/work/app.py) launches a Triton kernel with a data-dependent loop
(``trips``, 3 launches, from line TRITON_LINE) and a ``torch.compile``d model (3 calls, from
line COMPILED_LINE; ``TORCH_COMPILE_THREADS=1``, a fresh Inductor cache, so Inductor compiles its
Triton kernels in the process, through ``triton.compile``). Under pyrun:

1. ``-e gpu=nvidia,trace``: pyrun's status, its summary, pyview ``--warps`` naming ``trips``
   and Inductor's kernels, the Perfetto export's per-SM/warp-slot tracks;
2. ``-e gpu=nvidia,blocks=warps``: the warp metrics (``GPTX:BLK_WARP``) of ``trips``, its 3
   counted launches, and the line that launched it above it;
3. the same run: Inductor's ``triton_*`` kernels counted (``GPTX:BLK`` > 0) under the model
   call's line of app.py (item 4).

Each step's log is OUT/<step>.txt.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

APP = """
import sys
import torch
import triton
import triton.language as tl


@triton.jit
def trips(x_ptr, t_ptr, y_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(x_ptr + offs)
    for _ in range(tl.load(t_ptr + pid)):
        acc = acc * 1.5 + 1.0
    tl.store(y_ptr + offs, acc)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 256)

    def forward(self, x):
        return torch.softmax(self.b(torch.nn.functional.gelu(self.a(x))) * 2.0 + x, dim=-1)


def main():
    torch.manual_seed(34)
    x = torch.randn(64 * 128, device="cuda")
    t = torch.arange(64, device="cuda", dtype=torch.int32) % 9
    y = torch.zeros_like(x)
    for _ in range(3):
        trips[(64,)](x, t, y, BLOCK=128, num_warps=4)  # TRITON_LINE
    model = torch.compile(Model().cuda())
    inp = torch.randn(1024, 256, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            out = model(inp)  # COMPILED_LINE
    torch.cuda.synchronize()
    print("checksum", float(y.sum()), float(out.sum()))


main()
"""
TRITON_LINE = next(i for i, s in enumerate(APP.splitlines(), 1) if "# TRITON_LINE" in s)
COMPILED_LINE = next(i for i, s in enumerate(APP.splitlines(), 1) if "# COMPILED_LINE" in s)
CHECKS: list[tuple[str, bool]] = []


def check(what: str, ok: bool, detail: object = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}{f': {detail}' if detail != '' else ''}", flush=True)
    CHECKS.append((what, ok))


def run(out: Path, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=80, check=False
        )
        status, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        status, text = 124, f"timeout: {error}"
    (out / f"{name}.txt").write_text(text)
    print(f"== {name}: status {status} in {time.monotonic() - began:.1f} s", flush=True)
    return status, text


def rows(csv_text: str) -> list[dict[str, str]]:
    start = csv_text.find("id,parent")
    return list(csv.DictReader(io.StringIO(csv_text[start:]))) if start >= 0 else []


def ancestors(table: list[dict[str, str]], row: dict[str, str]) -> list[dict[str, str]]:
    by_id = {r["id"]: r for r in table}
    out = []
    while row["parent"] in by_id:
        row = by_id[row["parent"]]
        out.append(row)
    return out


def number(row: dict[str, str], metric: str) -> float:
    value = next((v for k, v in row.items() if k and k.startswith(metric)), "") or "0"
    try:
        return float(value)
    except ValueError:
        return 0.0


def measure(out: Path, work: Path, env: dict[str, str], name: str, event: str) -> Path:
    shutil.rmtree(work / f"ind_{name}", ignore_errors=True)
    env = dict(
        env,
        TORCHINDUCTOR_CACHE_DIR=str(work / f"ind_{name}"),
        TRITON_CACHE_DIR=str(work / f"tc_{name}"),
    )
    measurement, database = work / f"m_{name}", work / f"db_{name}"
    py = sys.executable
    status, text = run(
        out,
        f"pyrun_{name}",
        [py, "-m", "pyhpctk.cli.pyrun", "-e", event, "-o", str(measurement), py, "app.py"],
        env,
        work,
    )
    check(
        f"{name}: pyrun status 0 and the program's output",
        status == 0 and "checksum" in text,
        status,
    )
    status, _ = run(
        out,
        f"pyprof_{name}",
        [py, "-m", "pyhpctk.cli.pyprof", "--no-sources", "-o", str(database), str(measurement)],
        env,
        work,
    )
    check(f"{name}: pyprof status 0", status == 0, status)
    return database


def traced(out: Path, work: Path, env: dict[str, str]) -> None:
    database = measure(out, work, env, "trace", "gpu=nvidia,trace")
    py = [sys.executable, "-m", "pyhpctk.cli.pyview"]
    status, text = run(out, "pyview_warps", [*py, str(database), "--warps"], env, work)
    check("trace: pyview --warps shows trips' warps", status == 0 and "trips" in text, status)
    check("trace: pyview --warps shows Inductor's kernels", "triton_" in text)
    export = work / "perfetto.json"
    status, _ = run(
        out, "pyview_perfetto", [*py, str(database), "--trace-export", str(export)], env, work
    )
    names = json.dumps(json.loads(export.read_text())) if export.exists() else ""
    check(
        "trace: the Perfetto export has per-SM warp-slot tracks",
        status == 0 and "warps" in names and "warp slot" in names,
        status,
    )


def counted(out: Path, work: Path, env: dict[str, str]) -> None:
    database = measure(out, work, env, "warps", "gpu=nvidia,blocks=warps")
    argv = [sys.executable, "-m", "pyhpctk.cli.pyview", str(database), "--full", "--csv", "-"]
    for metric in ("GPTX:BLK", "GPTX:BLK_WARP", "GPTX:COUNT"):
        argv += ["-m", metric]
    _, text = run(out, "pyview_warps_csv", argv, env, work)
    table = rows(text)
    kernels = [r for r in table if r["kind"] == "function" and r["scope"] == "trips"]
    check("warps: trips has a row", bool(kernels), len(table))
    if kernels:
        top = kernels[0]
        check(
            "warps: trips' 3 launches counted",
            number(top, "GPTX:COUNT") == 3,
            number(top, "GPTX:COUNT"),
        )
        check(
            "warps: trips' warp executions (GPTX:BLK_WARP) shown",
            number(top, "GPTX:BLK_WARP") > 0,
            number(top, "GPTX:BLK_WARP"),
        )
        lines = {int(a["line"] or 0) for a in ancestors(table, top) if a["file"].endswith("app.py")}
        check("warps: trips under its launch line", TRITON_LINE in lines, sorted(lines))
    inductor = [
        r
        for r in table
        if r["kind"] == "function"
        and r["scope"].startswith("triton_")
        and number(r, "GPTX:BLK") > 0
    ]
    check(
        "torch.compile: Inductor's Triton kernels counted",
        bool(inductor),
        sorted({r["scope"] for r in inductor})[:6],
    )
    under = [
        r
        for r in inductor
        if any(
            a["file"].endswith("app.py") and a["line"] == str(COMPILED_LINE)
            for a in ancestors(table, r)
        )
    ]
    check(
        "torch.compile: its kernels under the model call's line",
        bool(under) and len(under) == len(inductor),
        f"{len(under)} of {len(inductor)}",
    )


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    (work / "app.py").write_text(APP)
    env = dict(
        os.environ, TORCH_COMPILE_THREADS="1", PYTHONUNBUFFERED="1", TRITON_DEFAULT_FP_FUSION="1"
    )
    for step in (traced, counted):
        try:
            step(out, work, env)
        except Exception as error:
            check(f"{step.__name__}: ran", False, repr(error)[:300])
    failed = [w for w, ok in CHECKS if not ok]
    print(f"{len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
