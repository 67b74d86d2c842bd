"""Reader bugs found while fuzzing the formats (issue #15), each pinned by the file that shows it.

- hpcstruct: an address past 64 bits, a line or call target that is no number passed the reader
  and broke pyprof with a traceback (``OverflowError``/``ValueError`` in structure lookup).
- ``.hpcrun`` and ``logical/`` files: a NUL byte inside a string (a file name, a load module
  path) was read into a name no database can hold, and pyprof died writing meta.db
  (``ValueError``). hpcrun writes C strings; the readers now refuse a NUL inside one.
- The database files: arrays that alias (profiles sharing one value block, contexts sharing one
  block, trace lines sharing elements, metrics sharing scope instances, id tuples inside one
  another, strings inside one another) let a small file name the square of its size in values,
  so ``verify`` (which transposes profile.db) or a viewer allocated far more memory than the file
  holds. hpcprof gives every non-empty array its own bytes (formats.md §3.6); the readers now
  refuse files whose arrays overlap.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from fuzz_helpers import memory_cap, time_budget
from pyhpctk.cli.main import main as pyhpctk
from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.errors import FormatError
from pyhpctk.formats import cctdb, hpcrun, hpcstruct, logical, metadb, profiledb, tracedb
from pyhpctk.formats.hpcrun_model import CCT_NODE_DTYPE, LoadModule

SMALL_STRUCT = "testmeas-small.hpcstruct"


def db_copy(reference: Path, tmp_path: Path, name: str, file: str) -> Path:
    path = tmp_path / file
    shutil.copyfile(reference / "dbase" / name / file, path)
    return path


def u64(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<Q", data, at)[0])


def copy_bytes(path: Path, source: int, dest: int, size: int) -> None:
    data = bytearray(path.read_bytes())
    data[dest : dest + size] = data[source : source + size]
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------
# hpcstruct


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('v="{[0x1129-0x1131)}"', 'v="{[0xffffffffffffffffff-0x1131)}"', "bad address set"),
        # The loop body's statement, where samples fall (its line becomes a context).
        ('<S i="10" l="3"', '<S i="10" l="x"', "line l='x' is not a line number"),
        ('<S i="10" l="3"', '<S i="10" l="99999999999"', "line l='99999999999' is not a line"),
    ],
)
def test_a_structure_number_tools_cannot_use_is_refused_and_pyprof_says_so_in_one_line(
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    message: str,
) -> None:
    meas = tmp_path / "small.m"
    shutil.copytree(reference / "meas" / "small.m", meas)
    struct_file = meas / "structs" / SMALL_STRUCT
    text = struct_file.read_text()
    assert old in text
    struct_file.chmod(0o644)
    struct_file.write_text(text.replace(old, new, 1))
    with pytest.raises(FormatError, match=message):
        hpcstruct.read(struct_file)
    # Before: pyprof died with a traceback building its structure index.
    assert pyprof(["-o", str(tmp_path / "out.d"), "--no-sources", str(meas)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"pyprof: error: {struct_file}: line ") and message in err[-1]


def test_a_call_target_past_64_bits_is_refused() -> None:
    text = (
        '<?xml version="1.0"?>\n<HPCToolkitStructure i="0" version="4.9" n="">\n'
        '<LM i="2" n="x" has-calls="1" v="{}">\n<F i="3" n="a.c">\n'
        '<P i="4" n="f" l="1" v="{[0x10-0x11)}">\n'
        '<C i="5" l="1" v="{[0x10-0x14)}" t="0x1ffffffffffffffff"/>\n'
        "</P>\n</F>\n</LM>\n</HPCToolkitStructure>\n"
    )
    with pytest.raises(FormatError, match="call target t='0x1ffffffffffffffff' is not a 64-bit"):
        hpcstruct.read(text.encode())
    assert hpcstruct.read(text.replace("0x1ffffffffffffffff", "0x20").encode()).modules


# ---------------------------------------------------------------------------------------------
# NUL bytes inside C strings


def test_a_nul_in_a_python_file_name_is_refused_and_pyprof_analyses_the_rest(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meas = tmp_path / "m"
    meas.mkdir()
    stem = "testmeas-small-000000-000-11ac0300-5560-0"
    for suffix in (".hpcrun", ".hpctrace"):
        shutil.copyfile(reference / "meas" / "small.m" / (stem + suffix), meas / (stem + suffix))
    profile = hpcrun.read(meas / (stem + ".hpcrun"))
    profile.load_modules = [*profile.load_modules, LoadModule(18, "logical/python.00000001", 0)]
    frame = np.array([(42, 20, 18, (1 << 32) | 5, 1)], CCT_NODE_DTYPE)
    profile.cct = np.concatenate([profile.cct, frame])
    hpcrun.write(profile, meas / (stem + ".hpcrun"))
    (meas / "logical").mkdir()
    # A stanza written by hand: fid 1, funcname "main", mangling 0, filename "app.p\0", line 4.
    stanza = struct.pack(">I", 1) + struct.pack(">I", 4) + b"main" + b"\0"
    stanza += struct.pack(">I", 6) + b"app.p\0" + struct.pack(">I", 4)
    (meas / "logical" / "python.00000001").write_bytes(b"HPCLOGICAL" + stanza)
    with pytest.raises(FormatError, match="stanza 0: filename holds a NUL byte"):
        logical.read(meas / "logical" / "python.00000001")
    # Before: pyprof died with a traceback writing meta.db (a NUL in a string).
    assert pyprof(["-o", str(tmp_path / "out.d"), "--no-sources", str(meas)]) == 0
    capsys.readouterr()
    assert pyhpctk(["verify", str(tmp_path / "out.d")]) == 0


def test_a_nul_in_a_load_module_path_is_refused_by_the_reader_and_the_writer(
    reference: Path,
) -> None:
    small = reference / "meas" / "small.m" / "testmeas-small-000000-000-11ac0300-5560-0.hpcrun"
    data = bytearray(small.read_bytes())
    at = data.index(b"/usr/lib/x86_64-linux-gnu/ld-2.31.so")
    data[at + 4] = 0
    with pytest.raises(FormatError, match=r"load map: load module path at offset 0x\w+ holds"):
        hpcrun.read(bytes(data))
    profile = hpcrun.read(small)
    profile.load_modules[1].path = "/usr\0/lib"
    with pytest.raises(ValueError, match="cannot hold NUL"):
        hpcrun.to_bytes(profile)


# ---------------------------------------------------------------------------------------------
# Aliased arrays in the database files


def test_profiles_sharing_one_value_block_are_refused(reference: Path, tmp_path: Path) -> None:
    path = db_copy(reference, tmp_path, "loops-cputime-t.d", "profile.db")
    infos = u64(path.read_bytes(), 0x30)  # ProfileInfos section: pProfiles (formats.md §3.3)
    # Profile 3's block (counts and pointers, 0x20 bytes of its {PI}) becomes profile 2's.
    copy_bytes(path, infos + 2 * 48, infos + 3 * 48, 0x20)
    with pytest.raises(FormatError, match="profile 2 values and profile 3 values overlap"):
        profiledb.read(path)


def test_id_tuples_inside_one_another_are_refused(reference: Path, tmp_path: Path) -> None:
    path = db_copy(reference, tmp_path, "loops-cputime-t.d", "profile.db")
    data = bytearray(path.read_bytes())
    infos = u64(data, 0x30)
    inside = u64(data, infos + 48 + 0x20) + 8  # profile 1's tuple, past its 8-byte header
    struct.pack_into("<Q", data, infos + 2 * 48 + 0x20, inside)
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"IdTuples: the id tuples at 0x[0-9a-f]+ and 0x"):
        profiledb.read(path)


def test_contexts_sharing_one_value_block_are_refused(reference: Path, tmp_path: Path) -> None:
    path = db_copy(reference, tmp_path, "small.d", "cct.db")
    infos = u64(path.read_bytes(), 0x30)  # CtxInfos section: pCtxs (formats.md §3.4)
    copy_bytes(path, infos, infos + 32, 32)  # context 1's {CI} becomes context 0's
    with pytest.raises(FormatError, match="context 0 values and context 1 values overlap"):
        cctdb.read(path)


def test_trace_lines_sharing_elements_are_refused(reference: Path, tmp_path: Path) -> None:
    path = db_copy(reference, tmp_path, "loops-cputime-t.d", "trace.db")
    headers = u64(path.read_bytes(), 0x20)  # CtxTraces section: pTraces (formats.md §3.5)
    copy_bytes(path, headers + 8, headers + 24 + 8, 16)  # line 1's pStart, pEnd := line 0's
    with pytest.raises(FormatError, match="trace line 0 elements and trace line 1 elements"):
        tracedb.read(path)


def test_metrics_sharing_scope_instances_are_refused(reference: Path, tmp_path: Path) -> None:
    path = db_copy(reference, tmp_path, "loops-cuda-nvidia-t.d", "meta.db")
    data = path.read_bytes()
    metrics = u64(data, u64(data, 0x10 + 16 * 2 + 8))  # Metrics section: pMetrics (§3.2)
    copy_bytes(path, metrics + 8, metrics + 32 + 8, 8)  # metric 1's pScopeInsts := metric 0's
    with pytest.raises(FormatError, match="scope instances of metric 0 and the scope instances"):
        metadb.read(path)


def test_strings_inside_one_another_are_refused(tmp_path: Path) -> None:
    # Every metric's name points one byte further into one long title: each name is a distinct
    # string, and together they hold far more text than the file.
    db = metadb.MetaDB(
        title="t" * 4000, metrics=[metadb.Metric.standard(f"m{i}", 4 * i) for i in range(40)]
    )
    path = tmp_path / "meta.db"
    metadb.write(db, path)
    data = bytearray(path.read_bytes())
    title = u64(data, u64(data, 0x18))  # General: pTitle
    metrics = u64(data, u64(data, 0x10 + 16 * 2 + 8))
    for i in range(40):
        struct.pack_into("<Q", data, metrics + 32 * i, title + i)
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="string pointers overlap"):
        metadb.read(path)


def test_a_profile_db_of_aliased_blocks_cannot_make_verify_allocate_its_square(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4,000 profiles (192 KB of {PI}) all naming one 100,000-value block (1 MB): 400 million
    # values, 8 GB of transposition, from a 1.2 MB file. Before: MemoryError under the cap.
    n, values = 4000, 100_000
    thread = profiledb.ProfileInfo(False, (profiledb.IdTupleElement(3, False, 0, 0),))
    block = profiledb.ProfileValues.from_triples(
        np.arange(values) // 4, np.arange(values) % 4, np.ones(values)
    )
    empty = profiledb.ProfileValues.empty()
    db = profiledb.ProfileDB(
        [profiledb.ProfileInfo(True, None)] + [thread] * (n - 1),
        [empty, block] + [empty] * (n - 2),
    )
    out = tmp_path / "big.d"
    out.mkdir()
    profiledb.write(db, out / "profile.db")
    data = bytearray((out / "profile.db").read_bytes())
    infos = u64(data, 0x30)
    for i in range(2, n):
        data[infos + 48 * i : infos + 48 * i + 0x20] = data[infos + 48 : infos + 48 + 0x20]
    (out / "profile.db").write_bytes(bytes(data))
    cct = cctdb.CctDB([cctdb.ContextValues.empty()] * (values // 4))
    cctdb.write(cct, out / "cct.db")
    metadb.write(metadb.MetaDB(metrics=[metadb.Metric.standard("m", 0)]), out / "meta.db")
    with time_budget(60), memory_cap():
        status = pyhpctk(["verify", str(out)])
    assert status == 2
    err = capsys.readouterr().err
    assert "profile.db: ProfileInfos: profile 1 values and profile 2 values overlap" in err
