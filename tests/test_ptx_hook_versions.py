"""The frameworks' hook points are private APIs (issue #34 item 2): each hook pins the versions
its tests ran against, and refuses any other in one line, before it changes anything."""

from __future__ import annotations

import importlib

import pytest

from pyhpctk.instrument.frameworks import FRAMEWORKS, Collector, FrameworkError, installed_version

# what each framework's hook replaces first: it must still be the framework's own after a refusal
FIRST_PATCHED = {
    "triton": ("triton.knobs", lambda m: m.runtime.add_stages_inspection_hook is None),
    "cupy": ("cupy.cuda.compiler", lambda m: m._NVRTCProgram.compile.__module__ == m.__name__),
    "numba": ("numba.cuda.cudadrv.driver", lambda m: m._Linker.add_ptx.__module__ == m.__name__),
}


def test_the_table_holds_the_three_frameworks_and_their_pins() -> None:
    assert {n: (f.distributions, f.supported) for n, f in FRAMEWORKS.items()} == {
        "triton": (("triton",), ((3, 6), (3, 7), (3, 8), (3, 9))),
        "cupy": (("cupy-cuda13x", "cupy-cuda12x", "cupy"), ((14, 2),)),
        "numba": (("numba-cuda",), ((0, 30),)),
    }


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_an_untested_version_is_refused_in_one_line(name: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    framework = FRAMEWORKS[name]
    found = [(d, v) for d in framework.distributions if (v := installed_version(d))]
    if not found:
        pytest.skip(f"{name} is not installed here")
    module, untouched = FIRST_PATCHED[name]
    monkeypatch.setattr(framework, "supported", ((0, 1), (7, 0)))
    with pytest.raises(FrameworkError) as caught:
        framework().install(Collector())
    distribution, version = found[0]
    assert str(caught.value) == (
        f"{name}: {distribution} {version} is not supported by pyhpctk's PTX hooks "
        "(tested: 0.1.x, 7.0.x); its kernels would run uninstrumented"
    )
    assert untouched(importlib.import_module(module))


def test_a_missing_framework_is_named_in_one_line(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    framework = FRAMEWORKS["numba"]
    monkeypatch.setattr(framework, "distributions", ("numba-cuda-not-here", "nor-this"))
    with pytest.raises(
        FrameworkError, match=r"^numba: numba-cuda-not-here or nor-this is not installed$"
    ):
        framework().install(Collector())


def test_launched_kernels_no_hook_instrumented_are_listed_with_the_reason() -> None:
    from ptx_helpers import SHAPES_PTX
    from pyhpctk.instrument.frameworks.base import NO_PTX
    from pyhpctk.instrument.ptx import Buffer, instrument

    collector = Collector()
    result = instrument(SHAPES_PTX.read_text(), kernels={"empty"}, buffer=Buffer.GLOBAL)
    collector.loaded("cupy", result, lambda s, n: None, lambda s, n: None)  # type: ignore[arg-type,return-value]
    collector.skipped("numba", "lto_kernel", "linked with LTO: no PTX")
    launched = ["empty", "lto_kernel", "sm90_xmma_gemm", "lto_kernel", "sm90_xmma_gemm"]
    assert [(s.framework, s.what, s.reason) for s in collector.unreached(launched)] == [
        ("numba", "lto_kernel", "linked with LTO: no PTX"),
        ("", "sm90_xmma_gemm", NO_PTX),
    ]
