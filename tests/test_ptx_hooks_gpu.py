"""On a GPU (``-m gpu``): each framework's kernel of tests/data/gpu/device_ptx_hooks.py run
plain, through the hook and plain again; outputs bit-identical and counts equal to the
kernel's arithmetic (issue #34 item 2)."""

from __future__ import annotations

import pytest

from pyhpctk.instrument.ptx import Mode

pytestmark = pytest.mark.gpu

NEEDS = {"triton": "torch", "cupy": "cupy", "numba": "numba.cuda"}


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("name", sorted(NEEDS))
def test_hooked_kernel_is_bit_identical_and_counted_exactly(
    name: str, mode: Mode, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from ptx_helpers import PTX_DIR

    pytest.importorskip(NEEDS[name], reason=f"{name}'s kernel needs {NEEDS[name]}")
    if name == "numba":
        try:  # what numba-cuda loads at its first compile, hooked or not
            import numba.cuda.fp16  # noqa: F401
        except AttributeError as error:  # numba-cuda 0.30 under numpy 2.5: no np.row_stack
            pytest.skip(f"numba-cuda cannot compile a kernel under this numpy: {error}")
    monkeypatch.syspath_prepend(str(PTX_DIR.parent / "gpu"))
    import device_ptx_hooks
    import ptx_checks

    ptx_checks.FAILURES.clear()
    getattr(device_ptx_hooks, f"{name}_case")(mode)
    assert ptx_checks.FAILURES == []
