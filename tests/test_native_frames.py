"""Native frames under Python lines: pystruct MEAS analyzes the libraries, pyprof places samples.

Issue #17, item 3, without the sampling engine: ``native_helpers`` builds a C library with
``gcc -O2 -g`` and writes the measurement pyrun would write of a Python line calling it through
ctypes. What a user reads (pyview's JSON) must be Python line → C function → loop → loop →
line, with the values the samples carry; the cache must spare the second analysis; load modules
that cannot be analyzed are notes, never tracebacks.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import native_helpers as native
from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pystruct import main as pystruct
from pyhpctk.cli.pyview import main as pyview
from pyhpctk.formats.hpcstruct_model import PROCEDURE, Scope
from pyhpctk.structure import driver
from pyhpctk.structure.elfimage import open_image
from pyhpctk.structure.host import analyze_host
from pyhpctk.structure.sampled import analyze_sampled

PERIOD = 0.005
INNER, OUTER, SCALE = 60, 15, 25  # samples in nest's inner body, its outer body, scale's body


def _addresses(library: Path) -> dict[str, int]:
    """An address inside each loop body (DWARF line rows) and the two call sites of run_all."""
    inner = native.line_addresses(library, native.line_of("inner body"))
    outer = native.line_addresses(library, native.line_of("outer body"))
    scale = native.line_addresses(library, native.line_of("scale body"))
    (call_nest,) = native.call_sites(library, "run_all", "nest")
    (call_scale,) = native.call_sites(library, "run_all", "scale")
    return {
        "inner": inner[0],
        "inner2": inner[-1],
        "outer": outer[0],
        "scale": scale[1],
        "call_nest": call_nest,
        "call_scale": call_scale,
    }


def _samples(at: dict[str, int]) -> list[native.Sample]:
    return [
        native.Sample(at["inner"], INNER - 10, (at["call_nest"],)),
        native.Sample(at["inner2"], 10, (at["call_nest"],)),
        native.Sample(at["outer"], OUTER, (at["call_nest"],)),
        native.Sample(at["scale"], SCALE, (at["call_scale"],)),
    ]


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return native.build_library(tmp_path_factory.mktemp("native"))


def _measure(where: Path, library: Path, samples: list[native.Sample] | None = None) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    program = where / "app.py"
    program.write_text(native.PROGRAM)
    meas = where / "meas"
    chosen = samples if samples is not None else _samples(_addresses(library))
    native.write_measurement(meas, library, program, chosen, PERIOD)
    return meas


def _view(meas: Path, tmp_path: Path) -> dict[str, Any]:
    database = tmp_path / "db"
    assert pyprof(["-o", str(database), str(meas)]) == 0
    out = tmp_path / "view.json"
    assert pyview(["--full", "--json", str(out), str(database)]) == 0
    view: dict[str, Any] = json.loads(out.read_text())
    return view


def _child(node: dict[str, Any], scope: str) -> dict[str, Any]:
    """The child row ``scope``: a function's name, ``FILE: LINE`` or ``loop at FILE: LINE``.

    Files are compared by basename (pyview shortens paths below the program's directory).
    """
    children = node.get("children", [])

    def named(child: dict[str, Any]) -> str:
        if child["kind"] in ("line", "loop") and child["file"]:
            where = f"{Path(child['file']).name}: {child['line']}"
            return f"loop at {where}" if child["kind"] == "loop" else where
        return str(child["scope"])

    found = [child for child in children if named(child) == scope]
    assert found, f"no {scope!r} below {node['scope']!r}; children: {[named(c) for c in children]}"
    return found[0]


def _values(node: dict[str, Any]) -> tuple[float, float]:
    return node["values"]["CPUTIME (sec) (I)"], node["values"]["CPUTIME (sec) (E)"]


def test_python_line_then_c_function_then_its_loop_nest_and_lines(
    library: Path, tmp_path: Path
) -> None:
    meas = _measure(tmp_path, library)
    assert pystruct(["-q", "--functions", "sampled", str(meas)]) == 0
    root = _view(meas, tmp_path)["root"]
    calls_c = native.line_of("# calls C", native.PROGRAM)
    line = _child(
        _child(_child(_child(root, "main thread"), "app.py: 13"), "main"), f"app.py: {calls_c}"
    )
    run_all = _child(line, f"run_all [{library.name}]")
    site = _child(run_all, f"native.c: {native.line_of('call nest')}")
    nest = _child(site, f"nest [{library.name}]")
    outer = _child(nest, f"loop at native.c: {native.line_of('outer loop')}")
    inner = _child(outer, f"loop at native.c: {native.line_of('inner loop')}")
    inner_body = _child(inner, f"native.c: {native.line_of('inner body')}")
    outer_body = _child(outer, f"native.c: {native.line_of('outer body')}")
    scale_site = _child(run_all, f"native.c: {native.line_of('call scale')}")
    scale_loop = _child(
        _child(scale_site, f"scale [{library.name}]"),
        f"loop at native.c: {native.line_of('scale loop')}",
    )
    scale_body = _child(scale_loop, f"native.c: {native.line_of('scale body')}")
    total = (INNER + OUTER + SCALE) * PERIOD
    assert _values(line) == pytest.approx((total, 0.0))
    assert _values(run_all) == pytest.approx((total, 0.0))  # run_all itself was never sampled
    assert _values(nest)[0] == pytest.approx((INNER + OUTER) * PERIOD)
    assert _values(outer) == pytest.approx(((INNER + OUTER) * PERIOD, OUTER * PERIOD))
    assert _values(inner) == pytest.approx((INNER * PERIOD, INNER * PERIOD))
    assert _values(inner_body) == pytest.approx((INNER * PERIOD, INNER * PERIOD))
    assert _values(outer_body) == pytest.approx((OUTER * PERIOD, OUTER * PERIOD))
    assert _values(scale_body) == pytest.approx((SCALE * PERIOD, SCALE * PERIOD))
    # The work ratio the samples carry: nest 3 parts, scale 1.
    assert _values(nest)[0] / _values(scale_loop)[0] == pytest.approx((INNER + OUTER) / SCALE)


def test_a_caller_frame_is_placed_at_its_call_instruction(library: Path) -> None:
    """hpcrun writes a caller frame as return address − 1 (meas/small.m); the line is the call's.

    Here the return address of ``nest``'s call is already on the next line (the call of
    ``scale``), so placing the return address itself would name the wrong line.
    """
    at = _addresses(library)
    structure = driver.analyze_target(library)
    lines = {}
    for name, address in (("site", at["call_nest"]), ("return", at["call_nest"] + 1)):
        statement = next(
            s
            for s in structure.modules[0].walk()
            if s.tag == "S" and any(lo <= address < hi for lo, hi in s.ranges)
        )
        lines[name] = statement.line
    assert lines == {"site": native.line_of("call nest"), "return": native.line_of("call scale")}


def _without_ids(scope: Scope) -> Scope:
    clone = copy.deepcopy(scope)
    for inner in clone.walk():
        inner.attrs.pop("i", None)
    return clone


@pytest.mark.parametrize("strip", [False, True], ids=["symbols", "stripped"])
def test_sampled_analysis_gives_the_procedures_of_the_full_one(tmp_path: Path, strip: bool) -> None:
    table = native.symbols(native.build_library(tmp_path / "plain"))
    # strip moves no code: the addresses of nest and scale hold in the stripped copy, where no
    # symbol names them and the full analysis finds them as call targets (targXXXX).
    library = native.build_library(tmp_path, strip=strip)
    image = open_image(library)
    full = {
        p.ranges[0][0]: p for p in analyze_host(image, "x").modules[0].walk() if p.tag == PROCEDURE
    }
    probes = [table["nest"].start + 0x20, table["scale"].start + 0x18]
    sampled = analyze_sampled(image, probes, "x")
    ours = {p.ranges[0][0]: p for p in sampled.structure.modules[0].walk() if p.tag == PROCEDURE}
    compared = 0
    for start, scope in full.items():
        statements = [r for s in scope.walk() if s.tag == "S" for r in s.ranges]
        if any(lo <= a < hi for a in probes for lo, hi in statements):
            assert _without_ids(ours[start]) == _without_ids(scope), scope.name
            compared += 1
    assert compared == 2
    names = [p.name for p in ours.values()]
    if strip:
        assert any(name.startswith("targ") for name in names)
    assert sampled.analyzed < sampled.procedures


def test_the_second_measurement_is_served_by_the_cache(
    library: Path, tmp_path: Path, private_struct_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _measure(tmp_path / "one", library)
    second = _measure(tmp_path / "two", library)
    assert pystruct(["--functions", "sampled", str(first)]) == 0
    err = capsys.readouterr().err
    assert "written" in err and "procedures analyzed" in err
    cache = private_struct_cache
    (index,) = cache.glob("*.sampled.json")
    (entry,) = cache.glob("*.sampled-*.hpcstruct")
    # Doctor the cached result: the second measurement must get it, not a new analysis.
    entry.write_bytes(entry.read_bytes().replace(b'n="nest [', b'n="cached_nest ['))
    assert pystruct(["--functions", "sampled", str(second)]) == 0
    err = capsys.readouterr().err
    assert f"cached    {second / 'structs' / library.name}.hpcstruct" in err
    written = (second / "structs" / f"{library.name}.hpcstruct").read_bytes()
    assert b'n="cached_nest [' in written
    assert str(library).encode() in written  # named after this measurement's load module
    assert sorted(p.name for p in cache.iterdir()) == sorted([index.name, entry.name])


def test_a_new_sampled_address_extends_the_cache_entry(
    library: Path, tmp_path: Path, private_struct_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    at = _addresses(library)
    first = _measure(tmp_path / "one", library, [native.Sample(at["inner"], 5)])
    second = _measure(tmp_path / "two", library, [native.Sample(at["scale"], 5)])
    assert pystruct(["-q", "--functions", "sampled", str(first)]) == 0
    assert pystruct(["--functions", "sampled", str(second)]) == 0
    assert "2 of" in capsys.readouterr().err  # nest (cached before) and scale, analyzed again
    cache = private_struct_cache
    (index,) = cache.glob("*.sampled.json")
    assert json.loads(index.read_text())["addresses"] == sorted([at["inner"], at["scale"]])
    assert len(list(cache.glob("*.sampled-*.hpcstruct"))) == 1  # the smaller entry is gone


def test_full_analysis_is_cached_too_and_no_cache_keeps_nothing(
    library: Path, tmp_path: Path, private_struct_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meas = _measure(tmp_path / "one", library)
    assert pystruct(["--no-cache", str(meas)]) == 0
    assert not private_struct_cache.exists()
    shutil.rmtree(meas / "structs")
    capsys.readouterr()
    assert pystruct([str(meas)]) == 0  # auto: a small library is analyzed whole
    assert "procedures analyzed" not in capsys.readouterr().err
    (entry,) = private_struct_cache.glob("*.hpcstruct")
    assert ".sampled" not in entry.name
    shutil.rmtree(meas / "structs")
    assert pystruct([str(meas)]) == 0
    assert f"cached    {meas / 'structs' / library.name}.hpcstruct" in capsys.readouterr().err


def test_auto_analyzes_sampled_procedures_of_large_binaries(
    library: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(driver, "FULL_ANALYSIS_MAX_CODE", 16)
    meas = _measure(tmp_path, library)
    assert pystruct(["--no-cache", str(meas)]) == 0
    assert "procedures analyzed, those holding its 6 sampled addresses" in capsys.readouterr().err
    assert pystruct(["--no-cache", "--cache", str(tmp_path / "c"), str(meas)]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_unusable_load_modules_are_notes_not_failures(
    library: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyhpctk.formats import hpcrun
    from pyhpctk.formats.hpcrun_model import LoadModule

    meas = _measure(tmp_path, library)
    text = tmp_path / "notes.txt"
    text.write_text("not a binary\n")
    (profile_path,) = meas.glob("*.hpcrun")
    profile = hpcrun.read(profile_path)
    for path in (str(text), str(tmp_path / "gone.so"), "<pseudo module>"):
        profile.load_modules.append(LoadModule(len(profile.load_modules) + 1, path, 1))
    hpcrun.write(profile, profile_path)
    assert pystruct([str(meas)]) == 0
    err = capsys.readouterr().err
    assert f"skipped   {text}: not an ELF binary" in err
    assert "gone.so: not found on this machine" in err
    assert "a pseudo-module, not a file" in err
    assert "Traceback" not in err
    assert (meas / "structs" / f"{library.name}.hpcstruct").is_file()


def test_pyprof_says_which_native_libraries_wait_for_pystruct(
    tmp_path: Path, library: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without structure files native frames are library+offset: pyprof says so and what to run;
    once pystruct has analyzed the measurement the note is gone and the names are there."""
    meas = _measure(tmp_path / "m", library)
    capsys.readouterr()
    assert pyprof(["-o", str(tmp_path / "raw"), str(meas)]) == 0
    err = capsys.readouterr().err
    assert "1 native library has no structure file (libnative.so)" in err, err
    assert f"run `pystruct {meas}` first" in err, err
    assert pystruct(["-q", "--functions", "sampled", str(meas)]) == 0
    capsys.readouterr()
    view = _view(meas, tmp_path)
    err = capsys.readouterr().err
    assert "native library has no structure file" not in err, err
    assert "run `pystruct" not in err, err
    assert "nest" in json.dumps(view)


def test_a_library_without_debug_information_reads_cleanly(
    library: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: rows read "nest [libnative.so] ([libnative.so])" in the bottom-up view and
    # "[libnative.so]: 0", "loop at [libnative.so]: 0" in the tree (no DWARF: no file, no line).
    stripped = native.build_library(tmp_path / "stripped", strip=True)  # the same code
    meas = _measure(tmp_path, stripped, _samples(_addresses(library)))
    assert pystruct(["-q", "--functions", "sampled", str(meas)]) == 0
    database = tmp_path / "db"
    assert pyprof(["-o", str(database), str(meas)]) == 0
    capsys.readouterr()
    assert pyview(["--full", str(database)]) == 0
    assert pyview(["--bottom-up", "--full", str(database)]) == 0
    text = capsys.readouterr().out
    name = stripped.name
    assert f"run_all [{name}]" in text and f"loop at [{name}]" in text, text
    assert f"[{name}] ([{name}])" not in text, text
    assert f"[{name}]: 0" not in text, text
