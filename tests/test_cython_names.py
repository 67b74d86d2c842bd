"""Cython's mangled function symbols read as the Python names they were compiled from (issue #36).

The truth is a reading by hand of Cython's scheme (``Cython/Compiler/Naming.py``: a prefix for the
kind, each enclosing scope written ``<length><name>_``, a def's own name after a counter) applied
to symbols of scikit-learn's and SciPy's compiled modules, as ``nm`` lists them in the dev venv's
wheels. ``__pyx_pw_7sklearn_8ensemble_23_hist_gradient_boosting_9splitting_8Splitter_5find_``
``node_split`` is ``sklearn`` (7 letters), ``ensemble`` (8), ``_hist_gradient_boosting`` (23),
``splitting`` (9), ``Splitter`` (8), then def number 5, ``find_node_split``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyhpctk.formats.vocabulary import CYTHON_WRAPPER_MARK

HGB = "sklearn.ensemble._hist_gradient_boosting"


def _library(package: str, relative: str) -> Path:
    module = pytest.importorskip(package, reason="scikit-learn and SciPy are in the dev extra")
    root = Path(str(module.__file__)).parent
    (found,) = sorted(root.glob(relative))
    return found


def _symbols(library: Path) -> set[str]:
    from elftools.elf.elffile import ELFFile

    with library.open("rb") as stream:
        table = ELFFile(stream).get_section_by_name(".symtab")
        assert table is not None, f"{library}: the wheel's module keeps its .symtab"
        return {s.name for s in table.iter_symbols()}  # type: ignore[attr-defined]


# (package, module file, symbol, the Python name read by hand)
CASES = [
    (
        "sklearn",
        "ensemble/_hist_gradient_boosting/splitting.cpython-*.so",
        "__pyx_pw_7sklearn_8ensemble_23_hist_gradient_boosting_9splitting_8Splitter"
        "_5find_node_split",
        f"{HGB}.splitting.Splitter.find_node_split",  # its body was inlined: the function
    ),
    (
        "sklearn",
        "ensemble/_hist_gradient_boosting/splitting.cpython-*.so",
        "__pyx_f_7sklearn_8ensemble_23_hist_gradient_boosting_9splitting_8Splitter"
        "__find_best_bin_to_split_category",
        f"{HGB}.splitting.Splitter._find_best_bin_to_split_category",  # a cdef method
    ),
    (
        "sklearn",
        "ensemble/_hist_gradient_boosting/splitting.cpython-*.so",
        "__pyx_pf_7sklearn_8ensemble_23_hist_gradient_boosting_9splitting_8Splitter"
        "_4find_node_split._omp_fn.0",
        f"{HGB}.splitting.Splitter.find_node_split._omp_fn.0",  # its prange, outlined
    ),
    (
        "sklearn",
        "ensemble/_hist_gradient_boosting/_predictor.cpython-*.so",
        "__pyx_pf_7sklearn_8ensemble_23_hist_gradient_boosting_10_predictor"
        "__predict_from_raw_data._omp_fn.0",
        # def 0 (its wrapper: def 1, ``_1_predict_from_raw_data``): Cython writes no counter 0;
        # before, ``10`` was read as a counter (``_hist_gradient_boosting._predictor__predict…``)
        f"{HGB}._predictor._predict_from_raw_data._omp_fn.0",
    ),
    (
        "sklearn",
        "metrics/_dist_metrics.cpython-*.so",
        "__pyx_pw_7sklearn_7metrics_13_dist_metrics_21MahalanobisDistance32_1__init__",
        "sklearn.metrics._dist_metrics.MahalanobisDistance32.__init__" + CYTHON_WRAPPER_MARK,
    ),
    (
        "sklearn",
        "metrics/_dist_metrics.cpython-*.so",
        "__pyx_pf_7sklearn_7metrics_13_dist_metrics_21MahalanobisDistance32___init__",
        "sklearn.metrics._dist_metrics.MahalanobisDistance32.__init__",  # a special method's body
    ),
    (
        "sklearn",
        "metrics/_dist_metrics.cpython-*.so",
        "__pyx_tp_new_7sklearn_7metrics_13_dist_metrics_MahalanobisDistance32",
        "sklearn.metrics._dist_metrics.MahalanobisDistance32.__new__",
    ),
    (
        "scipy",
        "special/cython_special.cpython-*.so",
        "__pyx_fuse_0_1__pyx_f_5scipy_7special_14cython_special_eval_chebyu",
        "scipy.special.cython_special.eval_chebyu",  # one specialisation of a fused function
    ),
    (
        "scipy",
        "spatial/transform/_rotation_cy.cpython-*.so",
        "__pyx_gb_5scipy_7spatial_9transform_12_rotation_cy_8as_euler_2generator1",
        "scipy.spatial.transform._rotation_cy.as_euler.generator1",  # a generator's body
    ),
    (
        "scipy",
        "signal/_sosfilt.cpython-*.so",
        "__pyx_pymod_exec__sosfilt",
        "_sosfilt.<module>",
    ),
]


@pytest.mark.parametrize(("package", "relative", "symbol", "expected"), CASES)
def test_cython_symbols_of_real_wheels_read_as_their_python_names(
    package: str, relative: str, symbol: str, expected: str
) -> None:
    # Before: the rows read __pyx_pw_7sklearn_8ensemble_... [splitting.cpython-311-....so].
    from pyhpctk.analysis.symbols import library_functions

    library = _library(package, relative)
    assert symbol in _symbols(library)  # the symbol is real
    functions = library_functions(library)
    assert functions is not None
    assert expected in {f.name for f in functions[0]}, symbol
    assert not [f.name for f in functions[0] if f.name.startswith(("__pyx_pw_", "__pyx_pf_"))]


def test_one_python_function_reads_once_through_its_wrapper() -> None:
    """A wrapper beside its body is marked (pyview leaves it out); one whose body was inlined
    into it is the function; Cython's own helpers keep their C names."""
    from pyhpctk.structure.cython_names import cython_names

    scope = "__pyx_p{}_3pkg_1m_5Shape_"
    symbols = [
        scope.format("w") + "3area",
        scope.format("f") + "2area.isra.0",
        scope.format("w") + "1__init__",  # def 1, ``__init__``: not a scope ``_``
        scope.format("f") + "__init__",
        scope.format("w") + "5grow",  # no body of its own
        "__pyx_pw_3pkg_10_predictor_1_fit",  # def 1 of pkg._predictor, ``_fit``...
        "__pyx_pf_3pkg_10_predictor__fit",  # its body, def 0: not pkg's def 10 ``_predictor__fit``
        "__pyx_memview_slice",
        "memcpy",
    ]
    assert cython_names(symbols) == [
        "pkg.m.Shape.area" + CYTHON_WRAPPER_MARK,
        "pkg.m.Shape.area",
        "pkg.m.Shape.__init__" + CYTHON_WRAPPER_MARK,
        "pkg.m.Shape.__init__",
        "pkg.m.Shape.grow",
        "pkg._predictor._fit" + CYTHON_WRAPPER_MARK,
        "pkg._predictor._fit",
        None,
        None,
    ]
