"""Native frames named without pystruct (issue #36, item 2): ``pyrun; pyprof; pyview``.

pyrun records which build each sampled native module is (``MEAS/modules/``: GNU build id, size,
modification time); pyprof names the frames of a module from the ELF symbol tables of the file at
its path when that file is still the build the run sampled, and refuses a rebuilt one with one
line instead of naming its frames wrongly. A library built here (``gcc -O2``) holds two exported
functions and a hidden one between them; a stripped copy names the hidden one as unknown code of
the library at its entry (``libnames.so @ 0x1180``), or by its own name where a separate debug file
or MiniDebugInfo keeps its symbol. The truth is the C source's names and,
for offsets, pyelftools' reading of the unstripped build's ``.symtab``.

These tests run on CPython 3.11 (the suite) and need the engine's native frames (x86-64 Linux).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pyprof import main as pyprof_main
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.errors import FormatError
from pyhpctk.formats import modules
from pyhpctk.formats.elf_identity import FileIdentity, identify
from pyhpctk.measure import _engine  # type: ignore[attr-defined]

pytestmark = pytest.mark.skipif(
    not _engine.NATIVE_SUPPORTED or shutil.which("gcc") is None,
    reason="native frames are recorded on x86-64 Linux; the test library needs gcc",
)

LIBRARY = r"""
double spin_front(long n) {
    double s = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < 64; j++)
            s += (double)(i ^ j) * 1e-9;
    return s;
}

__attribute__((noinline, visibility("hidden"))) double hidden_tail(long n) {
    double s = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < 64; j++)
            s += (double)(i | j) * 2e-9;
    return s;
}

double call_hidden(long n) {
    return hidden_tail(n) + 1.0;
}
"""

# The same library, rebuilt later with other functions at the same places.
REBUILT = LIBRARY.replace("spin_front", "other_front").replace("hidden_tail", "other_tail")

PROGRAM = """\
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
for function in (lib.spin_front, lib.call_hidden):
    function.restype = ctypes.c_double
    function.argtypes = [ctypes.c_long]
stop = time.thread_time() + float(sys.argv[2])
while time.thread_time() < stop:
    lib.spin_front(20000)
    lib.call_hidden(20000)
"""

# A row named library+offset (``libnames.so+0x1139``, ``libffi.so.8.1.2+0x6f79``): a frame
# nothing named. ``libnames.so @ 0x1180`` (a function no symbol names) is a name.
RAW_ROW = re.compile(r"\s[\w.+-]+\.so[\w.]*\+0x[0-9a-f]+")


def _build(where: Path, source: str = LIBRARY, *flags: str, name: str = "libnames.so") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "names.c").write_text(source)
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", *flags, "names.c", "-o", name],
        cwd=where,
        check=True,
        timeout=120,
    )
    return where / name


def _measure(tmp_path: Path, library: Path, seconds: str = "0.6") -> Path:
    program = tmp_path / "names_prog.py"
    program.write_text(PROGRAM)
    out = tmp_path / "m"
    assert pyrun_main(["-o", str(out), sys.executable, str(program), str(library), seconds]) == 0
    return out


def _analyze(
    measurement: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    """(pyprof's summary, pyview's default text view of the database)."""
    database = tmp_path / "db"
    capsys.readouterr()
    assert pyprof_main(["-o", str(database), str(measurement)]) == 0
    summary = capsys.readouterr().err
    assert pyview_main(["--lines", "60", str(database)]) == 0
    return summary, capsys.readouterr().out


def _function_symbols(library: Path, section: str) -> dict[str, int]:
    """Entry address of each function symbol of ``section`` (pyelftools), by name."""
    from elftools.elf.elffile import ELFFile

    with library.open("rb") as stream:
        table = ELFFile(stream).get_section_by_name(section)
        assert table is not None, f"{library} has no {section}"
        return {
            s.name: int(s["st_value"])
            for s in table.iter_symbols()  # type: ignore[attr-defined]
            if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
        }


def test_native_functions_are_named_without_pystruct(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the rows read libnames.so+0x1139, libffi.so.8.1.2+0x6f79, ... (pyprof named native
    # frames only from pystruct's structure files).
    library = _build(tmp_path / "lib")
    summary, view = _analyze(_measure(tmp_path, library), tmp_path, capsys)
    for function in ("spin_front", "hidden_tail"):
        assert f"{function} [libnames.so]" in view, view
    assert not RAW_ROW.search(view), view
    assert "libnames.so" not in summary, summary  # nothing to say about it: it is named


@pytest.mark.parametrize("build_id", [True, False], ids=["build-id", "size-and-mtime"])
def test_a_library_rebuilt_since_the_run_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], build_id: bool
) -> None:
    # Before: no line said anything about the rebuilt library.
    flags = () if build_id else ("-Wl,--build-id=none",)
    library = _build(tmp_path / "lib", LIBRARY, *flags)
    measurement = _measure(tmp_path, library)
    _build(tmp_path / "lib", REBUILT if build_id else LIBRARY, *flags)  # same path, another build
    summary, view = _analyze(measurement, tmp_path, capsys)
    lines = [line for line in summary.splitlines() if "libnames.so" in line]
    assert len(lines) == 1, summary
    assert "not the build the run measured" in lines[0], lines
    assert ("build id" in lines[0]) == build_id, lines
    for function in ("spin_front", "hidden_tail", "other_front", "other_tail"):
        assert function not in view, view
    assert "libnames.so+0x" in view, view  # its frames stay raw
    assert "Traceback" not in summary


def _stripped(full: Path, where: Path) -> Path:
    library = where / "libnames.so"
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(full, library)
    subprocess.run(["strip", "--strip-all", str(library)], check=True, timeout=60)
    exported = _function_symbols(library, ".dynsym")
    assert "hidden_tail" not in exported and "spin_front" in exported
    return library


def test_a_stripped_library_names_code_no_symbol_covers_as_unknown_code_of_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the hidden function read spin_front+0x60 [libnames.so], after the exported
    # function before it, which it is not (the symbol's size ends before it).
    full = _build(tmp_path / "full")
    library = _stripped(full, tmp_path / "stripped")
    entry = _function_symbols(full, ".symtab")["hidden_tail"]
    _, view = _analyze(_measure(tmp_path, library), tmp_path, capsys)
    assert f"libnames.so @ 0x{entry:x}" in view, (entry, view)
    assert "spin_front [libnames.so]" in view, view
    assert not re.search(r"\w\+0x[0-9a-f]+ \[libnames.so\]", view), view  # no neighbour's name
    assert not RAW_ROW.search(view), view


def _debug_only(full: Path, where: Path) -> Path:
    """``objcopy --only-keep-debug`` of ``full``: its symbols and DWARF, no code."""
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(where)], check=True)
    return where


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs objcopy")
def test_a_stripped_library_is_named_from_its_minidebuginfo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: .gnu_debugdata was not read; hidden_tail read after its neighbour.
    import lzma

    full = _build(tmp_path / "full")
    debug = _debug_only(full, tmp_path / "mini" / "names.debug")
    # As Fedora builds it: the debug file's function symbols .dynsym lacks, no DWARF, xz'd.
    keep = tmp_path / "mini" / "keep"
    exported = _function_symbols(full, ".dynsym")
    keep.write_text(
        "".join(f"{n}\n" for n in _function_symbols(full, ".symtab") if n not in exported)
    )
    mini = tmp_path / "mini" / "mini.elf"
    subprocess.run(
        [
            "objcopy",
            "-S",
            "--remove-section",
            ".comment",
            f"--keep-symbols={keep}",
            str(debug),
            str(mini),
        ],
        check=True,
    )
    packed = tmp_path / "mini" / "mini.xz"
    packed.write_bytes(lzma.compress(mini.read_bytes(), format=lzma.FORMAT_XZ))
    library = _stripped(full, tmp_path / "stripped")
    subprocess.run(
        ["objcopy", "--add-section", f".gnu_debugdata={packed}", str(library)], check=True
    )
    _, view = _analyze(_measure(tmp_path, library), tmp_path, capsys)
    assert "hidden_tail [libnames.so]" in view, view
    assert "spin_front [libnames.so]" in view, view
    assert "libnames.so @ 0x" not in view and not RAW_ROW.search(view), view


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs objcopy")
def test_a_stripped_library_is_named_from_its_debug_file_by_build_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: /usr/lib/debug/.build-id was not read; hidden_tail read after its neighbour.
    from pyhpctk.structure import debug_symbols

    full = _build(tmp_path / "full", LIBRARY, "-Wl,--build-id=sha1")
    identity = identify(str(full))
    assert identity is not None and identity.build_id
    root = tmp_path / "debug"
    monkeypatch.setattr(debug_symbols, "DEBUG_DIRECTORIES", (str(root),))
    place = root / ".build-id" / identity.build_id[:2] / f"{identity.build_id[2:]}.debug"
    # Another build's debug file at that name is not used: its note is not this build's.
    other = _build(tmp_path / "other", REBUILT, "-Wl,--build-id=sha1")
    _debug_only(other, place)
    library = _stripped(full, tmp_path / "stripped")
    measurement = _measure(tmp_path, library)
    _, view = _analyze(measurement, tmp_path, capsys)
    assert "other_tail" not in view and "libnames.so @ 0x" in view, view
    _debug_only(full, place)
    shutil.rmtree(tmp_path / "db")
    _, view = _analyze(measurement, tmp_path, capsys)
    assert "hidden_tail [libnames.so]" in view, view
    assert "libnames.so @ 0x" not in view and not RAW_ROW.search(view), view


def test_unwind_ranges_are_the_fdes_pyelftools_reads(tmp_path: Path) -> None:
    from elftools.elf.elffile import ELFFile

    from pyhpctk.structure.elfimage import open_image, unwind_ranges

    library = _build(tmp_path / "lib")
    with library.open("rb") as stream:
        truth = sorted(
            (e.header["initial_location"], e.header["initial_location"] + e.header["address_range"])
            for e in ELFFile(stream).get_dwarf_info().EH_CFI_entries()
            if type(e).__name__ == "FDE"
        )
    assert len(truth) >= 3
    assert unwind_ranges(open_image(library)).tolist() == [list(r) for r in truth]


CXX_LIBRARY = r"""
namespace work {
struct Kernel {
    static double run(long n);
};
__attribute__((noinline)) double Kernel::run(long n) {
    double s = 0;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < 64; j++)
            s += (double)(i ^ j) * 1e-9;
    return s;
}
}
extern "C" double spin_front(long n) { return work::Kernel::run(n); }
extern "C" double call_hidden(long n) { return work::Kernel::run(n / 2); }
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cxx_functions_are_demangled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = tmp_path / "lib"
    where.mkdir()
    (where / "names.cpp").write_text(CXX_LIBRARY)
    subprocess.run(
        ["g++", "-O2", "-shared", "-fPIC", "names.cpp", "-o", "libnames.so"],
        cwd=where,
        check=True,
        timeout=120,
    )
    _, view = _analyze(_measure(tmp_path, where / "libnames.so"), tmp_path, capsys)
    assert "work::Kernel::run(long) [libnames.so]" in view, view
    assert "_ZN4work" not in view, view


REPLACING = """\
import ctypes, os, shutil, sys, time
lib = ctypes.CDLL(sys.argv[1])
# Another build takes the library's path before its first sample: the mapped file is gone.
shutil.copy(sys.argv[3], sys.argv[1] + ".new")
os.replace(sys.argv[1] + ".new", sys.argv[1])
lib.spin_front.restype = ctypes.c_double
lib.spin_front.argtypes = [ctypes.c_long]
stop = time.thread_time() + float(sys.argv[2])
while time.thread_time() < stop:
    lib.spin_front(20000)
"""


def test_a_library_replaced_while_the_program_ran_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: pyprof had no record of what ran, and said nothing.
    library = _build(tmp_path / "lib")
    rebuilt = _build(tmp_path / "other", REBUILT)
    program = tmp_path / "replacing.py"
    program.write_text(REPLACING)
    out = tmp_path / "m"
    args = [sys.executable, str(program), str(library), "0.4", str(rebuilt)]
    assert pyrun_main(["-o", str(out), *args]) == 0
    (table,) = (out / "modules").iterdir()
    entries = {e.path: e.identity for e in modules.read(table).entries}
    assert entries[str(library)] is None, entries  # "-" fields: nothing vouches for a file
    summary, view = _analyze(out, tmp_path, capsys)
    (line,) = [line for line in summary.splitlines() if "libnames.so" in line]
    assert "replaced or removed while the program ran" in line, summary
    assert "other_front" not in view and "libnames.so+0x" in view, view


def test_build_ids_are_those_the_elf_notes_hold(tmp_path: Path) -> None:
    """The measured process reads build ids with a reader of its own (no pyelftools): the
    same bytes as pyelftools' reading of the note, "" without one, "" for a file not ELF."""
    from elftools.elf.elffile import ELFFile

    with_id = _build(tmp_path / "a", LIBRARY, "-Wl,--build-id=sha1")
    without = _build(tmp_path / "b", LIBRARY, "-Wl,--build-id=none")
    with with_id.open("rb") as stream:
        (note,) = [
            n
            for segment in ELFFile(stream).iter_segments()
            if segment["p_type"] == "PT_NOTE"
            for n in segment.iter_notes()  # type: ignore[attr-defined]
            if n["n_type"] == "NT_GNU_BUILD_ID"
        ]
    identity = identify(str(with_id))
    assert identity is not None and identity.build_id == note["n_desc"]
    assert len(identity.build_id) == 40
    assert identity.size == with_id.stat().st_size
    assert identity.mtime_ns == with_id.stat().st_mtime_ns
    other = identify(str(without))
    assert other is not None and other.build_id == ""
    text = tmp_path / "text.txt"
    text.write_text("not ELF\n")
    assert identify(str(text)) == FileIdentity("", 8, text.stat().st_mtime_ns)
    assert identify(str(tmp_path / "missing.so")) is None
    assert identify(str(tmp_path)) is None  # a directory


def test_the_loaded_modules_file_round_trips_and_pyrun_writes_the_same_bytes() -> None:
    from pyhpctk.measure.module_files import encode_modules

    odd = "/tmp/a\tb\\c\nd" + os.fsdecode(b"\xe9.so")  # escapes, and a byte that is not UTF-8
    table = modules.SampledModules(
        [
            modules.SampledModule("/usr/lib/libc.so.6", FileIdentity("ab12", 10, 20)),
            modules.SampledModule("/opt/libx.so", FileIdentity("", 30, 40)),
            modules.SampledModule(odd, None),
        ]
    )
    data = modules.to_bytes(table)
    assert data == encode_modules((e.path, e.identity) for e in table.entries)
    assert data.splitlines() == [
        b"pyhpctk-modules 1",
        b"ab12\t10\t20\t/usr/lib/libc.so.6",
        b"-\t30\t40\t/opt/libx.so",
        b"-\t-\t-\t/tmp/a\\tb\\\\c\\nd\xe9.so",
    ]
    assert modules.read(data) == table and modules.verify(table) == []
    assert "no build id, 30 bytes" in modules.dumps(table)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"pyhpctk-sources 1\n", "bad magic"),
        (b"pyhpctk-modules 1\n-\t1\t2\t/a.so", "truncated"),
        (b"pyhpctk-modules 1\n-\t1\t/a.so\n", "not BUILD_ID<TAB>SIZE<TAB>MTIME_NS<TAB>PATH"),
        (b"pyhpctk-modules 1\nXY\t1\t2\t/a.so\n", "BUILD_ID is neither lowercase hex nor -"),
        (b"pyhpctk-modules 1\nab\t-\t2\t/a.so\n", "SIZE and MTIME_NS must be decimal"),
        (b"pyhpctk-modules 1\nab\t1\t2\t/a\\q.so\n", "unknown escape"),
    ],
)
def test_a_damaged_loaded_modules_file_is_one_format_error(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=re.escape(message)):
        modules.read(data)


@pytest.mark.parametrize(
    ("modules", "module", "name"),
    [
        (["geometry"], "geometry", "Vector.dot"),
        (["pkg.geometry", "pkg.util"], "pkg.geometry", "Vector.dot"),
        (["a.shapes", "b.shapes"], "b.shapes", "Grid.__init__"),
        (["pkg.geometry", "pkg.util"], "pkg.util", "odd___name"),
    ],
)
def test_mypyc_symbols_read_as_the_python_names_mypyc_wrote(
    modules: list[str], module: str, name: str
) -> None:
    """mypyc's own name generator is the truth: the C names it gives a function of a module
    compiled with others read back as the Python name, its module's prefix dropped."""
    mypyc_namegen = pytest.importorskip("mypyc.namegen", reason="mypyc comes with mypy")
    from pyhpctk.structure.mypyc_names import mypyc_names

    names = mypyc_namegen.NameGenerator([modules])
    body = "CPyDef_" + names.private_name(module, name)
    wrapper = "CPyPy_" + names.private_name(module, name)
    inits = ["CPyInit_" + mypyc_namegen.exported_name(m) for m in modules]
    assert mypyc_names([*inits, body, wrapper, "CPyTagged_Add", "memcpy"])[len(inits) :] == [
        name,
        f"{name} [mypyc wrapper]",  # pyview leaves it out, as the interpreter's own frames
        None,
        None,
    ]


def test_libc_is_named_from_its_installed_debug_file() -> None:
    """Where the system's libc has its debug file (Debian's libc6-dbg), the futex wait a
    thread pool's main thread sleeps in is named (it read ``__nptl_death_event``, a 1-byte
    symbol 16 bytes before it), exported functions keep their exported names, and glibc's
    internal aliases (``__GI___clock_gettime``) and symbol versions (``@@GLIBC_2.3.2``) are no
    part of a name."""
    from pyhpctk.analysis.symbols import library_functions
    from pyhpctk.structure import debug_symbols

    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    identity = identify(str(libc)) if libc.exists() else None
    if identity is None or debug_symbols.debug_file(identity.build_id) is None:
        pytest.skip("no debug file of this libc is installed")
    functions = library_functions(libc)
    assert functions is not None
    names = [f.name for f in functions[0]]
    assert "__futex_abstimed_wait_common [libc.so.6]" in names
    exported = _function_symbols(libc, ".dynsym")
    wait = functions[0][int(np.searchsorted(functions[1], exported["sem_post"], "right")) - 1]
    assert wait.name == "sem_post [libc.so.6]", wait
    assert not [n for n in names if n.startswith("__GI_") or re.search("@@|@GLIBC", n)]
