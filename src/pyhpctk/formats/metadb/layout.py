"""meta.db's layout (formats.md §3.2, §3.6): section numbers, record dtypes, flag bits.

Every record of the file is a numpy structured dtype with explicit offsets, its size asserted
here against the spec; the enumerations the records hold are the database's vocabulary
(:mod:`pyhpctk.formats.vocabulary`), imported, not redeclared. Data only: the reader
(:mod:`.read`) and the writer (:mod:`.write`) take the layout from here.
"""

from __future__ import annotations

from enum import IntEnum

from pyhpctk.formats import _db
from pyhpctk.formats.vocabulary import ContextFlags

FORMAT_ID = b"meta"
FOOTER = _db.FOOTERS[FORMAT_ID]
N_SECTIONS = 8
HEADER_END = _db.HEADER_SIZE + N_SECTIONS * _db.SECTION_ENTRY_SIZE
assert HEADER_END == 0x90

# formats.md §3.2, file header: section k's (size, offset) pair sits at 0x10 + 16*k.
SEC_GENERAL, SEC_ID_NAMES, SEC_METRICS, SEC_CONTEXT = 0, 1, 2, 3
SEC_STRINGS, SEC_MODULES, SEC_FILES, SEC_FUNCTIONS = 4, 5, 6, 7
SECTION_NAMES = (
    "General",
    "IdNames",
    "Metrics",
    "Context",
    "Strings",
    "Modules",
    "Files",
    "Functions",
)


# formats.md §3.2, General section (expandable).
GENERAL_DTYPE = _db.struct_dtype([("pTitle", "<u8", 0x00), ("pDescription", "<u8", 0x08)], 0x10)
# formats.md §3.2, IdNames section header.
ID_NAMES_DTYPE = _db.struct_dtype([("ppNames", "<u8", 0x00), ("nKinds", "u1", 0x08)], 0x09)
# formats.md §3.2, Metrics section header; nScopes is u16 on disk (§3.9 item 4).
METRICS_HEADER_DTYPE = _db.struct_dtype(
    [
        ("pMetrics", "<u8", 0x00),
        ("nMetrics", "<u4", 0x08),
        ("szMetric", "u1", 0x0C),
        ("szScopeInst", "u1", 0x0D),
        ("szSummary", "u1", 0x0E),
        ("pScopes", "<u8", 0x10),
        ("nScopes", "<u2", 0x18),
        ("szScope", "u1", 0x1A),
    ],
    0x1B,
)
# formats.md §3.2, {MD} metric description.
METRIC_DTYPE = _db.struct_dtype(
    [
        ("pName", "<u8", 0x00),
        ("pScopeInsts", "<u8", 0x08),
        ("pSummaries", "<u8", 0x10),
        ("nScopeInsts", "<u2", 0x18),
        ("nSummaries", "<u2", 0x1A),
    ],
    0x20,
)
# formats.md §3.2, {PSI} propagation-scope instance.
SCOPE_INST_DTYPE = _db.struct_dtype([("pScope", "<u8", 0x00), ("propMetricId", "<u2", 0x08)], 0x10)
# formats.md §3.2, {SS} summary statistic.
SUMMARY_DTYPE = _db.struct_dtype(
    [
        ("pScope", "<u8", 0x00),
        ("pFormula", "<u8", 0x08),
        ("combine", "u1", 0x10),
        ("statMetricId", "<u2", 0x12),
    ],
    0x18,
)
# formats.md §3.2, {PS} propagation scope.
SCOPE_DTYPE = _db.struct_dtype(
    [("pScopeName", "<u8", 0x00), ("type", "u1", 0x08), ("propagationIndex", "u1", 0x09)], 0x10
)
# formats.md §3.2: Modules, Files and Functions section headers share one shape.
TABLE_HEADER_DTYPE = _db.struct_dtype(
    [("pEntries", "<u8", 0x00), ("nEntries", "<u4", 0x08), ("szEntry", "<u2", 0x0C)], 0x0E
)
MODULE_DTYPE = _db.struct_dtype([("flags", "<u4", 0x00), ("pPath", "<u8", 0x08)], 0x10)
FILE_DTYPE = _db.struct_dtype([("flags", "<u4", 0x00), ("pPath", "<u8", 0x08)], 0x10)
FUNCTION_DTYPE = _db.struct_dtype(
    [
        ("pName", "<u8", 0x00),
        ("pModule", "<u8", 0x08),
        ("offset", "<u8", 0x10),
        ("pFile", "<u8", 0x18),
        ("line", "<u4", 0x20),
        ("flags", "<u4", 0x24),
    ],
    0x28,
)
# formats.md §3.2 and §3.9 item 3, Context section header.
CONTEXTS_HEADER_DTYPE = _db.struct_dtype(
    [("pEntryPoints", "<u8", 0x00), ("nEntryPoints", "<u2", 0x08), ("szEntryPoint", "u1", 0x0A)],
    0x0B,
)
# formats.md §3.2, {Entry} entry point.
ENTRY_POINT_DTYPE = _db.struct_dtype(
    [
        ("szChildren", "<u8", 0x00),
        ("pChildren", "<u8", 0x08),
        ("ctxId", "<u4", 0x10),
        ("entryPoint", "<u2", 0x14),
        ("pPrettyName", "<u8", 0x18),
    ],
    0x20,
)
# formats.md §3.2, {Ctx} context: this fixed head, then nFlexWords 8-byte flex words.
#
#   0x00 szChildren   0x08 pChildren   0x10 ctxId(u32) flags relation lexicalType nFlexWords
#   0x18 propagation(u16) pad[6]       0x20 flex: [pFunction] [pFile, line|pad] [pModule, offset]
CONTEXT_DTYPE = _db.struct_dtype(
    [
        ("szChildren", "<u8", 0x00),
        ("pChildren", "<u8", 0x08),
        ("ctxId", "<u4", 0x10),
        ("flags", "u1", 0x14),
        ("relation", "u1", 0x15),
        ("lexicalType", "u1", 0x16),
        ("nFlexWords", "u1", 0x17),
        ("propagation", "<u2", 0x18),
    ],
    0x20,
)
for _dtype, _size in (
    (GENERAL_DTYPE, 16),
    (METRICS_HEADER_DTYPE, 27),
    (METRIC_DTYPE, 32),
    (SCOPE_INST_DTYPE, 16),
    (SUMMARY_DTYPE, 24),
    (SCOPE_DTYPE, 16),
    (MODULE_DTYPE, 16),
    (FILE_DTYPE, 16),
    (FUNCTION_DTYPE, 40),
    (ENTRY_POINT_DTYPE, 32),
    (CONTEXT_DTYPE, 32),
):
    assert _dtype.itemsize == _size

# formats.md §3.2, {Ctx}.flags: the payload bits, from the vocabulary.
CTX_HAS_FUNCTION, CTX_HAS_SRCLOC, CTX_HAS_POINT = (int(flag) for flag in ContextFlags)

DEFAULT_TITLE = "<unnamed>"
DEFAULT_DESCRIPTION = "TODO database description"


def enum_name(enum: type[IntEnum], value: int) -> str:
    """The lower-case name of ``value`` in ``enum``, or ``unknown(N)`` for one it lacks."""
    try:
        return enum(value).name.lower()
    except ValueError:
        return f"unknown({value})"
