"""How the views name a context: in hpcviewer's words, and where it is in the code.

``context_label`` for a row of the calling context tree, ``function_label`` for a function of the
aggregating views (its name and where it is defined), ``where`` for the file, line and load
module a row carries to CSV and JSON.
"""

from __future__ import annotations

import os

from pyhpctk.formats.vocabulary import LexicalType, Relation
from pyhpctk.present.model import LEX_ENTRY, LEX_ROOT, ContextTree


def base_name(path: str | None) -> str:
    return os.path.basename(path) if path else "<unknown file>"


def file_label(tree: ContextTree, node: int) -> str:
    """The shown name of a context's file (:mod:`pyhpctk.present.names`)."""
    return tree.shown_file(int(tree.file[node])) or "<unknown file>"


def is_module_code(tree: ContextTree, node: int) -> bool:
    """Python module-level code: a ``-call> [line]`` context (formats.md §3.8)."""
    return (
        int(tree.lexical_type[node]) == LexicalType.LINE
        and int(tree.relation[node]) == Relation.CALL
    )


def function_label(tree: ContextTree, node: int) -> str:
    """A function as the aggregating views name it: name and where it is defined
    (``__init__ (torch/nn/modules/conv.py: 454)``), so that functions that share a name can be
    told apart; Python module-level code is ``<module> (app.py)``."""
    if is_module_code(tree, node):
        return f"<module> ({file_label(tree, node)})"
    f = int(tree.function[node])
    if f < 0:
        return "<unknown function>"
    info = tree.functions[f]
    if info.file < 0:
        return info.name
    where = tree.shown_file(info.file)
    if where.startswith("[") and where.endswith("]"):  # no source: ``name [lib.so]``
        return info.name if info.name.endswith(f" {where}") else f"{info.name} {where}"
    return f"{info.name} ({where}: {info.line})" if info.line else f"{info.name} ({where})"


def place_label(tree: ContextTree, node: int) -> str:
    """``file: line``, or the file alone where no line is known (a binary without DWARF line
    maps names its scopes ``[libfoo.so]`` with line 0)."""
    line = int(tree.line[node])
    return f"{file_label(tree, node)}: {line}" if line > 0 else file_label(tree, node)


def context_label(tree: ContextTree, node: int) -> tuple[str, str]:
    """(label, kind) of a context, in hpcviewer's words."""
    lex = int(tree.lexical_type[node])
    if lex == LEX_ROOT:
        return "<root>", "root"
    if lex == LEX_ENTRY:
        return tree.names[node] or "<entry>", "entry"
    if lex == LexicalType.FUNCTION:
        name = tree.function_name(node) or "<unknown function>"
        if int(tree.relation[node]) == Relation.INLINED:
            return f"[I] {name}", "inlined"
        return name, "function"
    if lex == LexicalType.LOOP:
        return f"loop at {place_label(tree, node)}", "loop"
    if lex == LexicalType.LINE:
        return place_label(tree, node), "line"
    module = tree.module_name(node)
    return f"{base_name(module) if module else '<unknown module>'}+0x{int(tree.offset[node]):x}", (
        "instruction"
    )


def where(tree: ContextTree, node: int) -> tuple[str | None, int, str | None]:
    f = int(tree.function[node])
    file, line, module = tree.file_name(node), int(tree.line[node]), tree.module_name(node)
    if f >= 0:
        info = tree.functions[f]
        if file is None and info.file >= 0:
            file, line = tree.files[info.file], info.line
        if module is None and info.module >= 0:
            module = tree.modules[info.module]
    return file, line, module
