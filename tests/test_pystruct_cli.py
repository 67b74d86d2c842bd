"""The ``pystruct`` command: one target, measurement directories, cache, ``-j``, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pyhpctk.cli.pystruct import main
from pyhpctk.formats import hpcrun, hpcstruct, logical
from pyhpctk.formats.hpcrun_model import LoadModule
from pyhpctk.structure import cubin
from pyhpctk.structure.cfg import Decoder
from pyhpctk.structure.driver import MANIFEST, StructOptions, analyze_target
from pyhpctk.structure.dwarf import read_debug_info
from pyhpctk.structure.elfimage import open_image
from pyhpctk.structure.host import FunctionAnalyzer, analyze_host, skeleton
from pyhpctk.structure.parallel import map_functions

HOST = "inlines+loops-x86_64-gcc10-dr"
VDSO = "7efc21c89566f551ba9bac284645e9d6.vdso"


def _measurements(reference: Path, tmp_path: Path, name: str = "loops-cputime-t.m") -> Path:
    """A writable copy of a reference measurement directory without its structs/."""
    dest = tmp_path / name
    shutil.copytree(reference / "meas" / name, dest, ignore=shutil.ignore_patterns("structs"))
    return dest


def _name_python_sources(meas: Path, functions: list[tuple[str, Path]]) -> None:
    """Give the measurement's profile a ``logical/`` load module naming these functions."""
    (meas / "logical").mkdir()
    logical.write(
        logical.LogicalMetadata(
            [
                logical.LogicalStanza(i + 1, name, filename=str(path), lineno=1)
                for i, (name, path) in enumerate(functions)
            ]
        ),
        meas / "logical" / "python.0badcafe",
    )
    (profile_path,) = meas.glob("*.hpcrun")
    profile = hpcrun.read(profile_path)
    profile.load_modules.append(
        LoadModule(len(profile.load_modules) + 1, "logical/python.0badcafe", 0)
    )
    hpcrun.write(profile, profile_path)


def test_one_binary_is_written_to_the_output_file(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.hpcstruct"
    assert main([str(reference / "bin" / HOST), "-o", str(out)]) == 0
    written = hpcstruct.read(out)
    assert written.modules == analyze_target(reference / "bin" / HOST).modules
    assert "wrote" in capsys.readouterr().err


def test_default_output_is_basename_dot_hpcstruct_in_the_cwd(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["-q", str(reference / "bin" / HOST)]) == 0
    assert (tmp_path / f"{HOST}.hpcstruct").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"just text\n", "not an ELF binary"),
        (b"\x7fELF\x02\x01\x01" + b"\0" * 9, "truncated"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    target = tmp_path / "bad.bin"
    target.write_bytes(content)
    assert main([str(target), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_python_file_with_syntax_error_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "broken.py"
    source.write_text("def f(:\n    pass\n")
    assert main([str(source), "-o", str(tmp_path / "o.hpcstruct")]) == 2
    err = capsys.readouterr().err
    assert "broken.py:1:" in err and "invalid syntax" in err and "Traceback" not in err


def test_measurement_python_sources_are_structured_and_broken_ones_reported(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meas = _measurements(reference, tmp_path, "small.m")
    good = tmp_path / "app.py"
    good.write_text("def work(n):\n    for i in range(n):\n        pass\n")
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n")
    _name_python_sources(meas, [("work", good), ("f", bad)])
    assert main([str(meas)]) == 4
    assert "broken.py:1:" in capsys.readouterr().err
    structure = hpcstruct.read(meas / "structs" / "app.py.hpcstruct")
    assert structure.modules[0].attrs["n"] == str(good)
    assert [s.line for s in structure.modules[0].walk() if s.tag == "L"] == [2]


def test_gpucfg_without_nvdisasm_says_how_to_install_it(
    reference: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cubin, "find_nvdisasm", lambda: None)
    target = reference / "bin" / "recursion-sm_75-nvcc112-r"
    assert main([str(target), "--gpucfg", "yes", "-o", str(tmp_path / "o")]) == 3
    assert "pip install nvidia-cuda-nvdisasm" in capsys.readouterr().err


def test_measurement_directory_writes_structs_and_skips_unchanged(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meas = _measurements(reference, tmp_path)
    assert main([str(meas)]) == 0
    written = meas / "structs" / f"{VDSO}.hpcstruct"
    expected = reference / "meas" / "loops-cputime-t.m" / "structs" / f"{VDSO}.hpcstruct"
    assert written.read_bytes() == expected.read_bytes()
    first = capsys.readouterr().err
    assert "written" in first and "not found on this machine" in first
    manifest = json.loads((meas / "structs" / MANIFEST).read_text())
    assert f"{VDSO}.hpcstruct" in manifest
    stamp = written.stat().st_mtime_ns
    assert main([str(meas)]) == 0
    assert "unchanged" in capsys.readouterr().err
    assert written.stat().st_mtime_ns == stamp


def test_a_broken_target_does_not_stop_the_others(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meas = _measurements(reference, tmp_path, "loops-cuda-nvidia-t.m")
    (meas / "gpubins" / "0000broken.gpubin").write_bytes(b"\x7fELF garbage")
    assert main([str(meas), "-j", "2"]) == 4
    err = capsys.readouterr().err
    assert "0000broken.gpubin" in err and "targets failed" in err
    good = meas / "structs" / "1165a3eeddeea5ea3616d1cdbc6faa59.gpubin-gpucfg-no.hpcstruct"
    assert hpcstruct.read(good).modules[0].attrs["has-calls"] == "0"


def test_gpubins_with_gpucfg_match_hpcstruct(reference: Path, tmp_path: Path) -> None:
    meas = _measurements(reference, tmp_path, "loops-cuda-nvidia-t.m")
    assert main(["-q", "--keep-paths", "--gpucfg", "yes", str(meas)]) == 0
    name = "1165a3eeddeea5ea3616d1cdbc6faa59.gpubin-gpucfg-yes.hpcstruct"
    ours = hpcstruct.read(meas / "structs" / name)
    ref = hpcstruct.read(reference / "meas" / "loops-cuda-nvidia-t.m" / "structs" / name)
    loops = [s.line for s in ours.modules[0].walk() if s.tag == "L"]
    assert loops == [s.line for s in ref.modules[0].walk() if s.tag == "L"] and loops


def test_cache_directory_is_consulted_by_content_hash(reference: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    target = reference / "bin" / HOST
    assert main(["-q", "--cache", str(cache), str(target), "-o", str(tmp_path / "a")]) == 0
    (entry,) = cache.glob("*.hpcstruct")
    # Doctor the cached result: a second run must serve it instead of re-analyzing.
    entry.write_bytes(entry.read_bytes().replace(b'n="f1 [', b'n="cached_f1 ['))
    assert main(["-q", "--cache", str(cache), str(target), "-o", str(tmp_path / "b")]) == 0
    assert b'n="cached_f1 [' in (tmp_path / "b").read_bytes()
    assert b'n="cached_f1 [' not in (tmp_path / "a").read_bytes()


def test_parallel_functions_give_the_serial_result(reference: Path) -> None:
    image = open_image(reference / "bin" / HOST)
    info = read_debug_info(image)
    procs = skeleton(image, info, Decoder(image.machine))
    analyzer = FunctionAnalyzer(image, info, procs)
    serial = [analyzer.analyze(p) for p in procs]
    assert [scope for scope, _ in map_functions(analyzer, procs, 2)] == serial


def test_parallel_binary_analysis_finds_the_same_plt_and_call_target_procedures(
    reference: Path,
) -> None:
    image = open_image(reference / "bin" / HOST)
    serial = analyze_host(image, "x")
    parallel = analyze_host(image, "x", jobs=2, min_parallel=0)
    assert parallel.modules == serial.modules
    names = [s.name for s in parallel.modules[0].walk() if s.tag == "P"]
    assert f"targ1040@plt [{HOST}]" in names and f"printf@plt [{HOST}]" in names


def test_parallel_directory_mode_gives_the_serial_files(reference: Path, tmp_path: Path) -> None:
    one = _measurements(reference, tmp_path / "one")
    two = _measurements(reference, tmp_path / "two")
    assert main(["-q", str(one)]) == 0
    assert main(["-q", "-j", "2", str(two)]) == 0
    files = sorted(p.name for p in (one / "structs").glob("*.hpcstruct"))
    assert files == sorted(p.name for p in (two / "structs").glob("*.hpcstruct")) and files
    for name in files:
        assert (one / "structs" / name).read_bytes() == (two / "structs" / name).read_bytes()


def test_a_directory_without_measurements_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path)]) == 2
    assert "no .hpcrun profiles" in capsys.readouterr().err


def test_jobs_must_be_positive() -> None:
    with pytest.raises(Exception, match="-j must be at least 1"):
        StructOptions(jobs=0)


def test_a_source_name_near_name_max_gets_a_short_unique_structure_file_name(
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #32, item 8: a basename of 250 bytes is a valid file name, but ``NAME.hpcstruct``
    is over NAME_MAX (255 bytes): its structure file keeps a prefix and a digest of the path."""
    long_name = "é" * 100 + "a" * 47 + ".py"  # 250 bytes in UTF-8
    assert len(long_name.encode()) == 250
    sources = []
    for directory in ("one", "two"):  # one basename, two files: two structure files
        (tmp_path / directory).mkdir()
        source = tmp_path / directory / long_name
        source.write_text(f"def work(n):\n    for i in range(n):\n        pass  # {directory}\n")
        sources.append(source)
    meas = _measurements(reference, tmp_path, "small.m")
    _name_python_sources(meas, [("work", s) for s in sources])
    # Before: "OSError(36, 'File name too long')" for each, status 4.
    assert main([str(meas)]) == 0, capsys.readouterr().err
    written = sorted((meas / "structs").glob("é*"))
    assert len(written) == 2
    assert all(len(p.name.encode()) <= 255 and p.name.startswith("é" * 50) for p in written)
    described = sorted(hpcstruct.read(p).modules[0].attrs["n"] for p in written)
    assert described == sorted(map(str, sources))
    assert main([str(meas)]) == 0  # a second run finds them unchanged (the manifest's names)
    assert sorted((meas / "structs").glob("é*")) == written
    # One target: its default output name in the current directory is shortened alike.
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([str(sources[0])]) == 0
    (out,) = tmp_path.glob("*.hpcstruct")
    assert len(out.name.encode()) <= 255 and out.name.startswith("é" * 50)
    assert capsys.readouterr().err == f"wrote {out.name}\n"
    assert hpcstruct.read(out).modules[0].attrs["n"] == str(sources[0])


def test_a_cached_python_source_under_another_path_names_that_path(tmp_path: Path) -> None:
    """One Python source at two paths: the second's structure names its own file in ``F`` and
    ``L``, not the first's (the cache key holds the path; issue #36, item 8)."""
    source = "def f(n):\n    for i in range(n):\n        pass\n"
    cache = tmp_path / "cache"
    for where in ("one", "two"):
        program = tmp_path / where / "app.py"
        program.parent.mkdir()
        program.write_text(source)
        out = tmp_path / f"{where}.hpcstruct"
        assert main(["-q", "--cache", str(cache), str(program), "-o", str(out)]) == 0
        (module,) = hpcstruct.read(out).modules
        named = {s.attrs.get("n") or s.attrs.get("f") for s in module.walk()} - {None}
        assert {n for n in named if n.endswith("app.py")} == {str(program)}, named
