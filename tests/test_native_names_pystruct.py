"""pystruct's structure never names native frames worse than pyprof does without it (issue #36).

pyprof names a native library's frames from its ELF symbols when no structure file covers it
(``tests/test_native_names.py``); ``pystruct MEAS`` adds loops and lines, and its structure file
wins. Two things it left unnamed: code in no procedure of the structure (a stripped library's
hidden function that only a function pointer calls: no symbol, no direct call) read
``libnames.so+0x1160``, and the lines and loops of a library without a DWARF line map, which
pystruct places in the file ``[libnames.so]`` at line 0, read as rows ``[libnames.so]``, ``loop at
[libnames.so]`` and call sites ``spin_front [libnames.so] ← [libnames.so]``. The truth is the
same measurement analyzed without the structure file: every function named there is named with it,
and no row is a place no source names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pyhpctk.cli.pystruct import main as pystruct_main
from pyhpctk.measure import _engine  # type: ignore[attr-defined]
from test_native_names import LIBRARY, RAW_ROW, _analyze, _build, _function_symbols, _measure

pytestmark = pytest.mark.skipif(
    not _engine.NATIVE_SUPPORTED or shutil.which("gcc") is None,
    reason="native frames are recorded on x86-64 Linux; the test library needs gcc",
)

# test_native_names' library, its hidden function called through a pointer only.
POINTER_LIBRARY = (
    LIBRARY.replace('__attribute__((noinline, visibility("hidden")))', "static")
    .replace(
        "double call_hidden", "double (*volatile hook)(long) = hidden_tail;\ndouble call_hidden"
    )
    .replace("return hidden_tail(n)", "return hook(n)")
)


def _functions(view: str) -> set[str]:
    """The functions of the test library a view names."""
    return set(re.findall(r"\w+ \[libnames\.so\]|libnames\.so @ 0x[0-9a-f]+", view))


def _place_rows(view: str) -> list[str]:
    """Rows that name no function, only a place no source names: ``[libnames.so]``, ``loop
    at [libnames.so]``, or a call site ``… ← [libnames.so]``."""
    return [
        scope
        for scope in _scopes(view)
        if re.sub(r" \(.*\)$", "", scope).endswith(("← [libnames.so]", "loop at [libnames.so]"))
        or re.sub(r" \(.*\)$", "", scope) == "[libnames.so]"
    ]


def _scopes(view: str) -> list[str]:
    return [line.split("%")[-1].strip().lstrip("* ") for line in view.splitlines() if "%" in line]


def test_pystruct_never_names_native_frames_worse_than_symbols(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: with the structure file the rows read libnames.so+0x1160 (the hidden function)
    # and [libnames.so] (lines and loops of code without a line map).
    full = _build(tmp_path / "full", POINTER_LIBRARY)
    library = tmp_path / "stripped" / "libnames.so"
    library.parent.mkdir()
    shutil.copy(full, library)
    subprocess.run(["strip", "--strip-all", str(library)], check=True, timeout=60)
    entry = _function_symbols(full, ".symtab")["hidden_tail"]
    measurement = _measure(tmp_path, library, "0.8")
    _, without = _analyze(measurement, tmp_path, capsys)
    hidden = f"libnames.so @ 0x{entry:x}"
    assert hidden in without and "spin_front [libnames.so]" in without, without
    assert pystruct_main(["--no-cache", str(measurement)]) == 0
    assert list((measurement / "structs").glob("libnames.so*.hpcstruct"))
    shutil.rmtree(tmp_path / "db")
    _, structured = _analyze(measurement, tmp_path, capsys)
    assert not RAW_ROW.search(structured), structured
    assert not _place_rows(structured), structured
    assert _functions(without) <= _functions(structured), structured
    # a row's self time never exceeds its inclusive time (a line left out moves no cost)
    for inclusive, exclusive in re.findall(r"^\s*(\S+)\s+\S+%\s+(\S+)\s+\S+%", structured, re.M):
        assert float(exclusive) <= float(inclusive) * 1.000001, structured


@pytest.mark.skipif(shutil.which("objcopy") is None, reason="needs objcopy")
def test_a_debug_file_installed_later_renews_pystructs_cached_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the cache entry of the stripped library, keyed by its bytes alone, kept the names
    # it had before its debug file was installed.
    from pyhpctk.formats.elf_identity import identify
    from pyhpctk.structure import debug_symbols

    full = _build(tmp_path / "full", LIBRARY, "-Wl,--build-id=sha1")
    library = tmp_path / "stripped" / "libnames.so"
    library.parent.mkdir()
    shutil.copy(full, library)
    subprocess.run(["strip", "--strip-all", str(library)], check=True, timeout=60)
    root = tmp_path / "debug"
    monkeypatch.setattr(debug_symbols, "DEBUG_DIRECTORIES", (str(root),))
    cache = tmp_path / "cache"
    measurement = _measure(tmp_path, library)

    def structure() -> str:
        argv = ["-q", "-j", "1", "--cache", str(cache), "--force", str(measurement)]
        assert pystruct_main(argv) == 0
        (found,) = (measurement / "structs").glob("libnames.so*.hpcstruct")
        return found.read_text()

    assert "hidden_tail" not in structure()
    identity = identify(str(full))
    assert identity is not None
    place = root / ".build-id" / identity.build_id[:2] / f"{identity.build_id[2:]}.debug"
    place.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(place)], check=True)
    assert 'n="hidden_tail [libnames.so]"' in structure()
