"""Fuzzing every file format: corrupted files are refused in one line or read cleanly.

Each example takes a real measurement directory (HPCToolkit's ``small.m`` plus Python frames and a
``logical/`` file our writer wrote, a ``threads/`` file, a ``modules/`` file and a
``kernel_symbols/`` copy) or
database (``small.d`` with its ``metrics/default.yaml`` and a ``threads.txt``), corrupts one file
of it (truncation,
byte flips, inserted and deleted bytes, and id, count and offset fields set to absurd values:
0xFFFFFFFF, offsets far past the end, counts that would allocate terabytes) and runs ``pyhpctk
verify`` and ``pyhpctk dump`` on the directory and on the file, and the library readers on the
file (every lazy block made). Each must answer with its exit status and one-line messages (the
typed :class:`~pyhpctk.errors.FormatError`) or a clean read; never a traceback, never a hang
(each example has a time budget), never a MemoryError (the address space is capped a little
above what the process uses, so a giant allocation fails at once instead of swapping), never a
write (the examples run in their own directory, which must be unchanged afterwards).
``pyprof`` is run on a few fuzzed measurement directories the same way, and ``pyview`` (the reader
of ``metrics/default.yaml``, ``threads.txt`` and ``trace.db``) on databases whose one of these is
fuzzed.

The examples are derandomized, so CI always runs the same ones. To hunt for bugs, raise the count
and pick a seed (run niced, it takes a while)::

    PYHPCTK_FUZZ_EXAMPLES=3000 PYHPCTK_FUZZ_SEED=7 nice -n 10 pytest tests/test_fuzz_formats.py
"""

from __future__ import annotations

import contextlib
import io
import lzma
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fuzz_helpers import memory_cap, snapshot, time_budget
from pyhpctk import formats
from pyhpctk.cli.main import main as pyhpctk
from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pyview import main as pyview
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcrun, hpcstruct, logical, metadb, modules, threads
from pyhpctk.formats.elf_identity import FileIdentity
from pyhpctk.formats.hpcrun_model import CCT_NODE_DTYPE, LoadModule
from pyhpctk.formats.inspect import format_of_file

SMALL_STEM = "testmeas-small-000000-000-11ac0300-5560-0"
GPU_STEM = "testmeas-loops-cuda-000000-{}-590a0502-3293-0"
GPU_STRUCT = "structs/1165a3eeddeea5ea3616d1cdbc6faa59.gpubin-gpucfg-yes.hpcstruct"
LOGICAL = "logical/python.0badf00d"
NAMES = "threads/5560.0badf00d.txt"
MODULES = "modules/5560.0badf00d.txt"
KALLSYMS = "kernel_symbols/vmlinux.11ac0300"
KALLSYMS_TEXT = b"ffffffff81000000 T _stext\nffffffff81001000 t do_syscall_64\n" * 8
# (seed, format) -> (seed directory, the file of it to corrupt, the byte order of its binary
# fields, how many leading bytes are its magic and version). Seed "small": HPCToolkit's small.m
# with Python frames, and small.d; seed "gpu": loops-cuda-nvidia-t (a CPU thread with GPU
# metrics, a GPU stream, its trace, a +gpucfg structure of the cubin), the .m and the .d.
TARGETS: dict[tuple[str, str], tuple[str, str, str, int]] = {
    ("small", "hpcrun"): ("meas", SMALL_STEM + ".hpcrun", ">", 24),
    ("small", "hpctrace"): ("meas", SMALL_STEM + ".hpctrace", ">", 24),
    ("small", "logical"): ("meas", LOGICAL, ">", 10),
    ("small", "hpcstruct"): ("meas", "structs/testmeas-small.hpcstruct", ">", 22),
    ("small", "threads"): ("meas", NAMES, ">", 18),
    ("small", "modules"): ("meas", MODULES, ">", 18),
    ("small", "kallsyms"): ("meas", KALLSYMS, ">", 0),
    ("small", "threadsdb"): ("db", "threads.txt", ">", 18),
    ("small", "taxonomy"): ("db", "metrics/default.yaml", ">", 0),
    ("gpu", "hpcrun"): ("meas", GPU_STEM.format("000") + ".hpcrun", ">", 24),
    ("gpu", "hpctrace"): ("meas", GPU_STEM.format("500") + ".hpctrace", ">", 24),
    ("gpu", "hpcstruct"): ("meas", GPU_STRUCT, ">", 22),
}
for _seed in ("small", "gpu"):
    for _fmt, _name in (("metadb", "meta"), ("profiledb", "profile"), ("cctdb", "cct")):
        TARGETS[_seed, _fmt] = ("db", f"{_name}.db", "<", 16)
    TARGETS[_seed, "tracedb"] = ("db", "trace.db", "<", 16)
# The files pyview reads itself (the others: through the readers fuzzed above): it runs on these.
PYVIEW_READS = ("taxonomy", "threadsdb", "tracedb")
# pyhpctk's own side files and the kernel symbols: fewer examples (short text, or one xz stream).
FEWER = {"threads": 30, "modules": 30, "threadsdb": 30, "taxonomy": 30, "kallsyms": 30}
BUDGET_S = 30.0  # per example, on a loaded 2-core machine; a clean one takes well under 1 s
ALLOWED_ERR = ("unreadable: ", "pyhpctk: error: ", "warning: ")


def fuzz_settings(default: int) -> Callable[[Any], Any]:
    """``default`` derandomized examples, or ``$PYHPCTK_FUZZ_EXAMPLES`` with
    ``$PYHPCTK_FUZZ_SEED`` (read when the test runs, never at import)."""
    count = int(os.environ.get("PYHPCTK_FUZZ_EXAMPLES", default))
    chosen = os.environ.get("PYHPCTK_FUZZ_SEED")

    def apply(test: Any) -> Any:
        test = settings(
            max_examples=count,
            derandomize=chosen is None,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )(test)
        return seed(int(chosen))(test) if chosen is not None else test

    return apply


# ---------------------------------------------------------------------------------------------
# Seeds


@pytest.fixture(scope="module")
def seeds(reference: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``small/`` and ``gpu/``, each with ``meas/`` and ``db/`` (see :data:`TARGETS`)."""
    root = tmp_path_factory.mktemp("seeds")
    meas, db = root / "small" / "meas", root / "small" / "db"
    (meas / "structs").mkdir(parents=True)
    (meas / "logical").mkdir()
    db.mkdir()
    small = reference / "meas" / "small.m"
    shutil.copyfile(small / (SMALL_STEM + ".hpctrace"), meas / (SMALL_STEM + ".hpctrace"))
    struct_file = "structs/testmeas-small.hpcstruct"
    shutil.copyfile(small / struct_file, meas / struct_file)
    profile = hpcrun.read(small / (SMALL_STEM + ".hpcrun"))
    profile.load_modules = [*profile.load_modules, LoadModule(18, LOGICAL, 0)]
    frames = [(42, 20, 18, (1 << 32) | 5, 1), (44, 42, 18, (2 << 32) | 9, 1)]
    profile.cct = np.concatenate([profile.cct, np.array(frames, CCT_NODE_DTYPE)])
    hpcrun.write(profile, meas / (SMALL_STEM + ".hpcrun"))
    stanzas = [logical.LogicalStanza(1, "main", 0, "app.py", 1), logical.LogicalStanza(2, "f")]
    logical.write(logical.LogicalMetadata(stanzas), meas / LOGICAL)
    for name in ("meta.db", "profile.db", "cct.db", "trace.db"):
        shutil.copyfile(reference / "dbase" / "small.d" / name, db / name)
    (meas / "threads").mkdir()
    entry = threads.ThreadEntry(SMALL_STEM, 5560, "small", "MainThread")
    threads.write(threads.ThreadNamesFile(threads.BY_FILE, [entry]), meas / NAMES)
    (meas / "modules").mkdir()
    sampled = [
        modules.SampledModule(
            "/usr/lib/libc.so.6", FileIdentity("9f2e04c1", 2125328, 1_700_000_000 * 10**9)
        ),
        modules.SampledModule(
            "/opt/lib/libwork.so", FileIdentity("", 16384, 1_700_000_000 * 10**9)
        ),
    ]
    modules.write(modules.SampledModules(sampled), meas / MODULES)
    (meas / "kernel_symbols").mkdir()
    (meas / KALLSYMS).write_bytes(lzma.compress(KALLSYMS_TEXT, format=lzma.FORMAT_XZ))
    entry = threads.ThreadEntry("1", 5560, "small", "MainThread")
    threads.write(threads.ThreadNamesFile(threads.BY_PROFILE, [entry]), db / "threads.txt")
    (db / "metrics").mkdir()
    shutil.copyfile(
        reference / "dbase" / "small.d" / "metrics" / "default.yaml",
        db / "metrics" / "default.yaml",
    )

    gpu = reference / "meas" / "loops-cuda-nvidia-t.m"
    meas, db = root / "gpu" / "meas", root / "gpu" / "db"
    (meas / "structs").mkdir(parents=True)
    db.mkdir()
    for thread in ("000", "500"):
        for suffix in (".hpcrun", ".hpctrace"):
            name = GPU_STEM.format(thread) + suffix
            shutil.copyfile(gpu / name, meas / name)
    shutil.copyfile(gpu / GPU_STRUCT, meas / GPU_STRUCT)
    for name in ("meta.db", "profile.db", "cct.db", "trace.db"):
        shutil.copyfile(reference / "dbase" / "loops-cuda-nvidia-t.d" / name, db / name)
    for directory in sorted(root.glob("*/*")):
        assert pyhpctk(["verify", "-q", str(directory)]) == 0, directory
    return root


# ---------------------------------------------------------------------------------------------
# Corruptions


def absurd_values(size: int, width: int) -> list[int]:
    """Values an id, count or offset field should never hold in a file of ``size`` bytes."""
    top = (1 << (8 * width)) - 1
    values = [0, 1, top, top >> 1, top - 7, 0xFFFFFFFF, 0x7FFFFFFF, 1 << 31, size, size - 1]
    values += [size + 8, size * 4096, 1 << 40, 1 << 62, 0x656E6421]
    return sorted({v & top for v in values})


def field_positions(data: bytes, order: str) -> list[tuple[int, int]]:
    """``(offset, width)`` of the aligned u16/u32/u64 words of ``data`` that hold what looks
    like an offset, a count or an id (a value from 1 to the file size): the fields most worth
    setting to absurd values."""
    found = []
    size = len(data)
    for width, dtype in ((8, "u8"), (4, "u4"), (2, "u2")):
        words = np.frombuffer(data[: size - size % width], dtype=f"{order}{dtype}")
        limit = min(size, 4096) if width == 2 else size
        hits = np.flatnonzero((words > 0) & (words <= limit))
        found += [(int(i) * width, width) for i in hits]
    return found


NUMBERS = re.compile(rb'(?<=")(?:0x[0-9a-f]+|[0-9]+)|(?<=\[|-)0x[0-9a-f]+')
ABSURD_TEXT = [b"99999999999999999999999", b"0xffffffffffffffffff", b"-1", b"", b"1e999", b"0x"]


@st.composite
def corruptions(draw: st.DrawFn, data: bytes, order: str, magic: int) -> bytes:
    """``data`` with one to three corruptions; the first ``magic`` bytes (magic and version,
    whose damage every reader refuses at once) are spared most of the time."""
    out = bytearray(data)
    fields = field_positions(data, order)
    numbers = [(m.start(), m.end()) for m in NUMBERS.finditer(data)]
    kinds = ["cut", "cut", "flip", "field", "value", "value", "value", "insert", "delete"]
    for _ in range(draw(st.integers(1, 3))):
        size = len(out)
        if size <= magic:
            break
        low = magic if draw(st.integers(0, 9)) else 0
        # Headers, section tables and counts; footers; anywhere.
        region = draw(st.integers(0, 2))
        first, last = ((low, min(size, 0x100)), (max(low, size - 0x80), size), (low, size))[region]
        where = draw(st.integers(first, last - 1))
        kind = draw(st.sampled_from(kinds + (["number"] * 4 if numbers else [])))
        if kind == "cut":
            keep = draw(st.sampled_from([0, 0, 8, 112]))  # keeping a footer makes offsets lie
            out[:] = out[:where] + (out[-keep:] if keep else b"")
        elif kind == "flip":
            out[where] ^= draw(st.integers(1, 255))
        elif kind in ("field", "value"):
            at, width = (
                draw(st.sampled_from(fields))
                if kind == "value" and fields
                else (where, draw(st.sampled_from([1, 2, 4, 8])))
            )
            at = min(at - at % width, max(0, size - width))
            value = draw(st.sampled_from(absurd_values(size, width)))
            raw = value.to_bytes(width, "big" if order == ">" else "little")
            out[at : at + width] = raw[: max(0, size - at)]
        elif kind == "insert":
            blob = draw(
                st.sampled_from([b"\0" * 8, b"\xff" * 8, b"99999999999999999999", b"<", b'"'])
            )
            out[where:where] = blob
        elif kind == "number":
            start, end = draw(st.sampled_from(numbers))
            if end <= len(out):
                out[start:end] = draw(st.sampled_from(ABSURD_TEXT))
        else:
            del out[where : where + draw(st.integers(1, 64))]
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Guards


@contextlib.contextmanager
def guarded(workdir: Path) -> Iterator[None]:
    """Time budget, memory cap, and nothing under ``workdir`` (the cwd) may change."""
    before = snapshot(workdir)
    with (
        contextlib.chdir(workdir),
        time_budget(BUDGET_S),
        memory_cap(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", FormatWarning)
        yield
    assert snapshot(workdir) == before, "something was written"


# ---------------------------------------------------------------------------------------------
# What must hold for every corrupted file


def check_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    """Run ``pyhpctk ARGS``: an exit status, stderr lines that are one-line messages, and for
    ``verify`` stdout lines that are one problem each."""
    status = pyhpctk(args)
    out, err = capsys.readouterr()
    assert status in (0, 1, 2), (args, status)
    for line in err.splitlines():
        assert line.startswith(ALLOWED_ERR), (args, err)
    if status == 2 and args[0] == "dump":
        errors = [line for line in err.splitlines() if line.startswith("pyhpctk: error: ")]
        assert len(errors) == 1, (args, err)
    if args[0] == "verify":
        for line in out.splitlines():
            assert line.startswith("problem: ") or line.endswith("file(s) checked)"), line
    return status


def check_pyview(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Run ``pyview ARGS``: a view, or one error line; warnings of one line each."""
    status = pyview(["--no-color", *args])
    err = capsys.readouterr().err
    assert status in (0, 2), (args, status, err)
    for line in err.splitlines():
        assert line.startswith(("pyview: error: ", "warning: ")), (args, err)
    assert status == 0 or err.splitlines()[-1].startswith("pyview: error: "), (args, err)


def one_line(error: FormatError) -> None:
    assert "\n" not in str(error) and str(error).startswith(error.path), str(error)


def read_everything(path: Path) -> None:
    """Read ``path`` with the library readers as the tools do, making every lazy part; only a
    FormatError (of one line) may come out."""
    try:
        name = format_of_file(path)
        module = formats.module(name)
        obj = module.read(path)
        if name == "hpcrun":
            obj.decoded_values(scaled=True)
            hpcrun.dump(hpcrun.read(path, strict=False), io.StringIO())
        elif name in ("profiledb", "cctdb", "tracedb"):
            blocks = obj.lines if name == "tracedb" else obj.values
            for i in range(len(blocks)):
                with contextlib.suppress(FormatError):
                    blocks[i]
        elif name == "metadb":
            obj.index()
            metadb.verify(obj)
        elif name == "hpcstruct":
            for lm in obj.modules:
                hpcstruct.AddressMap(lm).lookup(np.arange(0, 0x2000, 7, dtype=np.uint64))
        module.verify(obj)
        module.dump(obj, io.StringIO())
    except FormatError as error:
        one_line(error)


@pytest.mark.parametrize(("seed_set", "fmt"), sorted(TARGETS))
def test_a_corrupted_file_is_refused_in_one_line_or_read_cleanly(
    seed_set: str, fmt: str, seeds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, name, order, magic = TARGETS[seed_set, fmt]
    original = (seeds / seed_set / directory / name).read_bytes()
    cases = iter(range(1 << 30))

    @fuzz_settings(FEWER.get(fmt, 60))
    @given(corruptions(original, order, magic))
    def check(corrupt: bytes) -> None:
        workdir = tmp_path / f"case{next(cases)}"
        root = workdir / directory
        shutil.copytree(seeds / seed_set / directory, root)
        target = root / name
        target.write_bytes(corrupt)
        with guarded(workdir):
            for args in (["verify", str(root)], ["dump", str(root)], ["verify", str(target)]):
                check_cli(args, capsys)
            if check_cli(["dump", str(target)], capsys) == 0:
                assert check_cli(["verify", "-q", str(target)], capsys) in (0, 1, 2)
            if target.suffix != ".yaml":
                read_everything(target)
            if fmt in PYVIEW_READS:
                for view in ([], ["--trace-summary"]):
                    check_pyview([*view, str(root)], capsys)
        shutil.rmtree(workdir)

    check()


@pytest.mark.parametrize(
    ("seed_set", "fmt"), [key for key, target in sorted(TARGETS.items()) if target[0] == "meas"]
)
def test_pyprof_on_a_corrupted_measurement_refuses_in_one_line_or_analyses(
    seed_set: str, fmt: str, seeds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, name, order, magic = TARGETS[seed_set, fmt]
    original = (seeds / seed_set / "meas" / name).read_bytes()
    cases = iter(range(1 << 30))

    @fuzz_settings(10)
    @given(corruptions(original, order, magic))
    def check(corrupt: bytes) -> None:
        workdir = tmp_path / f"case{next(cases)}"
        meas, out = workdir / "meas", workdir / "out.d"
        shutil.copytree(seeds / seed_set / "meas", meas)
        (meas / name).write_bytes(corrupt)
        before = snapshot(meas)
        with contextlib.chdir(workdir), time_budget(BUDGET_S), memory_cap():
            # Sources are not copied: where pyprof may write them is issue #15 item 1's test.
            status = pyprof(["-o", str(out), "--no-sources", str(meas)])
        err = capsys.readouterr().err
        assert status in (0, 2), (status, err)
        assert "Traceback" not in err
        if status == 2:
            assert err.splitlines()[-1].startswith("pyprof: error: "), err
        else:
            assert check_cli(["verify", str(out)], capsys) in (0, 1)
        assert snapshot(meas) == before, "pyprof wrote into its input"
        assert sorted(p.name for p in workdir.iterdir()) in (["meas"], ["meas", "out.d"])
        shutil.rmtree(workdir)

    check()
