"""pystruct on cubins beyond the reference data (issue #20, items 3-5).

Fixtures (tests/data/cubin/README.md, rebuilt by build.sh from units/*.cu with CUDA 13):

* ``units_lineinfo_sm_75.cubin``: four units (``-rdc=true -lineinfo``) linked by nvlink. Every
  unit inlines device functions, kernels call across units, units c and d each bring a copy of
  the double-division helper ``__cuda_sm20_div_rn_f64_full`` (same section and symbol name);
* ``names_G_sm_75.cubin``: template functions and a template kernel, ``-G``.

Lines and inline call sites are checked against ``nvdisasm -gi``, calls against nvdisasm's
listing; names against the sources (which function is defined on which line). Older
architectures come from documented transformations of these files and of the sm_62 reference
cubin: e_flags patched to sm_70, a ``JCAL`` relocation pointed at a function of the cubin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyhpctk.formats.hpcstruct_model import ALIEN, PROCEDURE, Scope
from pyhpctk.structure import dwarf
from pyhpctk.structure.driver import StructOptions, analyze_target

DATA = Path(__file__).resolve().parent / "data" / "cubin"
NAMES = DATA / "names_G_sm_75.cubin"


def _procedures(path: Path, gpucfg: bool = False) -> dict[str, Scope]:
    structure = analyze_target(path, StructOptions(gpucfg=gpucfg, resolve_paths=False))
    return {s.name: s for s in structure.modules[0].walk() if s.tag == PROCEDURE}


def _inlined_names(proc: Scope) -> set[str]:
    return {s.name for s in proc.walk() if s.tag == ALIEN and s.name not in ("", "<inline>")}


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
