"""Device instructions of a cubin for ``--gpucfg yes``: nvdisasm's listing or pystruct's decoder.

Only the control flow of each instruction matters here (formats.md §4.4): where blocks end,
where branches go, and which instructions call which device function. Two sources:

* sm_70 and newer: NVIDIA's ``nvdisasm -c -novliw`` listing (PyPI: ``nvidia-cuda-nvdisasm``).
  Sections and symbols are matched to the ELF file by position, not only by name: a cubin linked
  from several units (``nvcc -rdc``, ``nvlink``) holds one local copy of each CUDA math helper
  (``__cuda_sm20_div_rn_f64_full``, ...) per unit, all with the same section and symbol name,
  which nvdisasm prints as ``NAME__1`` / ``NAME__0`` with ``.map_symbolname`` lines (whose
  numbers need not be the section line's: :func:`_listed_sections`);
* sm_5x/sm_6x (Maxwell, Pascal), which nvdisasm 13 no longer reads: pystruct decodes the few
  opcodes that change control flow itself.

Calls whose target is an absolute address (Volta+ ``CALL.ABS``, Maxwell/Pascal ``JCAL``) carry
a relocation at the instruction; its symbol is the callee, so a call into another unit or into a
math helper is a call site whatever the listing names it. Calls into other images (``vprintf``,
undefined here) are not call sites, as in hpcstruct, whose call targets must be functions of the
cubin. An architecture the installed nvdisasm refuses is an error that says which one and what
would work, never an empty CFG.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from pyhpctk.errors import FormatError, PyhpctkError
from pyhpctk.structure.cfg import Flow, Instruction
from pyhpctk.structure.elfimage import CodeRegion, ElfImage


class NvdisasmMissing(PyhpctkError):
    """``--gpucfg yes`` needs nvdisasm and it is not installed (or cannot read this cubin)."""

    exit_code = 3


def find_nvdisasm() -> str | None:
    """nvdisasm from $NVDISASM, the PATH, or the ``nvidia-cuda-nvdisasm`` wheel."""
    env = os.environ.get("NVDISASM")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("nvdisasm")
    if found:
        return found
    for base in sys.path:
        nvidia = Path(base) / "nvidia"
        if nvidia.is_dir():
            for candidate in sorted(nvidia.glob("*/bin/nvdisasm")) + sorted(
                nvidia.glob("cuda_nvdisasm/bin/nvdisasm")
            ):
                if os.access(candidate, os.X_OK):
                    return str(candidate)
    return None


# --------------------------------------------------------------------------- call relocations


def call_relocations(image: ElfImage) -> dict[int, int]:
    """Address of each code relocation whose symbol is a function of this cubin -> its entry.

    These are the absolute calls (``CALL.ABS``, ``JCAL``) the driver patches at load time; the
    relocation names the callee exactly, even where several local functions share its name.
    Relocations against undefined symbols (``vprintf``) or data are left out.
    """
    elf = image.elf
    out: dict[int, int] = {}
    for section in elf.iter_sections():
        if not isinstance(section, RelocationSection):
            continue
        base = image.section_base.get(int(section["sh_info"]))
        if base is None:  # relocations of debug sections or data
            continue
        symtab = elf.get_section(section["sh_link"])
        if not isinstance(symtab, SymbolTableSection):
            continue
        for reloc in section.iter_relocations():
            symbol = symtab.get_symbol(int(reloc["r_info_sym"]))
            shndx = symbol["st_shndx"]
            if symbol["st_info"]["type"] != "STT_FUNC" or not isinstance(shndx, int):
                continue
            target_base = image.section_base.get(shndx)
            if target_base is None:
                continue
            out[base + int(reloc["r_offset"])] = target_base + int(symbol["st_value"])
    return out


# --------------------------------------------------------------------------- nvdisasm


_SECTION = re.compile(r"^\s*\.section\s+([^,\s]+)")
_MAP_NAME = re.compile(r"^\s*\.map_symbolname\s+(\S+)\s+(\S+)")
_LABEL = re.compile(r"^([.$\w][\w.$@]*):\s*$")
_INSN = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(.*?)\s*;?\s*(?:/\*.*)?$")
_TARGET = re.compile(r"`\(([^)]+)\)")
_REFUSED = re.compile(r"deprecated|not supported|unsupported", re.IGNORECASE)
_ARCH = re.compile(r"architecture|\bSM_?\d+", re.IGNORECASE)


def _classify_sass(text: str) -> tuple[Flow, str | None]:
    predicated = text.startswith("@")
    body = text.split(None, 1)[1] if predicated and " " in text else text
    opcode = body.split(None, 1)[0] if body else ""
    base = opcode.split(".", 1)[0]
    m = _TARGET.search(body)
    label = m.group(1) if m else None
    if base in ("BRA", "JMP", "BRX", "JMX"):
        if base in ("BRX", "JMX"):
            label = None
        return (Flow.BRANCH if predicated else Flow.JUMP), label
    if base in ("CALL", "CAL", "JCAL"):
        return Flow.CALL, label
    if base in ("EXIT", "RET", "KILL"):
        return (Flow.BRANCH if predicated else Flow.RETURN), None
    return Flow.NEXT, None


def _run_nvdisasm(image: ElfImage, nvdisasm: str) -> str:
    try:
        result = subprocess.run(
            [nvdisasm, "-c", "-novliw", image.path],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise FormatError(image.path, "nvdisasm", f"cannot run {nvdisasm}: {error}") from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        said = lines[-1].strip() if lines else f"exit status {result.returncode}"
        if _REFUSED.search(said) and _ARCH.search(said):
            raise NvdisasmMissing(_refusal(image, nvdisasm, said))
        raise FormatError(image.path, "nvdisasm", said)
    return result.stdout


def _refusal(image: ElfImage, nvdisasm: str, said: str) -> str:
    """The message for an architecture this nvdisasm no longer reads: which, and what works."""
    said = re.sub(r"^nvdisasm\s+fatal\s*:\s*", "", said)
    return (
        f"{image.path}: --gpucfg yes: {nvdisasm} does not read sm_{image.cuda_arch} cubins "
        f"({said}); give pystruct an nvdisasm that does with --nvdisasm PATH or "
        "$NVDISASM, or leave out --gpucfg: the plain structure needs no disassembler"
    )


def _listed_sections(listing: str) -> list[tuple[str, str]]:
    """(nvdisasm's name, the ELF name) of each section of the listing, in its order.

    A duplicate's ``.section NAME__k`` line is followed by ``.map_symbolname`` lines that give
    its ELF name; their first field does not always repeat the section line's name, because
    nvdisasm numbers section and symbol names with one counter (the third copy of a helper is
    ``.section .text.H__2`` but ``.map_symbolname .text.H__7 .text.H``). So the map line that
    follows a section line names that section, whatever its first field says.
    """
    out: list[tuple[str, str]] = []
    mapped = True
    for line in listing.splitlines():
        m = _SECTION.match(line)
        if m:
            out.append((m.group(1), m.group(1)))
            mapped = False
            continue
        m = _MAP_NAME.match(line)
        if m and out and not mapped and m.group(2).startswith(".text"):
            out[-1] = (out[-1][0], m.group(2))
            mapped = True
    return out


def _section_regions(image: ElfImage, listing: str) -> dict[str, CodeRegion]:
    """nvdisasm's name of each code section -> its region, duplicates taken in ELF order."""
    queues: dict[str, list[CodeRegion]] = {}
    for region in sorted(image.regions, key=lambda r: r.index):
        queues.setdefault(region.name, []).append(region)
    out: dict[str, CodeRegion] = {}
    for listed, name in _listed_sections(listing):
        queue = queues.get(name)
        if listed not in out and queue:
            out[listed] = queue.pop(0)
    return out


def nvdisasm_instructions(image: ElfImage, nvdisasm: str) -> dict[int, list[Instruction]]:
    """Instructions of every code section (relocated addresses), keyed by section base."""
    listing = _run_nvdisasm(image, nvdisasm)
    sections = _section_regions(image, listing)
    raw: dict[int, list[tuple[int, Flow, str | None]]] = {}
    labels: dict[str, int] = {}
    current: int | None = None
    pending: list[str] = []
    for line in listing.splitlines():
        m = _SECTION.match(line)
        if m:
            region = sections.get(m.group(1))
            current = region.start if region is not None else None
            pending = []
            continue
        if current is None:
            continue
        m = _LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _INSN.match(line)
        if m:
            address = current + int(m.group(1), 16)
            for name in pending:
                labels[name] = address  # the listing's own (disambiguated) names come first
            pending = []
            kind, target_label = _classify_sass(m.group(2))
            raw.setdefault(current, []).append((address, kind, target_label))
    missing = [
        r.name
        for r in image.regions
        if r.start not in raw and any(r.start <= f.start < r.end for f in image.functions)
    ]
    if missing:
        raise FormatError(
            image.path, "nvdisasm", f"no instructions listed for {', '.join(sorted(missing))}"
        )
    symbols = {f.link_name: f.start for f in image.functions}
    relocated = call_relocations(image)
    entries = {f.start for f in image.functions}
    step = 16 if image.cuda_arch >= 70 else 8
    out: dict[int, list[Instruction]] = {}
    for base, items in raw.items():
        insns = []
        for address, flow, wanted in items:
            target = None
            if wanted:
                target = labels.get(wanted, symbols.get(wanted))
            if flow == Flow.CALL:
                target = relocated.get(address, target)
                if target is None or target not in entries:
                    flow = Flow.NEXT  # calls into other images (vprintf) are not call sites
            insns.append(Instruction(address, step, flow, target))
        out[base] = insns
    return out


# --------------------------------------------------------------------------- Maxwell, Pascal

# Maxwell/Pascal (sm_5x, sm_6x) encoding: 32-byte bundles of one control word and three 64-bit
# instructions. Control-flow opcodes sit in the top 12 bits; the guard predicate in bits 16-19
# (index 7 = PT, bit 19 negates); branch offsets are a signed 24-bit field in bits 20-43,
# relative to the next instruction. JCAL's target is absolute and filled in through a relocation.
_MAXWELL_BRA, _MAXWELL_BRX, _MAXWELL_JCAL, _MAXWELL_CAL = 0xE24, 0xE25, 0xE22, 0xE26
_MAXWELL_SSY, _MAXWELL_EXIT, _MAXWELL_RET, _MAXWELL_KIL = 0xE29, 0xE30, 0xE32, 0xE33
_MAXWELL_BRK, _MAXWELL_CONT, _MAXWELL_JMX, _MAXWELL_JMP = 0xE34, 0xE35, 0xE20, 0xE21
_MAXWELL_SYNC16 = 0xF0F8


def maxwell_instructions(image: ElfImage) -> list[Instruction]:
    """Instructions of every code region of an sm_5x/sm_6x cubin, control words included."""
    out: list[Instruction] = []
    entries = {f.start for f in image.functions}
    relocated = call_relocations(image)
    for region in image.regions:
        data = region.data
        count = len(data) // 8
        words = np.frombuffer(data[: count * 8], dtype="<u8")
        ssy: list[tuple[int, int]] = []  # (address of SSY, reconvergence target)
        decoded: list[tuple[int, Flow, int | None, bool]] = []
        for k in range(count):
            address = region.start + 8 * k
            if k % 4 == 0:
                decoded.append((address, Flow.NEXT, None, False))
                continue
            w = int(words[k])
            op = w >> 52
            pred = (w >> 16) & 0xF
            guarded = pred != 7
            offset = (w >> 20) & 0xFFFFFF
            if offset & 0x800000:
                offset -= 1 << 24
            relative = address + 8 + offset
            if op == _MAXWELL_BRA:
                decoded.append((address, Flow.BRANCH if guarded else Flow.JUMP, relative, False))
            elif op in (_MAXWELL_BRX, _MAXWELL_JMX):
                decoded.append((address, Flow.BRANCH if guarded else Flow.JUMP, None, False))
            elif op == _MAXWELL_CAL:
                flow = Flow.CALL if relative in entries else Flow.NEXT
                decoded.append((address, flow, relative, False))
            elif op == _MAXWELL_JCAL:
                # Absolute: the callee is the relocation's symbol; without one (vprintf, other
                # images) it is no call site of this cubin.
                callee = relocated.get(address)
                flow = Flow.CALL if callee in entries else Flow.NEXT
                decoded.append((address, flow, callee, False))
            elif op in (_MAXWELL_EXIT, _MAXWELL_RET, _MAXWELL_KIL):
                decoded.append((address, Flow.BRANCH if guarded else Flow.RETURN, None, False))
            elif op == _MAXWELL_SSY:
                ssy.append((address, relative))
                decoded.append((address, Flow.NEXT, None, False))
            elif (w >> 48) == _MAXWELL_SYNC16:
                decoded.append((address, Flow.BRANCH if guarded else Flow.JUMP, None, True))
            else:
                decoded.append((address, Flow.NEXT, None, False))
        for address, flow, target, is_sync in decoded:
            if is_sync:
                # SYNC continues at the reconvergence point of the innermost SSY before it.
                open_ssy = [(a, t) for a, t in ssy if a < address < t]
                target = max(open_ssy)[1] if open_ssy else None
            out.append(Instruction(address, 8, flow, target))
    return out
