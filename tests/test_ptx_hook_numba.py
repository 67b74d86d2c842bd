"""Numba-CUDA's PTX reached as it enters the linker (issue #34 item 2), without a GPU: a kernel
compiled here for sm_90 is linked by nvJitLink with its PTX instrumented, the library's own
caches and PTX stay the original, and after uninstall the same library links the original."""

from __future__ import annotations

import io

import pytest
from elftools.elf.elffile import ELFFile

from pyhpctk.instrument.frameworks import Collector
from pyhpctk.instrument.frameworks.numba import Numba
from pyhpctk.instrument.ptx import Buffer, Mode, assemble, instrument

cuda = pytest.importorskip(
    "numba.cuda", reason="numba-cuda is not installed (not in the dev extra)"
)
pytest.importorskip("cuda.bindings.nvjitlink", reason="numba-cuda links without a GPU by nvJitLink")

CC = (9, 0)


def ragged(x, y, n):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    s = 0.0
    for j in range(i % 5):  # a data-dependent loop
        s += x[(i + j) % n]
    if i < n:
        y[i] = s


def _library():  # type: ignore[no-untyped-def]
    """The code library numba.cuda.compile builds for the kernel (what a launch links)."""
    from numba import float32, int32
    from numba.cuda.compiler import _compile_pyfunc_with_fixup

    sig = (float32[:], float32[:], int32)
    library, _ = _compile_pyfunc_with_fixup(ragged, sig, device=False, cc=CC, abi="numba")
    return library


def _image(cubin: object) -> bytes:
    return bytes(getattr(cubin, "code", cubin))  # a cuda.core ObjectCode, or bytes


def _symbols(image: bytes) -> set[str]:
    table = ELFFile(io.BytesIO(image)).get_section_by_name(".symtab")
    return {s.name for s in table.iter_symbols()}


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_numba_hook_links_instrumented_ptx_and_keeps_the_librarys_caches(mode: Mode) -> None:
    library = _library()
    plain = _image(library.get_cubin(cc=CC))
    ptx = library.get_asm_str(cc=CC)
    hook, collector = Numba(), Collector(mode)
    hook.install(collector)
    try:
        counted = _image(library.get_cubin(cc=CC))
    finally:
        hook.uninstall()
    expected = instrument(ptx, mode, buffer=Buffer.GLOBAL)
    (symbol,) = expected.counter_globals.values()
    assert symbol in _symbols(counted) and symbol not in _symbols(plain)
    (recorded,) = library.__dict__["_pyhpctk_caches"]["instrumented"]
    assert recorded.ptx == expected.ptx
    assemble(expected.ptx, "sm_90")
    assert library.get_asm_str(cc=CC) == ptx  # inspect_asm shows the original
    assert _image(library.get_cubin(cc=CC)) == plain  # uninstalled: the original, as cached


def test_numba_library_compiled_while_installed_links_the_original_after() -> None:
    hook = Numba()
    hook.install(Collector())
    try:
        library = _library()
        counted = _image(library.get_cubin(cc=CC))
    finally:
        hook.uninstall()
    after = _image(library.get_cubin(cc=CC))
    assert any(s.endswith("_counters") for s in _symbols(counted))
    assert not any(s.endswith("_counters") for s in _symbols(after))
