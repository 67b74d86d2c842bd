"""The Python names of functions Cython compiled: ``__pyx_pw_7sklearn_…_8Splitter_5find_node_split``
is ``sklearn.….Splitter.find_node_split``.

Cython names a function's C symbols (``Cython/Compiler/Naming.py``, ``Symtab.py``) with a prefix
for its kind, then its scope, each enclosing name written with its length before it and ``_``
after it (``7sklearn_8ensemble_``: the module ``sklearn.ensemble``, then a class, a function
holding a generator...), then its own name:

* ``__pyx_pw_`` the wrapper Python calls (it parses the arguments) and ``__pyx_pf_`` the body,
  whose own name has a counter before it (``5find_node_split``; a special method's body has
  none: ``___init__`` is ``_`` then ``__init__``); ``__pyx_gb_`` a generator's body, likewise;
* ``__pyx_f_`` a ``cdef`` function (no counter: a name never starts with a digit);
* ``__pyx_getprop_``/``__pyx_setprop_`` a property's getter and setter, ``__pyx_tp_SLOT_`` a
  class's type slot (``__pyx_tp_new_…_Splitter``: ``Splitter.__new__``);
* ``__pyx_fuse_N_M`` before any of them: one specialisation of a fused function;
* ``__pyx_pymod_exec_MODULE``: the module's body (``splitting.<module>``, as Python names it).

A wrapper and a body where the optimiser kept both read as the same Python name, the wrapper
marked ``[cython wrapper]`` so that pyview leaves it out as it does mypyc's
(:mod:`pyhpctk.present.elide`); a wrapper whose body was inlined into it is the function. What
the C compiler adds after a ``.`` (``.isra.0``, ``.constprop.0``, ``.part.0``, ``.cold``: the
same function) is dropped, but an OpenMP region outlined from it keeps its ``._omp_fn.0``.
The pieces between counters are ambiguous in a few cases (``1__init__`` could be a scope ``_``);
the reading taken is the one with the most scopes whose own name is a counter and a name, or a
special method's name. A body's counter is its wrapper's less one, and a counter 0 is not
written (``_10_predictor__fit`` is def 0, ``_fit``, of a module ``_predictor``: its wrapper is
``…_10_predictor_1_fit``, not def 10 ``_predictor__fit``): a body whose wrapper is among the
symbols is read as its wrapper is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyhpctk.formats.vocabulary import CYTHON_WRAPPER_MARK

_FUSED = re.compile(r"^__pyx_fuse_\d+(?:_\d+)*")
_COUNTED = ("__pyx_pw_", "__pyx_pf_", "__pyx_gb_")  # a counter before the name
_PLAIN = ("__pyx_f_", "__pyx_getprop_", "__pyx_setprop_")
_SLOTS = {"new": "__new__", "dealloc": "__dealloc__"}
_MODULE_BODY = "__pyx_pymod_exec_"
_NAME = re.compile(r"[A-Za-z_]\w*")
_SPECIAL = re.compile(r"__\w+__")
_COUNTER_NAME = re.compile(r"(\d+)([A-Za-z_]\w*)")


def _scope_readings(text: str) -> list[tuple[list[str], str]]:
    """Every way to read ``text`` as length-prefixed scopes then the rest: (scopes, rest)."""
    readings: list[tuple[list[str], str]] = []
    scopes: list[str] = []
    pending = [(0, scopes)]
    while pending:
        at, parts = pending.pop()
        readings.append((parts, text[at:]))
        digits = re.match(r"\d+", text[at:])
        if digits is None:
            continue
        start = at + len(digits.group())
        end = start + int(digits.group())
        if end > start and end < len(text) and text[end] == "_":
            pending.append((end + 1, [*parts, text[start:end]]))
    return readings


def _counted(text: str) -> tuple[list[str], str] | None:
    """Scopes and name of a wrapper's, body's or generator's name (counter dropped): the
    reading whose rest is a counter and a name, or a special method's name, with the most
    scopes; else (an older Cython's body, ``10_moduleTNC_tnc_minimize``) a plain name."""
    best: tuple[tuple[bool, int], list[str], str] | None = None
    for scopes, rest in _scope_readings(text):
        if not scopes:
            continue  # a function is in a module, at least
        counted = _COUNTER_NAME.fullmatch(rest)
        if counted is not None:
            score, name = (True, len(scopes)), counted.group(2)
        elif _NAME.fullmatch(rest):
            score, name = (_SPECIAL.fullmatch(rest) is not None, len(scopes)), rest
        else:
            continue
        if best is None or score > best[0]:
            best = (score, scopes, _FUSED.sub("", name, count=1) or name)
    return None if best is None else (best[1], best[2])


def _plain(text: str) -> tuple[list[str], str] | None:
    """Scopes and name of a name without a counter: every leading digit starts a scope."""
    for scopes, rest in sorted(_scope_readings(text), key=lambda r: -len(r[0])):
        if _NAME.fullmatch(rest) and not rest[0].isdigit():
            return scopes, rest
    return None


def _counted_readings(text: str) -> list[tuple[tuple[str, ...], str, int]]:
    """Every reading of a wrapper's or body's name as (scopes, name, counter): counter 0 where
    none is written."""
    found = []
    for scopes, rest in _scope_readings(text):
        counted = _COUNTER_NAME.fullmatch(rest)
        if counted is not None:
            found.append((tuple(scopes), counted.group(2), int(counted.group(1))))
        if scopes and _NAME.fullmatch(rest) and not rest[0].isdigit():
            found.append((tuple(scopes), rest, 0))
    return found


def _wrapped(text: str, wrappers: set[tuple[tuple[str, ...], str, int]]) -> str | None:
    """The dotted name of a body (its name less the prefix) whose wrapper is in ``wrappers``
    (every reading of every wrapper's name), None if none reads as its wrapper."""
    base, _, tail = text.partition(".")
    suffix = "." + tail if tail.startswith("_omp_fn") else ""
    for scopes, name, counter in _counted_readings(base):
        if scopes and (scopes, name, counter + 1) in wrappers:
            return ".".join([*scopes, name]) + suffix
    return None


def cython_name(symbol: str) -> tuple[str, bool] | None:
    """(the dotted Python name, whether it is a wrapper) of a Cython function symbol, None for
    any other symbol (Cython's own helpers: ``__pyx_memview_…``, ``__Pyx_…``)."""
    base, _, tail = symbol.partition(".")
    suffix = "." + tail if tail.startswith("_omp_fn") else ""
    fused = _FUSED.match(base)
    if fused is not None:
        base = base[fused.end() :]
    if base.startswith(_MODULE_BODY) and len(base) > len(_MODULE_BODY):
        return base.removeprefix(_MODULE_BODY) + ".<module>" + suffix, False
    parsed: tuple[list[str], str] | None = None
    prefix = next((p for p in (*_COUNTED, *_PLAIN) if base.startswith(p)), None)
    if prefix in _COUNTED:
        parsed = _counted(base.removeprefix(prefix))
    elif prefix is not None:
        parsed = _plain(base.removeprefix(prefix))
    elif base.startswith("__pyx_tp_"):
        slot, _, rest = base.removeprefix("__pyx_tp_").partition("_")
        found = _plain(rest) if slot else None
        if found is not None:
            parsed = ([*found[0], found[1]], _SLOTS.get(slot, f"tp_{slot}"))
    if parsed is None or not parsed[0]:
        return None
    scopes, name = parsed
    return ".".join([*scopes, name]) + suffix, prefix == "__pyx_pw_"


def cython_names(symbols: Sequence[str]) -> list[str | None]:
    """For each of ``symbols``, the Python name of the function Cython compiled it from
    (wrappers whose body is among ``symbols`` marked ``[cython wrapper]``), or None."""
    if not any(s.startswith("__pyx_") for s in symbols):
        return [None] * len(symbols)
    read = [cython_name(s) if s.startswith("__pyx_") else None for s in symbols]
    plain = [_FUSED.sub("", s, count=1) for s in symbols]
    wrappers = {
        reading
        for symbol in plain
        if symbol.startswith("__pyx_pw_")
        for reading in _counted_readings(symbol.removeprefix("__pyx_pw_"))
    }
    for at, symbol in enumerate(plain):
        prefix = next((p for p in ("__pyx_pf_", "__pyx_gb_") if symbol.startswith(p)), None)
        body = _wrapped(symbol.removeprefix(prefix), wrappers) if prefix else None
        if body is not None:
            read[at] = (body, False)
    bodies = {
        found[0]
        for symbol, found in zip(symbols, read, strict=True)
        if found is not None and _FUSED.sub("", symbol).startswith("__pyx_pf_")
    }
    names: list[str | None] = []
    for found in read:
        if found is None:
            names.append(None)
        else:
            name, wrapper = found
            names.append(name + CYTHON_WRAPPER_MARK if wrapper and name in bodies else name)
    return names


__all__ = ["cython_name", "cython_names"]
