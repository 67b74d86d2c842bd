"""Triton's PTX reached through its compile-stage hook (issue #34 item 2), without a GPU: a
kernel compiled for an explicit target goes through the pass, assembles with Triton's ptxas
and ours, is cached under its own key, and after uninstall the same compile is the original."""

from __future__ import annotations

import io
import os

import pytest
from elftools.elf.elffile import ELFFile

from pyhpctk.instrument.frameworks import Collector
from pyhpctk.instrument.frameworks.triton import STAGE, Triton
from pyhpctk.instrument.ptx import Mode, assemble, instrument, parse
from pyhpctk.instrument.ptx.rewrite import Buffer

triton = pytest.importorskip("triton", reason="Triton (the dev extra) compiles the kernels")


@pytest.fixture
def kernels(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """triton_kernels with Triton's cache in a fresh folder for this test."""
    from ptx_helpers import PTX_DIR

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(PTX_DIR))
    import triton_kernels

    return triton_kernels


def _compile(kernels, name: str):  # type: ignore[no-untyped-def]
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constants = kernels.KERNELS[name]
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32))


def _symbols(cubin: bytes) -> set[str]:
    table = ELFFile(io.BytesIO(cubin)).get_section_by_name(".symtab")
    return {s.name for s in table.iter_symbols()}


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_triton_hook_instruments_the_ptx_before_ptxas(kernels, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    plain = _compile(kernels, "bfs")
    hook, collector = Triton(), Collector(mode)
    hook.install(collector)
    try:
        counted = _compile(kernels, "bfs")
    finally:
        hook.uninstall()
    assert counted.asm["ptx"] == plain.asm["ptx"]  # the stage's own output, kept
    expected = instrument(plain.asm["ptx"], mode, buffer=Buffer.GLOBAL)
    assert counted.asm[STAGE] == expected.ptx
    (symbol,) = expected.counter_globals.values()
    assert symbol in _symbols(counted.asm["cubin"])  # Triton's ptxas assembled the counted PTX
    assert symbol not in _symbols(plain.asm["cubin"])
    assert parse(expected.ptx).kernels[0].params == parse(plain.asm["ptx"]).kernels[0].params
    assemble(counted.asm[STAGE], "sm_90a")


def test_triton_instrumented_kernels_have_their_own_cache_key_and_uninstall_restores(
    kernels,
) -> None:  # type: ignore[no-untyped-def]
    from triton import knobs

    plain = _compile(kernels, "matmul")
    hook = Triton()
    hook.install(Collector())
    try:
        counted = _compile(kernels, "matmul")
        again = _compile(kernels, "matmul")  # a hit in the instrumented kernels' own entry
    finally:
        hook.uninstall()
    after = _compile(kernels, "matmul")
    assert counted.hash != plain.hash and again.hash == counted.hash
    assert again.asm["cubin"] == counted.asm["cubin"] and STAGE in again.asm
    assert after.hash == plain.hash and after.asm["cubin"] == plain.asm["cubin"]
    assert STAGE not in after.asm
    assert knobs.runtime.add_stages_inspection_hook is None
    assert knobs.runtime.jit_post_compile_hook is None


def test_triton_kernels_the_filter_leaves_out_are_not_instrumented(kernels) -> None:  # type: ignore[no-untyped-def]
    import re

    plain = _compile(kernels, "stencil")
    hook, collector = Triton(), Collector(kernels=re.compile("^matmul$"))
    hook.install(collector)
    try:
        left = _compile(kernels, "stencil")
    finally:
        hook.uninstall()
    assert left.asm[STAGE] == plain.asm["ptx"] and left.asm["cubin"] == plain.asm["cubin"]
    # pyrun's summary says why the kernel ran uninstrumented (gpu=nvidia,kernel-name=...)
    (skip,) = collector.unreached(["stencil"])
    assert (skip.framework, skip.reason) == ("triton", "kernel-name=^matmul$ leaves it out")


def test_inductor_launches_through_triton_while_installed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """torch.compile's kernels: Inductor's static CUDA launcher loads cubins where no Triton hook
    sees them, so the hook turns it off while installed, and back on after."""
    monkeypatch.delenv("TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER", raising=False)
    hook = Triton()
    hook.install(Collector(Mode.EDGES))
    try:
        assert os.environ["TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"] == "0"
        torch_config = pytest.importorskip("torch._inductor.config", reason="torch (torch-venv)")
        assert torch_config.use_static_cuda_launcher is False  # imported after install
    finally:
        hook.uninstall()
    assert "TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER" not in os.environ
    torch_config.use_static_cuda_launcher = True  # imported before install: its value is set
    hook.install(Collector(Mode.EDGES))
    try:
        assert torch_config.use_static_cuda_launcher is False
    finally:
        hook.uninstall()
    assert torch_config.use_static_cuda_launcher is True
