"""pystruct on cubins beyond the reference data (issue #20, items 3-5).

Fixtures (tests/data/cubin/README.md, rebuilt by build.sh from units/*.cu with CUDA 13):

* ``units_lineinfo_sm_75.cubin``: four units (``-rdc=true -lineinfo``) linked by nvlink. Every
  unit inlines device functions, kernels call across units, units c and d each bring a copy of
  the double-division helper ``__cuda_sm20_div_rn_f64_full`` (same section and symbol name);
* ``names_G_sm_75.cubin``: template functions and a template kernel, ``-G``;
* ``copies_sm_75.cubin``: four units each with its own copy of two math helpers.

Lines and inline call sites are checked against ``nvdisasm -gi``, calls against nvdisasm's
listing; names against the sources (which function is defined on which line). Older
architectures come from documented transformations of these files and of the sm_62 reference
cubin: e_flags patched to sm_70, a ``JCAL`` relocation pointed at a function of the cubin.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from pyhpctk.cli.pystruct import main
from pyhpctk.formats import hpcstruct
from pyhpctk.formats.hpcstruct_model import ALIEN, CALL, FILE, PROCEDURE, Scope
from pyhpctk.structure import dwarf
from pyhpctk.structure.cubin import find_nvdisasm, read_cubin_debug
from pyhpctk.structure.driver import StructOptions, analyze_target
from pyhpctk.structure.elfimage import open_image
from pyhpctk.structure.sass import nvdisasm_instructions

DATA = Path(__file__).resolve().parent / "data" / "cubin"
UNITS = DATA / "units_lineinfo_sm_75.cubin"
NAMES = DATA / "names_G_sm_75.cubin"
COPIES = DATA / "copies_sm_75.cubin"

# The inlined functions of units/*.cu, by (file, line of their body), as hpcstruct names them:
# demangled linkage names without a template's return type (DMGL_RET_DROP).
INLINED = {
    ("a.cu", 3): "a_scale(int)",
    ("b.cu", 3): "b_split<int>(int)",
    ("b.cu", 4): "b_mix(int)",
    ("c.cu", 2): "c_ratio(double, double)",
    ("d.cu", 2): "d_norm(double, double)",
}


def _nvdisasm(*args: str) -> str:
    tool = find_nvdisasm()
    assert tool is not None, "nvdisasm is part of the dev extra (nvidia-cuda-nvdisasm)"
    return subprocess.run([tool, *args], capture_output=True, text=True, check=True).stdout


def _section_offsets(path: Path, listing: str) -> dict[str, int]:
    """nvdisasm's section names -> file offsets; duplicates (``NAME__1``) in ELF order."""
    with path.open("rb") as stream:
        elf = ELFFile(stream)
        queues: dict[str, deque[int]] = {}
        for section in elf.iter_sections():
            if section.name.startswith(".text."):
                queues.setdefault(section.name, deque()).append(int(section["sh_offset"]))
    aliases = dict(re.findall(r"\.map_symbolname\s+(\S+)\s+(\S+)", listing))
    out = {}
    for name in re.findall(r"^\s*\.section\s+(\.text\.[^,\s]+)", listing, re.M):
        out[name] = queues[aliases.get(name, name)].popleft()
    return out


Location = tuple[str, int, tuple[tuple[str, int], ...]]
_NOTE = re.compile(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')


def _nvdisasm_lines(path: Path) -> dict[int, Location]:
    """Address -> (file, line, inline call sites outermost first) from ``nvdisasm -gi``."""
    listing = _nvdisasm("-gi", "-c", str(path))
    offsets = _section_offsets(path, listing)
    out: dict[int, Location] = {}
    base = 0
    block: list[tuple[str, int, tuple[str, int] | None]] = []
    fresh = False
    for line in listing.splitlines():
        section = re.match(r"^\s*\.section\s+([^,\s]+)", line)
        if section:
            base, block = offsets.get(section.group(1), -1), []
            continue
        note = _NOTE.match(line)
        if note:
            if not fresh:
                block, fresh = [], True
            site = (note.group(3), int(note.group(4))) if note.group(3) else None
            block.append((note.group(1), int(note.group(2)), site))
            continue
        insn = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if insn and block and base >= 0:
            fresh = False
            sites = tuple(site for _, _, site in reversed(block) if site is not None)
            out[base + int(insn.group(1), 16)] = (block[0][0], block[0][1], sites)
    return out


def _procedures(path: Path, gpucfg: bool = False) -> dict[str, Scope]:
    structure = analyze_target(path, StructOptions(gpucfg=gpucfg, resolve_paths=False))
    return {s.name: s for s in structure.modules[0].walk() if s.tag == PROCEDURE}


def _inlined_names(proc: Scope) -> set[str]:
    return {s.name for s in proc.walk() if s.tag == ALIEN and s.name not in ("", "<inline>")}


def test_every_unit_of_a_linked_cubin_has_its_own_lines_inline_sites_and_names() -> None:
    expected = _nvdisasm_lines(UNITS)
    info = read_cubin_debug(open_image(str(UNITS)), resolve_paths=False)
    seen_units: set[str] = set()
    for address, (file, line, sites) in expected.items():
        hit = info.line_map.lookup(address)
        assert hit is not None and (hit[0], hit[1]) == (file, line), hex(address)
        node = int(info.inlines.nodes_for(np.array([address], np.uint64), address, address + 1)[0])
        chain = info.inlines.chain(node)
        assert tuple((c.file, c.line) for c in chain) == sites, hex(address)
        # The callee of each call is the function whose body holds the next location inward.
        inner = [(c.file, c.line) for c in chain[1:]] + [(file, line)] * bool(chain)
        for call, (body_file, body_line) in zip(chain, inner, strict=True):
            assert call.name == INLINED[(Path(body_file).name, body_line)], hex(address)
            seen_units.add(Path(body_file).name)
    assert seen_units == {"a.cu", "b.cu", "c.cu", "d.cu"}

    # What users read: every unit's procedures under its own file, with its inlined functions.
    structure = analyze_target(UNITS, StructOptions(resolve_paths=False))
    files = {
        p.name: Path(f.name).name
        for f in structure.modules[0].walk()
        if f.tag == FILE
        for p in f.walk()
        if p.tag == PROCEDURE
    }
    assert files["a_work(int)"] == "a.cu" and files["b_work(int)"] == "b.cu"
    assert files["ka(int*, int)"] == "a.cu" and files["kb(int*)"] == "b.cu"
    assert files["kc(double*, double)"] == "c.cu" and files["kd(double*, double)"] == "d.cu"
    procs = _procedures(UNITS)
    assert _inlined_names(procs["a_work(int)"]) == {"a_scale(int)"}
    assert _inlined_names(procs["b_work(int)"]) == {"b_mix(int)", "b_split<int>(int)"}
    assert _inlined_names(procs["c_work(int)"]) == {"c_ratio(double, double)"}
    assert _inlined_names(procs["kc(double*, double)"]) == {"c_ratio(double, double)"}
    assert _inlined_names(procs["kd(double*, double)"]) == {"d_norm(double, double)"}


def test_calls_into_other_units_and_math_helpers_reach_the_right_copy() -> None:
    listing = _nvdisasm("-c", str(UNITS))
    offsets = _section_offsets(UNITS, listing)
    labels: dict[str, int] = {}
    calls: list[tuple[int, str]] = []
    base = 0
    pending: list[str] = []
    for line in listing.splitlines():
        section = re.match(r"^\s*\.section\s+([^,\s]+)", line)
        label = re.match(r"^([$\w.]+):\s*$", line)
        insn = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if section:
            base = offsets[section.group(1)]
        elif label:
            pending.append(label.group(1))
        elif insn:
            address = base + int(insn.group(1), 16)
            labels.update(dict.fromkeys(pending, address))
            pending = []
            callee = re.search(r"CALL\.\S+\s+`\(([^)]+)\)", insn.group(2))
            if callee:
                calls.append((address, callee.group(1)))
    expected = sorted((address, labels[name]) for address, name in calls)
    helpers = sorted(offsets[n] for n in offsets if "__cuda_sm20_div_rn_f64_full" in n)
    assert len(helpers) == 2 and len(expected) >= 10
    assert {t for _, t in expected} >= set(helpers)  # both copies are called

    procs = _procedures(UNITS, gpucfg=True)
    found = sorted(
        (s.ranges[0][0], s.call_target) for p in procs.values() for s in p.walk() if s.tag == CALL
    )
    assert found == expected


def test_a_function_nvdisasm_lists_no_instructions_for_is_an_error_not_an_empty_cfg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quiet = tmp_path / "nvdisasm"
    quiet.write_text("#!/bin/sh\necho '\t.headerflags\t@\"EF_CUDA_SM75\"'\n")
    quiet.chmod(0o755)
    out = tmp_path / "o.hpcstruct"
    args = [str(UNITS), "--gpucfg", "yes", "--nvdisasm", str(quiet), "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no instructions listed for" in err and ".text._Z2kaPii" in err
    assert not out.exists()


def _as_sm70(source: Path, target: Path) -> Path:
    """The cubin as a CUDA <= 12 toolkit writes sm_70: ELF ABI version 7, SM in e_flags' low byte.

    0x00460546 = virtual arch 70 << 16 | EF_CUDA_64BIT_ADDRESS | EF_CUDA_TEXMODE_UNIFIED | sm 70.
    """
    data = bytearray(source.read_bytes())
    data[7], data[8] = 0x33, 7  # EI_OSABI (ELFOSABI_CUDA), EI_ABIVERSION
    struct.pack_into("<I", data, 0x30, 0x00460546)
    target.write_bytes(bytes(data))
    return target


def test_an_architecture_nvdisasm_refuses_is_named_with_what_would_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    volta = _as_sm70(UNITS, tmp_path / "volta.cubin")
    assert open_image(str(volta)).cuda_arch == 70
    out = tmp_path / "o.hpcstruct"
    assert main([str(volta), "--gpucfg", "yes", "-o", str(out)]) == 3
    err = capsys.readouterr().err
    assert "sm_70" in err and "--nvdisasm PATH" in err and "leave out --gpucfg" in err
    assert "Traceback" not in err and not out.exists()
    # The plain structure needs no disassembler.
    assert main([str(volta), "-o", str(out)]) == 0
    assert {"b_work(int)", "kd(double*, double)"} <= {
        s.name for s in hpcstruct.read(out).modules[0].walk() if s.tag == PROCEDURE
    }


def test_jcal_through_a_relocation_is_a_call_to_that_function(
    reference: Path, tmp_path: Path
) -> None:
    """sm_62: an absolute JCAL whose relocation names a function of the cubin.

    ``nvcc -rdc`` builds for Maxwell/Pascal call other units' functions (and the math helpers)
    this way; CUDA 13 cannot build sm_6x, so the reference cubin's JCAL to ``vprintf`` in f4_1
    (at 0xd8 of its section) gets its relocation's symbol pointed at ``f1`` instead.
    """
    name = "inlines+loops-sm_62-nvcc102-dr"
    data = bytearray((reference / "bin" / name).read_bytes())
    with (reference / "bin" / name).open("rb") as stream:
        elf = ELFFile(stream)
        symtab = elf.get_section_by_name(".symtab")
        f1 = next(i for i, s in enumerate(symtab.iter_symbols()) if s.name == "_Z2f1v")
        rel = elf.get_section_by_name(".rel.text._Z4f4_1v")
        assert isinstance(rel, RelocationSection)
        (k,) = [
            i
            for i, r in enumerate(rel.iter_relocations())
            if symtab.get_symbol(r["r_info_sym"]).name == "vprintf"
        ]
        entry = int(rel["sh_offset"]) + k * int(rel["sh_entsize"])
        text = elf.get_section_by_name(".text._Z4f4_1v")
        jcal = int(text["sh_offset"]) + 0xD8
        assert struct.unpack_from("<Q", data, jcal)[0] >> 52 == 0xE22  # JCAL
        r_type = struct.unpack_from("<Q", data, entry + 8)[0] & 0xFFFFFFFF
        struct.pack_into("<Q", data, entry + 8, f1 << 32 | r_type)
    patched = tmp_path / name
    patched.write_bytes(bytes(data))

    procs = _procedures(patched, gpucfg=True)
    original = _procedures(reference / "bin" / name, gpucfg=True)
    entry_f1 = procs["f1()"].ranges[0][0]
    calls = {s.ranges[0][0]: s.call_target for s in procs["f4_1()"].walk() if s.tag == CALL}
    before = {s.ranges[0][0]: s.call_target for s in original["f4_1()"].walk() if s.tag == CALL}
    assert calls == {**before, jcal: entry_f1}


def test_inlined_functions_keep_the_plain_name_hpcstruct_reads_in_G_cubins() -> None:
    # NVCC's -G DIEs carry DW_AT_name ("mix") and DW_AT_MIPS_linkage_name ("_Z3mixi"); Dyninst,
    # hence hpcstruct, reads only DW_AT_linkage_name, so the plain name is what it prints.
    procs = _procedures(NAMES)
    assert set(procs) == {"widen<int>(int)", "kt<int>(int*)"}
    assert procs["widen<int>(int)"].attrs["ln"] == "_Z5widenIiE4PairIT_ES1_"
    for proc in procs.values():
        assert _inlined_names(proc) == {"mix", "split<int>"}


@pytest.mark.parametrize(
    ("mangled", "printed"),
    [
        ("_Z7b_splitIiE4PairIT_ES1_", "b_split<int>(int)"),
        ("_Z2ktIiEvPT_", "kt<int>(int*)"),
        ("_ZN1S3getIiEEPT_v", "S::get<int>()"),
        ("_ZNK1A1fIiEEiT_", "A::f<int>(int) const"),
        ("_ZN12_GLOBAL__N_14tfunIiEEvT_", "(anonymous namespace)::tfun<int>(int)"),
        ("_ZltIiEbRK1AIT_ES4_", "operator< <int>(A<int> const&, A<int> const&)"),
        ("_Z5b_mixi", "b_mix(int)"),
        ("main", "main"),
    ],
)
def test_template_return_types_are_dropped_as_hpcstruct_prints_names(
    mangled: str, printed: str
) -> None:
    assert dwarf.demangle_many([mangled]) == [printed]


def test_every_copy_of_a_helper_gets_its_own_instructions(tmp_path: Path) -> None:
    """Issue #36, item 10: four units each bring a copy of the sqrt and division helpers.

    nvdisasm numbers the duplicates' section and symbol names with one counter (the third
    sqrt copy is ``.section …dsqrt…__2`` but ``.map_symbolname …dsqrt…__7``). The truth here
    is the listing read by position: it lists the code sections in the ELF file's order.
    """
    listing = _nvdisasm("-c", "-novliw", str(COPIES))
    listed: list[tuple[str, list[int]]] = []
    for line in listing.splitlines():
        section = re.match(r"^\s*\.section\s+(\.text\.[^,\s]+)", line)
        insn = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if section:
            listed.append((section.group(1), []))
        elif insn and listed:
            listed[-1][1].append(int(insn.group(1), 16))
    image = open_image(str(COPIES))
    regions = sorted(image.regions, key=lambda r: r.index)
    assert [re.sub(r"__\d+$", "", name) for name, _ in listed] == [r.name for r in regions]
    helpers = [r for r in regions if "__cuda_sm20" in r.name]
    assert len(helpers) == 8 and len({r.name for r in helpers}) == 2

    tool = find_nvdisasm()
    assert tool is not None
    found = nvdisasm_instructions(image, tool)
    for region, (_, offsets) in zip(regions, listed, strict=True):
        assert [i.address for i in found[region.start]] == [region.start + o for o in offsets]
        assert len(offsets) == (region.end - region.start) // 16  # the whole section

    # What users read: pystruct writes the structure, every copy a procedure of its own whose
    # statements cover its section, and each unit's kernel calls its own unit's copies (the
    # sections of unit k come before its kernel k in ELF order).
    out = tmp_path / "copies.hpcstruct"
    assert main([str(COPIES), "--gpucfg", "yes", "-o", str(out)]) == 0
    procs = [s for s in hpcstruct.read(out).modules[0].walk() if s.tag == PROCEDURE]
    copies = [p for p in procs if p.name.startswith("__cuda_sm20")]
    assert sorted(p.ranges[0][0] for p in copies) == [r.start for r in helpers]
    for proc in copies:
        region = next(r for r in helpers if r.start == proc.ranges[0][0])
        covered = sum(e - b for s in proc.walk() if s is not proc for b, e in s.ranges)
        assert covered == region.end - region.start, proc.name
    for unit in range(4):
        kernel = next(p for p in procs if p.name.startswith(f"k{unit}("))
        mine = [r.start for r in helpers][2 * unit : 2 * unit + 2]
        targets = sorted(s.call_target for s in kernel.walk() if s.tag == CALL)
        assert targets == mine, kernel.name
