"""The Python names of functions mypyc compiled: ``CPyDef_Vector___dot`` is ``Vector.dot``.

mypyc compiles Python modules to C and names each function's C symbols after its Python name
(``mypyc/namegen.py``): the native body ``CPyDef_`` and the wrapper Python calls ``CPyPy_``,
then the dotted name with each ``.`` written ``___`` (and a ``___`` of the Python name written
``___3_``, never ambiguous: no name begins with a digit). When a library holds several modules,
a name starts with the shortest dotted suffix of its module's name that tells the modules apart
(``geometry.Vector.dot`` for ``pkg.geometry``); each module's initialiser (``PyInit_geometry``
in a library of one module, ``CPyInit_pkg___geometry`` in a group's shared library) says which
modules there are, so that prefix is dropped. A person reads ``Vector.dot``, as the source and
the Python profile name it. The wrapper is ``Vector.dot [mypyc wrapper]``: it only parses the
arguments and calls the body, and pyview leaves it out as it leaves out the interpreter's own
frames (:mod:`pyhpctk.present.elide`), so a call reads as one row ``Vector.dot ← app.py: 20``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyhpctk.formats.vocabulary import MYPYC_WRAPPER_MARK

#: The prefixes of the symbols named after a Python function (``mypyc/common.py``).
FUNCTION_PREFIXES = ("CPyDef_", "CPyPy_")
_WRAPPER_PREFIX = "CPyPy_"
WRAPPER_MARK = MYPYC_WRAPPER_MARK
_INITIALISERS = ("CPyInit_", "PyInit_")
_DOT = "___"
_LITERAL = "3_"  # a piece after ``___`` that starts so: the ``___`` was the name's own


def python_name(c_name: str) -> str:
    """The dotted Python name mypyc wrote as ``c_name`` (no prefix): ``Vector___dot``
    is ``Vector.dot``, ``a___3_b`` is ``a___b``."""
    pieces = c_name.split(_DOT)
    name = pieces[0]
    for piece in pieces[1:]:
        if piece.startswith(_LITERAL):
            name += _DOT + piece.removeprefix(_LITERAL)
        else:
            name += "." + piece
    return name


def compiled_modules(symbols: Iterable[str]) -> set[str]:
    """Every dotted suffix of the names of the modules whose initialisers are among
    ``symbols`` (``PyInit_geometry``: ``geometry``; ``CPyInit_pkg___geo``: ``pkg.geo`` and
    ``geo``): the prefixes a function's name may start with."""
    suffixes: set[str] = set()
    for symbol in symbols:
        for prefix in _INITIALISERS:
            if symbol.startswith(prefix):
                parts = python_name(symbol.removeprefix(prefix)).split(".")
                suffixes.update(".".join(parts[i:]) for i in range(len(parts)))
    return suffixes


def mypyc_names(symbols: Sequence[str]) -> list[str | None]:
    """For each of ``symbols``, the Python name of the function mypyc compiled it from, or
    None (not a mypyc function symbol)."""
    if not any(s.startswith(FUNCTION_PREFIXES) for s in symbols):
        return [None] * len(symbols)
    modules = compiled_modules(symbols)
    names: list[str | None] = []
    for symbol in symbols:
        prefix = next((p for p in FUNCTION_PREFIXES if symbol.startswith(p)), None)
        if prefix is None or len(symbol) == len(prefix):
            names.append(None)
            continue
        parts = python_name(symbol.removeprefix(prefix)).split(".")
        # the longest leading run of components that is a compiled module's prefix, if any
        # component is left after it
        cut = next((i for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in modules), 0)
        name = ".".join(parts[cut:])
        names.append(name + WRAPPER_MARK if prefix == _WRAPPER_PREFIX else name)
    return names


__all__ = ["FUNCTION_PREFIXES", "WRAPPER_MARK", "compiled_modules", "mypyc_names", "python_name"]
