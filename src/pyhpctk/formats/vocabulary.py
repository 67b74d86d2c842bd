"""The database's vocabulary: every enumeration and constant of meta.db, declared once.

Relations, lexical types, entry points, propagation scopes and their types, summary combine
operators and the flag bits of meta.db records (formats.md §3.2, §3.7, §3.9) live here and
nowhere else: the format modules, the data model (:mod:`pyhpctk.core`), pyprof, pyview and pymodel
import them; no layer above redeclares them as bare integers or strings (style.md item 16).

Standard library only, and cheap to import, so that anything may import it, the code inside
measured processes included. The values are the ones in the files, so every enum is an
``IntEnum`` and compares equal to the integer a reader finds; a reader that meets a value not
listed here keeps the integer (forward compatibility, formats.md §3.1).
"""

from __future__ import annotations

import enum


class Relation(enum.IntEnum):
    """How a context relates to its parent (formats.md §3.2, ``{Ctx}.relation``)."""

    LEXICAL = 0  # an enclosing construct (loop, line, instruction inside a function)
    CALL = 1
    INLINED = 2  # hpcprof's "inlined call"


class LexicalType(enum.IntEnum):
    """What a context is (formats.md §3.2, ``{Ctx}.lexicalType``)."""

    FUNCTION = 0
    LOOP = 1
    LINE = 2
    INSTRUCTION = 3


class EntryPoint(enum.IntEnum):
    """The kind of an entry point below the global context (formats.md §3.2, ``{Entry}``)."""

    UNKNOWN_ENTRY = 0
    MAIN_THREAD = 1
    APPLICATION_THREAD = 2

    @property
    def pretty_name(self) -> str:
        """The name hpcprof writes beside the kind (``{Entry}.pPrettyName``)."""
        return ENTRY_POINT_NAMES[self]


ENTRY_POINT_NAMES: dict[EntryPoint, str] = {
    EntryPoint.UNKNOWN_ENTRY: "unknown entry",
    EntryPoint.MAIN_THREAD: "main thread",
    EntryPoint.APPLICATION_THREAD: "application thread",
}


class Combine(enum.IntEnum):
    """How a summary statistic combines profiles (formats.md §3.2, ``{SS}.combine``)."""

    SUM = 0
    MIN = 1
    MAX = 2

    @property
    def label(self) -> str:
        """The word ``metrics/default.yaml`` and the viewers use: ``sum``, ``min``, ``max``."""
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Combine:
        """The operator :attr:`label` names (ValueError for another word)."""
        try:
            return cls[label.upper()]
        except KeyError:
            raise ValueError(f"unknown combine operator {label!r}") from None


class ScopeType(enum.IntEnum):
    """How a propagation scope propagates (formats.md §3.2, ``{PS}.type``)."""

    CUSTOM = 0
    POINT = 1
    EXECUTION = 2
    TRANSITIVE = 3


class StandardScope(enum.IntEnum):
    """The four propagation scopes hpcprof always writes, by their index in meta.db's list.

    A metric with base id ``B`` stores scope ``s`` under ``propMetricId = B + s`` and partial
    ``p`` of it under ``statMetricId = B + 4 p + s`` (formats.md §3.2). pyview calls ``execution``
    inclusive and ``lex_aware`` exclusive.
    """

    POINT = 0
    FUNCTION = 1
    LEX_AWARE = 2
    EXECUTION = 3

    @property
    def label(self) -> str:
        """The scope's name in meta.db (``point``, ``function``, ``lex_aware``, ``execution``)."""
        return self.name.lower()

    @property
    def scope_type(self) -> ScopeType:
        return _SCOPE_TYPES[self]

    @property
    def propagation_index(self) -> int:
        """The bit of a context's propagation mask this scope uses (transitive scopes only)."""
        return 0 if self is StandardScope.FUNCTION else NO_PROPAGATION_INDEX


SCOPE_POINT, SCOPE_FUNCTION, SCOPE_LEX_AWARE, SCOPE_EXECUTION = tuple(StandardScope)
SCOPE_NAMES: tuple[str, ...] = tuple(scope.label for scope in StandardScope)
N_SCOPES = len(StandardScope)

_SCOPE_TYPES = {
    StandardScope.POINT: ScopeType.POINT,
    StandardScope.FUNCTION: ScopeType.TRANSITIVE,
    StandardScope.LEX_AWARE: ScopeType.CUSTOM,
    StandardScope.EXECUTION: ScopeType.EXECUTION,
}

NO_PROPAGATION_INDEX = 255  # formats.md §3.9 item 8: what hpcprof writes for other scopes
PROPAGATION_FUNCTION_BIT = 0x1  # formats.md §3.7: a context's mask bit 0, set on lexical ones


class ContextFlags(enum.IntFlag):
    """The payload a context record carries (formats.md §3.2, ``{Ctx}.flags``)."""

    HAS_FUNCTION = 0x1
    HAS_SRCLOC = 0x2
    HAS_POINT = 0x4


FILE_COPIED = 0x1  # formats.md §3.2, Source Files: bit 0, the file was copied into src/

# formats.md §1.7 / §3.2: the identifier kind names hpcprof writes, index = kind.
DEFAULT_ID_NAMES: tuple[str, ...] = (
    "SUMMARY",
    "NODE",
    "RANK",
    "THREAD",
    "GPUDEVICE",
    "GPUCONTEXT",
    "GPUSTREAM",
    "CORE",
)
GPU_ID_NAMES: frozenset[str] = frozenset({"GPUDEVICE", "GPUCONTEXT", "GPUSTREAM"})

__all__ = [
    "DEFAULT_ID_NAMES",
    "ENTRY_POINT_NAMES",
    "FILE_COPIED",
    "GPU_ID_NAMES",
    "NO_PROPAGATION_INDEX",
    "N_SCOPES",
    "PROPAGATION_FUNCTION_BIT",
    "SCOPE_EXECUTION",
    "SCOPE_FUNCTION",
    "SCOPE_LEX_AWARE",
    "SCOPE_NAMES",
    "SCOPE_POINT",
    "Combine",
    "ContextFlags",
    "EntryPoint",
    "LexicalType",
    "Relation",
    "ScopeType",
    "StandardScope",
]

#: What ends a function's name when it is the wrapper through which Python calls a function
#: mypyc compiled (``Vector.dot [mypyc wrapper]``; pystruct and pyprof name it, pyview leaves it
#: out like the interpreter's own frames: issue #36).
MYPYC_WRAPPER_MARK = " [mypyc wrapper]"
#: The same for Cython's argument-parsing wrapper (``__pyx_pw_``) of a function whose body
#: (``__pyx_pf_``) is a function of its own (``Splitter.find_node_split [cython wrapper]``).
CYTHON_WRAPPER_MARK = " [cython wrapper]"
#: Both marks: functions pyview leaves out (:mod:`pyhpctk.present.elide`).
WRAPPER_MARKS = (MYPYC_WRAPPER_MARK, CYTHON_WRAPPER_MARK)
#: The pseudo source file of a range's function (``pyrun --ranges``: a PyTorch module, a
#: ``record_function`` or NVTX range as a context node; ``pyview --ranges`` keeps only them).
RANGE_FILE = "<range>"
