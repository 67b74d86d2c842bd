"""The counter buffer as a module-level ``.global`` array (issue #34 item 2): a framework's
launcher passes only the arguments of the signature it compiled, so the probes find their
counters in a symbol of the module (read and zeroed through ``cuModuleGetGlobal``), not in an
appended parameter. The kernels keep their parameters; plans, and so the derivation, do not
change; the result assembles and the cubin holds each kernel's array, 16 bytes a counter."""

from __future__ import annotations

import io

import pytest
from elftools.elf.elffile import ELFFile

from ptx_helpers import NVCC_PTX, SHAPES_PTX, TRITON_KERNELS, triton_ptx
from pyhpctk.instrument.ptx import REPLICAS, Buffer, Mode, assemble, instrument, parse

FIXTURES = [
    pytest.param(NVCC_PTX, "sm_80", id="nvcc"),
    pytest.param(SHAPES_PTX, "sm_80", id="shapes"),
    *(pytest.param(triton_ptx(k), "sm_90a", id=f"triton-{k}") for k in TRITON_KERNELS[:3]),
]


def _symbols(cubin: bytes) -> dict[str, tuple[int, str, str]]:
    """Every symbol of the cubin: its size, binding and section."""
    elf = ELFFile(io.BytesIO(cubin))
    table = elf.get_section_by_name(".symtab")
    out = {}
    for sym in table.iter_symbols():
        shndx = sym["st_shndx"]
        section = elf.get_section(shndx).name if isinstance(shndx, int) else str(shndx)
        out[sym.name] = (sym["st_size"], sym["st_info"]["bind"], section)
    return out


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize(("path", "arch"), FIXTURES)
def test_global_counters_keep_the_signature_and_assemble(path, arch, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text()
    result = instrument(text, mode, buffer=Buffer.GLOBAL)
    before, after = parse(text), parse(result.ptx)
    for kernel in before.kernels:
        assert after.function(kernel.name).params == kernel.params
    assert result.counter_params == {} and result.source == text
    symbols = _symbols(assemble(result.ptx, arch).cubin)
    for kernel, plan in result.plans.items():
        name = result.counter_globals[kernel]
        assert name.startswith(kernel) and name.endswith("_counters")
        size, bind, section = symbols[name]
        assert (size, bind) == (result.counter_bytes(kernel), "STB_GLOBAL")
        assert size == 16 * plan.counters * REPLICAS or REPLICAS * 128 <= size <= 64 * 1024
        assert section.startswith(".nv.global")  # zero-initialised at load, no .data to copy


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize(("path", "arch"), FIXTURES)
def test_global_and_parameter_buffers_give_the_same_plans(path, arch, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text()
    assert instrument(text, mode, buffer=Buffer.GLOBAL).plans == instrument(text, mode).plans


def test_global_probes_address_the_array_and_read_no_parameter() -> None:
    result = instrument(SHAPES_PTX.read_text(), Mode.BLOCKS, buffer=Buffer.GLOBAL)
    symbol = result.counter_globals["empty"]
    body = [s.text for s in parse(result.ptx).function("empty").body]
    assert not any("ld.param" in t for t in body)
    warp, threads = [t for t in body if "red.global.add.u64" in t]
    assert warp.endswith("+0], 1") and threads.endswith("+8], %__pyhpctk_0_n")
    (address,) = [t for t in body if t.endswith(f", {symbol}")]
    assert address == f"@%__pyhpctk_0_p mov.u64 %__pyhpctk_0_a, {symbol}"
    declaration = f".visible .global .align 8 .u64 {symbol}[{result.counter_bytes('empty') // 8}];"
    assert result.ptx.count(declaration) == 1
    assert result.ptx.index(declaration) < result.ptx.index(".entry empty")
