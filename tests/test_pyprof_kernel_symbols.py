"""Kernel frames of perf-events measurements: kernel addresses named from
``MEAS/kernel_symbols/vmlinux.HOSTID`` as hpcprof names them (issue #20, item 1).

The measurement is written here with pyhpctk's hpcrun writer, laid out as hpcrun lays out a
perf-events measurement with kernel call chains: a load module for the kernel whose offsets are
kernel virtual addresses, below the application's frames, and an xz-compressed copy of a made-up
``/proc/kallsyms``. The kernel module is named both ways hpcrun has named it (the ``kernel``
fixture): ``<vmlinux.1234abcd>`` up to HPCToolkit 2024.01 (``<vmlinux.%08x>`` of the host id),
``kernel_symbols/vmlinux.1234abcd`` (the copy itself, relative to the measurement) later.
Every expected name and value below follows from that table and the samples, by hpcprof's
rules (:mod:`pyhpctk.analysis.kernel_symbols`): a function reaches up to the next ``t``/``T``
symbol, the first of several at one address wins, an address below every symbol stays raw.
"""

from __future__ import annotations

import io
import lzma
import os
from pathlib import Path

import numpy as np
import pytest

from fuzz_helpers import memory_cap
from measurement_helpers import cpu_profile, profile_name
from pyhpctk.analysis.compare import compare, read_view
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.main import main as pyhpctk
from pyhpctk.errors import FormatError
from pyhpctk.formats import hpcrun, hpcstruct, kallsyms
from pyhpctk.formats.hpcrun_model import LoadModule, MetricDescriptor, metric_flags, placeholder_ip
from pyhpctk.formats.hpcstruct_model import Scope, StructureFile
from pyhpctk.present import open_database
from pyhpctk.present.render import TextStyle, render_text

HOST = 0x1234ABCD
NAMINGS = {"2024.01": f"<vmlinux.{HOST:08x}>", "later": f"kernel_symbols/vmlinux.{HOST:08x}"}
CLOCK = "perf::cpu-clock"

# A made-up /proc/kallsyms, in its own format (address, nm type, name, tab, [module]).
KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81001000 t do_syscall_64
ffffffff81001800 D syscall_table_data
ffffffff81002000 T entry_SYSCALL_64
ffffffff81003000 W weak_hook
ffffffff81004000 T ksys_write
this line is not a symbol
ffffffffc0a00000 t ext4_file_write_iter\t[ext4]
"""

# Kernel addresses sampled, and the function hpcprof names each by.
ENTRY = 0xFFFFFFFF81002040  # entry_SYSCALL_64
DO_SYSCALL = 0xFFFFFFFF81001900  # do_syscall_64: a data symbol at ...1800 does not end it
WRITE = 0xFFFFFFFF81004010  # ksys_write
WRITE_2 = 0xFFFFFFFF81004020  # ksys_write, another instruction
EXT4 = 0xFFFFFFFFC0A00100  # ext4_file_write_iter [ext4]
ENTRY_2 = 0xFFFFFFFF81003010  # entry_SYSCALL_64: the weak symbol at ...3000 does not end it
BELOW = 0xFFFFFFFF80000010  # below the first symbol: no function, a raw instruction
BEYOND = 0xFFFFFFFFFFFF0000  # past the last symbol: still the last function
ALIAS = 0xFFFFFFFF81000004  # _stext, listed before startup_64 at the same address

APP, VMLINUX = 1, 2
NODES = [
    (2, 0, 0, placeholder_ip("^Primary"), 1),
    (4, 2, 0, placeholder_ip("| Main  "), 1),
    (6, 4, APP, 0x1010, 1),  # main, calling write_loop
    (8, 6, APP, 0x1110, 1),  # write_loop, in user mode or entering the kernel
    (10, 8, VMLINUX, ENTRY, 1),
    (12, 10, VMLINUX, DO_SYSCALL, 1),
    (14, 12, VMLINUX, WRITE, 1),
    (16, 14, VMLINUX, EXT4, 1),
    (18, 12, VMLINUX, ENTRY_2, 1),
    (20, 8, VMLINUX, BELOW, 1),
    (22, 8, VMLINUX, BEYOND, 1),
    (24, 8, VMLINUX, ALIAS, 1),
    (26, 12, VMLINUX, WRITE_2, 1),
]
SAMPLES = {8: 100.0, 12: 5.0, 14: 7.0, 26: 3.0, 16: 20.0, 18: 4.0, 20: 2.0, 22: 6.0, 24: 1.0}

K = " [vmlinux]"


@pytest.fixture(params=list(NAMINGS), ids=list(NAMINGS))
def kernel(request: pytest.FixtureRequest) -> str:
    """The kernel's load-module name, as hpcrun 2024.01 and later write it."""
    return NAMINGS[str(request.param)]


def _raw(kernel: str, address: int) -> str:
    """pyview's label of a raw kernel instruction."""
    return f"{os.path.basename(kernel)}+0x{address:x}"


# Below write_loop: (path of names) -> (inclusive, exclusive) perf::cpu-clock, worked out by hand.
EXPECTED_KERNEL = {
    ("entry_SYSCALL_64" + K,): (39.0, 0.0),  # 5 + 7 + 3 + 20 + 4 below it
    ("entry_SYSCALL_64" + K, "do_syscall_64" + K): (39.0, 5.0),
    ("entry_SYSCALL_64" + K, "do_syscall_64" + K, "ksys_write" + K): (30.0, 10.0),  # 7 + 3
    (
        "entry_SYSCALL_64" + K,
        "do_syscall_64" + K,
        "ksys_write" + K,
        "ext4_file_write_iter [ext4]" + K,
    ): (
        20.0,
        20.0,
    ),
    ("entry_SYSCALL_64" + K, "do_syscall_64" + K, "entry_SYSCALL_64" + K): (4.0, 4.0),
    ("raw BELOW",): (2.0, 2.0),
    ("ext4_file_write_iter [ext4]" + K,): (6.0, 6.0),
    ("_stext" + K,): (1.0, 1.0),
}


def _app_structure() -> StructureFile:
    def scope(tag: str, children: list[Scope] | None = None, **attrs: str) -> Scope:
        return Scope(tag, dict(attrs), children or [])

    main = scope(
        "P", [scope("S", l="10", v="{[0x1000-0x1100)}")], n="main", l="9", v="{[0x1000-0x1001)}"
    )
    loop = scope(
        "P",
        [scope("S", l="20", v="{[0x1100-0x1200)}")],
        n="write_loop",
        l="19",
        v="{[0x1100-0x1101)}",
    )
    module = scope("LM", [scope("F", [main, loop], n="/src/app.c")], n="/bin/app", v="{}")
    module.attrs["has-calls"] = "0"
    return StructureFile(modules=[module])


def _measurement(
    tmp_path: Path, kernel: str, symbols: bytes | None = None, structure: bool = True
) -> Path:
    measurement = tmp_path / "app.m"
    measurement.mkdir()
    metrics = [MetricDescriptor(CLOCK, "cpu clock", metric_flags(value_format=2), period=1)]
    modules = [LoadModule(APP, "/bin/app"), LoadModule(VMLINUX, kernel, flags=0)]
    profile = cpu_profile(modules, NODES, {n: {0: v} for n, v in SAMPLES.items()}, metrics, HOST)
    hpcrun.write(profile, measurement / profile_name(HOST))
    if symbols is None:  # as hpcrun's copy_kallsyms: the text, xz-compressed
        symbols = lzma.compress(KALLSYMS.encode(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64)
    (measurement / "kernel_symbols").mkdir()
    (measurement / "kernel_symbols" / f"vmlinux.{HOST:08x}").write_bytes(symbols)
    if structure:
        (measurement / "structs").mkdir()
        hpcstruct.write(_app_structure(), measurement / "structs" / "app.hpcstruct")
    return measurement


def _tree(database: Path) -> dict[tuple[str, ...], tuple[float, float]]:
    """pyview's top-down tree: label path from below the entry point -> (inclusive, exclusive)."""
    arrays = open_database(database).arrays([CLOCK])
    parent, label = arrays["parent"], arrays["label"]
    result: dict[tuple[str, ...], tuple[float, float]] = {}
    for row in range(1, len(parent)):
        path: list[str] = []
        cursor = row
        while cursor > 0 and arrays["kind"][cursor] != "entry":
            path.append(str(label[cursor]))
            cursor = int(parent[cursor])
        key = tuple(reversed(path))
        if not key:  # the entry points
            continue
        inclusive, exclusive = arrays[f"{CLOCK} (I)"][row], arrays[f"{CLOCK} (E)"][row]
        result[key] = (float(np.nan_to_num(inclusive)), float(np.nan_to_num(exclusive)))
    return result


def _below(
    tree: dict[tuple[str, ...], tuple[float, float]], prefix: tuple[str, ...]
) -> dict[tuple[str, ...], tuple[float, float]]:
    return {
        k[len(prefix) :]: v
        for k, v in tree.items()
        if k[: len(prefix)] == prefix and len(k) > len(prefix)
    }


@pytest.mark.parametrize("ignore_structs", [False, True], ids=["struct", "nostruct"])
def test_kernel_addresses_become_the_functions_of_the_kernel_symbol_table(
    tmp_path: Path, kernel: str, ignore_structs: bool
) -> None:
    measurement = _measurement(tmp_path, kernel)
    database = tmp_path / "db"
    report = run(ProfOptions.build([measurement], output=database, ignore_structs=ignore_structs))
    assert any("1 line(s) are not 'ADDRESS TYPE NAME [MODULE]'" in p for p in report.problems)
    tree = _tree(database)
    # The application's frames: named by its structure file, or raw without it.
    app = (
        ("main", "app.c: 10", "write_loop", "app.c: 20")
        if not ignore_structs
        else (
            "app+0x1010",
            "app+0x1110",
        )
    )
    found = {k: v for k, v in _below(tree, app).items() if not k[-1].startswith("app.c")}
    raw = {("raw BELOW",): (_raw(kernel, BELOW),)}
    assert found == {raw.get(k, k): v for k, v in EXPECTED_KERNEL.items()}
    assert tree[app] == (100.0 + 39.0 + 2.0 + 6.0 + 1.0, 100.0)  # write_loop's own samples


def test_kernel_functions_are_meta_db_functions_of_the_kernel_module(
    tmp_path: Path, kernel: str
) -> None:
    """meta.db as hpcprof writes it: ``-call> [function] NAME [vmlinux]`` whose function has the
    kernel's module (as the load map names it), the symbol's address as offset and no source
    file; a raw ``-call> [instruction]`` where no symbol covers the address."""
    database = tmp_path / "db"
    run(ProfOptions.build([_measurement(tmp_path, kernel)], output=database))
    view = read_view(database)
    functions = {
        label[2][0]: label[2]
        for _, label in view.contexts.values()
        if label[0] != "entry" and label[2] and "[vmlinux]" in str(label[2][0])
    }
    assert functions == {
        "entry_SYSCALL_64" + K: ("entry_SYSCALL_64" + K, kernel, 0xFFFFFFFF81002000, None, 0),
        "do_syscall_64" + K: ("do_syscall_64" + K, kernel, 0xFFFFFFFF81001000, None, 0),
        "ksys_write" + K: ("ksys_write" + K, kernel, 0xFFFFFFFF81004000, None, 0),
        "ext4_file_write_iter [ext4]" + K: (
            "ext4_file_write_iter [ext4]" + K,
            kernel,
            0xFFFFFFFFC0A00000,
            None,
            0,
        ),
        "_stext" + K: ("_stext" + K, kernel, 0xFFFFFFFF81000000, None, 0),
    }
    relations = {
        (label[0], label[1])
        for _, label in view.contexts.values()
        if label[0] != "entry"
        and ((label[2] and "[vmlinux]" in str(label[2][0])) or label[5] == kernel)
    }
    assert relations == {(1, 0), (1, 3)}  # -call> [function], -call> [instruction] (BELOW)
    raw = [
        label for _, label in view.contexts.values() if label[0] != "entry" and label[5] == kernel
    ]
    assert [(label[1], label[6]) for label in raw] == [(3, BELOW)]


def test_without_the_symbol_file_kernel_frames_stay_raw_instructions(
    tmp_path: Path, kernel: str
) -> None:
    measurement = _measurement(tmp_path, kernel)
    (measurement / "kernel_symbols" / f"vmlinux.{HOST:08x}").unlink()
    database = tmp_path / "db"
    run(ProfOptions.build([measurement], output=database))
    labels = {path[-1] for path in _tree(database)}
    assert not any("[vmlinux]" in label for label in labels)
    assert _raw(kernel, ENTRY) in labels and _raw(kernel, EXT4) in labels


def test_a_damaged_symbol_file_is_reported_and_leaves_frames_raw(
    tmp_path: Path, kernel: str
) -> None:
    good = lzma.compress(KALLSYMS.encode(), format=lzma.FORMAT_XZ)
    measurement = _measurement(tmp_path, kernel, symbols=good[: len(good) // 2])
    database = tmp_path / "db"
    report = run(ProfOptions.build([measurement], output=database))
    (problem,) = [p for p in report.problems if "kernel_symbols" in p]
    assert "xz stream: cannot decompress" in problem and f"frames of {kernel} stay raw" in problem
    assert _raw(kernel, ENTRY) in {path[-1] for path in _tree(database)}


def test_a_plain_text_copy_of_kallsyms_is_read_too(tmp_path: Path, kernel: str) -> None:
    """hpcrun writes xz; a hand copy of /proc/kallsyms (plain text) gives the same database."""
    xz = tmp_path / "xz"
    plain = tmp_path / "plain"
    xz.mkdir()
    plain.mkdir()
    run(ProfOptions.build([_measurement(xz, kernel)], output=xz / "db"))
    run(ProfOptions.build([_measurement(plain, kernel, KALLSYMS.encode())], output=plain / "db"))
    assert compare(read_view(xz / "db"), read_view(plain / "db")) == []
    assert "ksys_write [vmlinux]" in {path[-1] for path in _tree(plain / "db")}


def test_pyview_shows_kernel_functions_by_name_under_the_kernel_module(
    tmp_path: Path, kernel: str
) -> None:
    database = tmp_path / "db"
    run(ProfOptions.build([_measurement(tmp_path, kernel)], output=database))
    db = open_database(database)
    # top-down text, as `pyview DB` prints it
    out = io.StringIO()
    render_text(db.view("top-down", [CLOCK]), out, TextStyle(tree="indent", color=False))
    text = out.getvalue()
    assert "ext4_file_write_iter [ext4] [vmlinux]" in text and "do_syscall_64 [vmlinux]" in text
    # flat view: the kernel's load module > <unknown file> > kernel functions
    flat = db.view("flat", [CLOCK])
    module = next(n for n in flat.root.children if n.label == os.path.basename(kernel))
    functions = {
        f.label: (float(f.values[0]), float(f.values[1]))
        for file in module.children
        for f in file.children
    }
    assert functions["ksys_write" + K] == (30.0, 10.0)
    assert functions["ext4_file_write_iter [ext4]" + K] == (26.0, 26.0)  # 20 + 6, both contexts
    assert functions["entry_SYSCALL_64" + K][1] == 4.0


def test_the_metric_taxonomy_keeps_hyphens_in_anchors_as_hpcprof(tmp_path: Path) -> None:
    database = tmp_path / "db"
    run(ProfOptions.build([_measurement(tmp_path, NAMINGS["2024.01"])], output=database))
    text = (database / "metrics" / "default.yaml").read_text()
    assert "&perfx3a_x3a_cpu-clock-sum-x5b_0x0x5d_-execution" in text


def test_kallsyms_files_round_trip_and_keep_what_hpcprof_reads(tmp_path: Path) -> None:
    table = kallsyms.parse(KALLSYMS)
    assert table.skipped == 1 and len(table.symbols) == 8
    assert table.symbols[-1] == kallsyms.KernelSymbol(
        0xFFFFFFFFC0A00000, "t", "ext4_file_write_iter", "[ext4]"
    )
    path = tmp_path / "vmlinux.1234abcd"
    kallsyms.write(table, path)
    assert path.read_bytes().startswith(b"\xfd7zXZ\x00")
    assert lzma.decompress(path.read_bytes()).decode() == kallsyms.to_text(table)
    again = kallsyms.read(path)
    assert again.symbols == table.symbols and again.skipped == 0
    assert "1 line(s) are not" in kallsyms.verify(table)[0]
    with pytest.raises(FormatError, match="xz stream"):
        kallsyms.read(path.read_bytes()[:40])


@pytest.mark.parametrize("memory_limit", [None, 1 << 16], ids=["whole", "capped"])
def test_pyprof_mpi_names_kernel_frames_as_pyprof(
    tmp_path: Path, kernel: str, memory_limit: int | None
) -> None:
    """The distributed driver (one rank here) classifies through the same code: same database."""
    from pyhpctk.analysis.comm import SerialComm
    from pyhpctk.analysis.distributed import run_distributed

    measurement = _measurement(tmp_path, kernel)
    run(ProfOptions.build([measurement], output=tmp_path / "serial"))
    options = ProfOptions.build([measurement], output=tmp_path / "mpi")
    run_distributed(options, SerialComm(), memory_limit=memory_limit)
    assert compare(read_view(tmp_path / "serial"), read_view(tmp_path / "mpi")) == []
    assert "ksys_write [vmlinux]" in {path[-1] for path in _tree(tmp_path / "mpi")}


# ---------------------------------------------------------------------------------------------
# A decompression bomb, and verify's checks (issue #32 item 3)

BOMB_TEXT = 2 << 30  # what the bomb below says it holds: 2 GiB of "a"


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """An xz file of 300 KB that decompresses to 2 GiB: 20 streams of 100 MiB of one letter."""
    stream = lzma.compress(b"a" * (100 << 20), format=lzma.FORMAT_XZ, preset=0)
    return stream * (BOMB_TEXT // (100 << 20))


def test_an_xz_bomb_is_refused_past_the_cap_with_little_memory(
    tmp_path: Path, bomb: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Decompressing all of it would need 2 GiB; the reader stops one byte past its cap (64
    MiB), under an address space of 512 MiB more than the process has mapped."""
    measurement = _measurement(tmp_path, NAMINGS["later"], symbols=bomb)
    symbols = measurement / "kernel_symbols" / f"vmlinux.{HOST:08x}"
    refusal = f"{symbols}: xz stream: decompresses to more than {64 << 20} bytes"
    with memory_cap(512 << 20):
        with pytest.raises(FormatError) as error:
            kallsyms.read(symbols)
        assert str(error.value).startswith(refusal)
        assert pyhpctk(["verify", str(measurement)]) == 2
        assert pyhpctk(["verify", str(symbols)]) == 2
        report = run(ProfOptions.build([measurement], output=tmp_path / "db"))
    err = capsys.readouterr().err
    assert err.count(f"unreadable: {refusal}") == 2, err
    (problem,) = [p for p in report.problems if "kernel_symbols" in p]
    assert problem.startswith(refusal)


def test_verify_checks_kernel_symbol_files_in_a_measurement_and_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy made while kptr_restrict hid the addresses (every address 0), and a plain-text
    copy placed elsewhere by hand, are kernel symbol files: verify reads and checks them."""
    hidden = "".join(f"0000000000000000 T {name}\n" for name in ("_stext", "ksys_write"))
    measurement = _measurement(tmp_path, NAMINGS["later"], symbols=hidden.encode())
    symbols = measurement / "kernel_symbols" / f"vmlinux.{HOST:08x}"
    assert pyhpctk(["verify", str(measurement)]) == 1
    assert pyhpctk(["verify", str(symbols)]) == 1
    out = capsys.readouterr().out
    assert out.count(f"problem: {symbols}: every address is 0") == 2, out
    assert pyhpctk(["dump", str(measurement)]) == 0
    out = capsys.readouterr().out
    assert f"=== kernel_symbols/vmlinux.{HOST:08x} (kallsyms)\n" in out
    assert "kernel symbols, 2 symbols (2 functions)" in out
    elsewhere = tmp_path / "vmlinux.xz"  # an xz stream anywhere is a kernel symbol file
    elsewhere.write_bytes(lzma.compress(KALLSYMS.encode(), format=lzma.FORMAT_XZ))
    assert pyhpctk(["verify", str(elsewhere)]) == 1  # the line that is not a symbol
    assert "1 line(s) are not" in capsys.readouterr().out
