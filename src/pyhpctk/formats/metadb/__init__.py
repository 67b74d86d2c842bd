"""Read, write, dump and check HPCToolkit's ``meta.db`` (database format v4.0, formats.md §3.2).

``meta.db`` holds everything about a database except the metric values: the program title, the
id-tuple kind names, the metric descriptions and their propagation scopes, the load modules,
source files and functions, and the calling context tree (entry points and contexts). pyprof
*builds* a :class:`MetaDB` from scratch and writes it; pyview reads one and navigates the tree
through :meth:`MetaDB.index` (a :class:`ContextIndex`: a flat numpy table of every context plus
lookups by ctxId). This package knows only this one file; the frame shared with ``profile.db``,
``cct.db`` and ``trace.db`` (header, footer, strings, bounds checks) lives in
:mod:`pyhpctk.formats._db`. It must never import anything above ``formats``.

The format outgrew one module (issue #19), so its sections that change for different reasons
have rooms of their own:

* :mod:`.layout`: section numbers, record dtypes (sizes asserted against the spec), flag bits;
* :mod:`.model`: the objects (:class:`MetaDB`, :class:`Context`, ...) and :class:`ContextIndex`;
* :mod:`.read`: one reader per section, every pointer and size checked;
* :mod:`.write`: one writer per section, hpcprof's exact layout, byte for byte;
* :mod:`.check`: :func:`verify`'s consistency checks;
* :mod:`.dump`: the text form.

The public face is this package: ``sniff``, ``read``, ``read_buffer``, ``write``, ``to_bytes``,
``dump``, ``describe``, ``verify`` and the model, as before the split. With the Strings pool's
order read as a layout hint (``MetaDB.string_order``), ``write(read(f))`` gives back the same
bytes for every hpcprof file in the reference data.
"""

from __future__ import annotations

from pyhpctk.formats.metadb.check import verify
from pyhpctk.formats.metadb.dump import describe, dump
from pyhpctk.formats.metadb.layout import (
    CONTEXT_DTYPE,
    CONTEXTS_HEADER_DTYPE,
    CTX_HAS_FUNCTION,
    CTX_HAS_POINT,
    CTX_HAS_SRCLOC,
    DEFAULT_DESCRIPTION,
    DEFAULT_TITLE,
    ENTRY_POINT_DTYPE,
    FILE_DTYPE,
    FOOTER,
    FORMAT_ID,
    FUNCTION_DTYPE,
    GENERAL_DTYPE,
    HEADER_END,
    ID_NAMES_DTYPE,
    METRIC_DTYPE,
    METRICS_HEADER_DTYPE,
    MODULE_DTYPE,
    N_SECTIONS,
    SCOPE_DTYPE,
    SCOPE_INST_DTYPE,
    SEC_CONTEXT,
    SEC_FILES,
    SEC_FUNCTIONS,
    SEC_GENERAL,
    SEC_ID_NAMES,
    SEC_METRICS,
    SEC_MODULES,
    SEC_STRINGS,
    SECTION_NAMES,
    SUMMARY_DTYPE,
    TABLE_HEADER_DTYPE,
)
from pyhpctk.formats.metadb.model import (
    CONTEXT_TABLE_DTYPE,
    NO_ENUM,
    STANDARD_SCOPES,
    Context,
    ContextIndex,
    Entry,
    Function,
    MetaDB,
    Metric,
    Module,
    Node,
    PropagationScope,
    ScopeInstance,
    SourceFile,
    SummaryStatistic,
    iter_contexts,
)
from pyhpctk.formats.metadb.read import gather_u64 as _gather_u64
from pyhpctk.formats.metadb.read import read, read_buffer, sniff
from pyhpctk.formats.metadb.write import to_bytes, write

# formats.md §3.2: the enumerations and flag bits are the database's vocabulary, re-exported
# under the names this format's users know (EntryPointKind is the vocabulary's EntryPoint:
# here Entry is the record).
from pyhpctk.formats.vocabulary import (
    DEFAULT_ID_NAMES,
    ENTRY_POINT_NAMES,
    FILE_COPIED,
    NO_PROPAGATION_INDEX,
    PROPAGATION_FUNCTION_BIT,
    Combine,
    LexicalType,
    Relation,
    ScopeType,
)
from pyhpctk.formats.vocabulary import EntryPoint as EntryPointKind

__all__ = [
    "CONTEXTS_HEADER_DTYPE",
    "CONTEXT_DTYPE",
    "CONTEXT_TABLE_DTYPE",
    "CTX_HAS_FUNCTION",
    "CTX_HAS_POINT",
    "CTX_HAS_SRCLOC",
    "DEFAULT_DESCRIPTION",
    "DEFAULT_ID_NAMES",
    "DEFAULT_TITLE",
    "ENTRY_POINT_DTYPE",
    "ENTRY_POINT_NAMES",
    "FILE_COPIED",
    "FILE_DTYPE",
    "FOOTER",
    "FORMAT_ID",
    "FUNCTION_DTYPE",
    "GENERAL_DTYPE",
    "HEADER_END",
    "ID_NAMES_DTYPE",
    "METRICS_HEADER_DTYPE",
    "METRIC_DTYPE",
    "MODULE_DTYPE",
    "NO_ENUM",
    "NO_PROPAGATION_INDEX",
    "N_SECTIONS",
    "PROPAGATION_FUNCTION_BIT",
    "SCOPE_DTYPE",
    "SCOPE_INST_DTYPE",
    "SECTION_NAMES",
    "SEC_CONTEXT",
    "SEC_FILES",
    "SEC_FUNCTIONS",
    "SEC_GENERAL",
    "SEC_ID_NAMES",
    "SEC_METRICS",
    "SEC_MODULES",
    "SEC_STRINGS",
    "STANDARD_SCOPES",
    "SUMMARY_DTYPE",
    "TABLE_HEADER_DTYPE",
    "Combine",
    "Context",
    "ContextIndex",
    "Entry",
    "EntryPointKind",
    "Function",
    "LexicalType",
    "MetaDB",
    "Metric",
    "Module",
    "Node",
    "PropagationScope",
    "Relation",
    "ScopeInstance",
    "ScopeType",
    "SourceFile",
    "SummaryStatistic",
    "_gather_u64",
    "describe",
    "dump",
    "iter_contexts",
    "read",
    "read_buffer",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]
