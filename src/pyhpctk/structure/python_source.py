"""Structure recovery for Python source files: pystruct on ``.py`` (architecture.md, pystruct).

Reads a Python source with :mod:`ast` and builds the hpcstruct tree (formats.md §4) that lets
pyprof show Python functions *and loops* in the calling context tree. It never imports or runs
the file.

Tree shape (one ``LM`` per source file)::

    LM n=PATH > F n=PATH > P "<module>" l=1 > P per function / class / lambda / comprehension
                                              > L per loop > L ... > S per line

- **Procedures mirror code objects**, because pyrun records code objects: every ``def``,
  ``async def``, ``lambda`` and ``class`` body is a ``P`` whose ``n`` is ``co_name``, ``ln`` is
  ``co_qualname`` when that differs, and ``l`` is ``co_firstlineno``. CPython 3.11 sets
  ``co_firstlineno`` to the line of the *first decorator* when there are decorators, otherwise to
  the ``def``/``class`` line; ``<module>`` is line 1. Generator expressions, and list, set and
  dict comprehensions before Python 3.12 (PEP 709 inlines them), are code objects too:
  ``P "<genexpr>"``, ``P "<listcomp>"``, ... at the comprehension's first line.
  A ``P`` nests in the ``P`` that defines it (never in an ``L``: the DTD forbids ``L > P``).
- **Loops**: ``for``, ``async for`` and ``while`` statements and every ``for`` clause of a
  comprehension is an ``L`` at its header line (``f`` = the file), nested as in the source. As in
  hpcstruct's output, a ``for`` header line also appears as an ``S`` of the enclosing scope (the
  iterable is evaluated once outside the loop); the loop's own ``S`` for that line stands for the
  per-iteration part. ``else:`` blocks of loops belong to the enclosing scope.
- **Statements**: one ``S`` per source line on which the scope has code: the start line of every
  statement and expression node evaluated in that scope (decorators, default values and
  annotations are evaluated where the ``def`` is, not inside the function), plus the name line of
  a multi-line attribute access (CPython 3.11 puts the load there). ``S`` come first, sorted by
  line, then nested ``L`` and ``P`` in source order, as hpcstruct orders them. Checked against
  CPython 3.11 on its whole standard library: every line any code object's ``co_lines()`` can
  report resolves inside that code object's ``P`` (the prologue line through the entry marker).

**Address convention.** Python has no addresses, so **a line number is the address**: ``S l=N``
has ``v="{[0xN-0xN+1)}"``; a ``P``'s entry marker is its first line and an ``L``'s header marker
its header line, both 1-byte ranges as in binaries. pyrun writes a Python frame as
``lm_ip = (fid << 32) | line`` (formats.md §1.10), so pyprof maps a frame by taking the low 32
bits (:func:`frame_line`), finding the frame's procedure by ``(co_qualname, co_firstlineno)``
(:func:`find_procedures`), and looking the line up with
``AddressMap(procedure, nested_procedures=False)``: the same line can belong to an enclosing
function and to a lambda written on it, so lookups are per procedure.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyhpctk.errors import PyhpctkError
from pyhpctk.formats.hpcrun_constants import frame_name
from pyhpctk.formats.hpcstruct import DTD_4_9, renumber
from pyhpctk.formats.hpcstruct_model import (
    FILE,
    LOAD_MODULE,
    LOOP,
    PROCEDURE,
    STATEMENT,
    Scope,
    StructureFile,
    format_ranges,
)

__all__ = [
    "PythonStructureOptions",
    "PythonSyntaxError",
    "find_procedures",
    "frame_line",
    "line_address_set",
    "recover_module",
    "recover_structure",
]

MODULE_NAME = "<module>"
_COMPREHENSION_NAMES: dict[type[ast.expr], str] = {
    ast.ListComp: "<listcomp>",
    ast.SetComp: "<setcomp>",
    ast.DictComp: "<dictcomp>",
    ast.GeneratorExp: "<genexpr>",
}
# AST nodes whose start line can carry bytecode in the scope that evaluates them.
_LINE_NODES = (ast.stmt, ast.expr, ast.excepthandler, ast.keyword, ast.alias, ast.pattern)


@dataclass(frozen=True, slots=True)
class PythonStructureOptions:
    """How to recover structure from Python sources.

    ``inline_comprehensions``: list/set/dict comprehensions are loops of the enclosing function
    (CPython >= 3.12, PEP 709) rather than code objects of their own (CPython <= 3.11). The default
    follows the running interpreter; set it to match the interpreter pyrun measured.
    """

    inline_comprehensions: bool = sys.version_info >= (3, 12)


class PythonSyntaxError(PyhpctkError):
    """A Python source pystruct cannot parse; the message is ``PATH:LINE:COLUMN: PROBLEM``."""

    exit_code = 2

    def __init__(self, path: str, line: int, column: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.column = column
        self.problem = problem
        super().__init__(f"{path}:{line}:{column}: {problem}")


def line_address_set(line: int) -> str:
    """The ``v`` of a scope at ``line`` under the line-as-address convention: ``{[0xN-0xN+1)}``."""
    return format_ranges([(line, line + 1)])


def frame_line(lm_ip: int) -> int:
    """The source line of a Python frame's ``lm_ip = (fid << 32) | line`` (formats.md §1.10)."""
    return lm_ip & 0xFFFF_FFFF


def find_procedures(module: Scope, name: str, first_line: int) -> list[Scope]:
    """Every ``P`` whose code object has this ``co_qualname`` (as pyrun names it,
    :func:`~pyhpctk.formats.hpcrun_constants.frame_name`, or ``co_name``) and
    ``co_firstlineno``.

    Usually one; two generator expressions (or lambdas) starting on the same line share both
    values, and a measurement cannot tell them apart, so look a line up in each.
    """
    return [
        scope
        for scope in module.walk()
        if scope.tag == PROCEDURE
        and name in (scope.name, scope.attrs.get("ln"), frame_name(scope.attrs.get("ln", "")))
        and scope.line == first_line
    ]


@dataclass(slots=True)
class _Region:
    """A procedure or loop being built.

    ``kind`` is module, class, function (also lambda), comprehension or loop.
    """

    kind: str
    name: str
    line: int
    qualname: str = ""
    lines: set[int] = field(default_factory=set)
    children: list[_Region] = field(default_factory=list)


_Work = tuple[ast.AST, _Region, _Region]  # node, innermost region, innermost procedure
# Fields that never hold a node that matters: names, numbers, flags, and ``ctx`` (Load, Store:
# no line, no children).
_NO_NODES = frozenset(
    {"ctx", "id", "arg", "attr", "name", "asname", "module", "level", "kind", "type_comment"}
    | {"conversion", "simple", "is_async", "n", "s"}
)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the walk needs of one AST class: whether its nodes carry a line of code, whether
    it is an attribute access, and the fields that may hold child nodes."""

    has_line: bool
    attribute: bool
    fields: tuple[str, ...]


_SHAPES: dict[type[ast.AST], _Shape] = {}


def _shape(kind: type[ast.AST]) -> _Shape:
    shape = _Shape(
        issubclass(kind, _LINE_NODES),
        kind is ast.Attribute,
        tuple(name for name in kind._fields if name not in _NO_NODES),
    )
    _SHAPES[kind] = shape
    return shape


class _Builder:
    def __init__(self, options: PythonStructureOptions) -> None:
        self.options = options
        self.work: list[_Work] = []

    def build(self, tree: ast.Module) -> _Region:
        module = _Region("module", MODULE_NAME, 1, MODULE_NAME)
        self.schedule((statement, module, module) for statement in tree.body)
        # Iterative: deeply nested expressions must not hit the recursion limit. A depth-first
        # walk in source order; the nodes that open no scope or loop (nine in ten) are
        # handled here without a call each (issue #36, item 8: the 285 sources of a
        # scikit-learn program hold a million nodes).
        work = self.work
        special = self.special
        while work:
            node, region, proc = work.pop()
            kind = type(node)
            handler = special.get(kind)
            if handler is not None:
                handler(node, region, proc)
                continue
            shape = _SHAPES.get(kind) or _shape(kind)
            if shape.has_line:
                region.lines.add(node.lineno)  # type: ignore[attr-defined]
                if shape.attribute and node.end_lineno is not None:  # type: ignore[attr-defined]
                    region.lines.add(node.end_lineno)  # type: ignore[attr-defined]
            children: list[ast.AST] = []
            for name in shape.fields:
                value = getattr(node, name, None)
                if type(value) is list:
                    children.extend(item for item in value if isinstance(item, ast.AST))
                elif isinstance(value, ast.AST):
                    children.append(value)
            work.extend([(child, region, proc) for child in reversed(children)])
        return module

    @property
    def special(self) -> dict[type[ast.AST], Callable[[ast.AST, _Region, _Region], None]]:
        """The nodes that open a scope or a loop, and their handlers (the rest: in build)."""
        handlers: dict[type[ast.AST], Callable[[Any, _Region, _Region], None]] = {
            ast.FunctionDef: self.visit_definition,
            ast.AsyncFunctionDef: self.visit_definition,
            ast.ClassDef: self.visit_definition,
            ast.Lambda: self.visit_lambda,
            ast.For: self.visit_for,
            ast.AsyncFor: self.visit_for,
            ast.While: self.visit_while,
        }
        handlers.update(dict.fromkeys(_COMPREHENSION_NAMES, self.visit_comprehension))
        return handlers

    def schedule(self, items: Iterable[_Work]) -> None:
        """Queue items to be visited in the given (source) order."""
        self.work.extend(reversed(list(items)))

    @staticmethod
    def procedure(parent: _Region, kind: str, name: str, line: int) -> _Region:
        # co_qualname rules: module-level names are bare, class members get "Class.",
        # everything defined inside a function gets "function.<locals>.".
        if parent.kind == "module":
            qualname = name
        elif parent.kind in ("class", "comprehension"):
            qualname = f"{parent.qualname}.{name}"
        else:
            qualname = f"{parent.qualname}.<locals>.{name}"
        region = _Region(kind, name, line, qualname)
        parent.children.append(region)
        return region

    @staticmethod
    def loop(parent: _Region, line: int) -> _Region:
        region = _Region("loop", "", line)
        region.lines.add(line)
        parent.children.append(region)
        return region

    def visit_lambda(self, node: ast.Lambda, region: _Region, proc: _Region) -> None:
        region.lines.add(node.lineno)
        function = self.procedure(proc, "function", "<lambda>", node.lineno)
        self.schedule(
            [(default, region, proc) for default in _defaults(node.args)]
            + [(node.body, function, function)]
        )

    def visit_for(self, node: ast.For | ast.AsyncFor, region: _Region, proc: _Region) -> None:
        region.lines.add(node.lineno)
        body = self.loop(region, node.lineno)
        self.schedule(
            [(node.iter, region, proc), (node.target, body, proc)]
            + [(statement, body, proc) for statement in node.body]
            + [(statement, region, proc) for statement in node.orelse]
        )

    def visit_while(self, node: ast.While, region: _Region, proc: _Region) -> None:
        body = self.loop(region, node.lineno)
        self.schedule(
            [(node.test, body, proc)]
            + [(statement, body, proc) for statement in node.body]
            + [(statement, region, proc) for statement in node.orelse]
        )

    def visit_definition(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        region: _Region,
        proc: _Region,
    ) -> None:
        region.lines.add(node.lineno)
        # co_firstlineno is the first decorator's line when there are decorators (CPython 3.8+).
        first_line = min([node.lineno] + [d.lineno for d in node.decorator_list])
        outside: list[ast.AST] = list(node.decorator_list)
        if isinstance(node, ast.ClassDef):
            kind = "class"
            outside += [*node.bases, *node.keywords]
        else:
            kind = "function"
            outside += _defaults(node.args) + _annotations(node)
        inner = self.procedure(proc, kind, node.name, first_line)
        self.schedule(
            [(expression, region, proc) for expression in outside]
            + [(statement, inner, inner) for statement in node.body]
        )

    def visit_comprehension(
        self,
        node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp,
        region: _Region,
        proc: _Region,
    ) -> None:
        region.lines.add(node.lineno)
        generators = node.generators
        # The outermost iterable is evaluated by the enclosing scope and passed in.
        items: list[_Work] = [(generators[0].iter, region, proc)]
        container, inner_proc = region, proc
        if isinstance(node, ast.GeneratorExp) or not self.options.inline_comprehensions:
            name = _COMPREHENSION_NAMES[type(node)]
            container = inner_proc = self.procedure(proc, "comprehension", name, node.lineno)
            container.lines.add(node.lineno)
        for position, generator in enumerate(generators):
            # CPython 3.11 puts every FOR_ITER of a comprehension on its first line.
            body = self.loop(container, node.lineno)
            if position > 0:
                items.append((generator.iter, container, inner_proc))
            items.append((generator.target, body, inner_proc))
            items.extend((condition, body, inner_proc) for condition in generator.ifs)
            container = body
        if isinstance(node, ast.DictComp):
            items += [(node.key, container, inner_proc), (node.value, container, inner_proc)]
        else:
            items.append((node.elt, container, inner_proc))
        self.schedule(items)


def _defaults(arguments: ast.arguments) -> list[ast.AST]:
    return [*arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]


def _annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    arguments = node.args
    every = [
        *arguments.posonlyargs,
        *arguments.args,
        *([arguments.vararg] if arguments.vararg else []),
        *arguments.kwonlyargs,
        *([arguments.kwarg] if arguments.kwarg else []),
    ]
    found: list[ast.AST] = [a.annotation for a in every if a.annotation is not None]
    if node.returns is not None:
        found.append(node.returns)
    return found


def _emit(region: _Region, path: str) -> Scope:
    if region.kind == "loop":
        attrs = {"l": str(region.line), "f": path, "v": line_address_set(region.line)}
        tag = LOOP
    else:
        attrs = {"n": region.name}
        if region.qualname != region.name:
            attrs["ln"] = region.qualname
        attrs |= {"l": str(region.line), "v": line_address_set(region.line)}
        tag = PROCEDURE
    statements = [
        Scope(STATEMENT, {"l": str(line), "v": line_address_set(line)})
        for line in sorted(region.lines)
    ]
    # Nested scopes in source order (a function is created before the defaults evaluated
    # around it, so creation order alone is not source order).
    nested = sorted(region.children, key=lambda child: child.line)
    return Scope(tag, attrs, statements + [_emit(child, path) for child in nested])


def _parse(path: str, source: bytes | str) -> ast.Module:
    try:
        # Bytes let the compiler honour a PEP 263 coding declaration and a UTF-8 BOM.
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise PythonSyntaxError(path, exc.lineno or 0, exc.offset or 0, exc.msg) from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise PythonSyntaxError(path, 0, 0, str(exc) or type(exc).__name__) from None


def recover_module(
    path: str | os.PathLike[str],
    source: bytes | str | None = None,
    options: PythonStructureOptions | None = None,
) -> Scope:
    """The ``LM`` scope (without ids) for one Python source file.

    ``path`` names the file in the tree (``LM n``, ``F n``, ``L f``): pass the path pyrun saw as
    ``co_filename``. ``source`` is the file's content; when omitted it is read from ``path``.
    Raises :class:`PythonSyntaxError` (``PATH:LINE:COLUMN: PROBLEM``) for unparsable source.
    """
    name = os.fspath(path)
    if source is None:
        try:
            with open(name, "rb") as stream:
                source = stream.read()
        except OSError as exc:
            raise PyhpctkError(f"{name}: cannot read: {exc.strerror or exc}") from None
    tree = _parse(name, source)
    module = _Builder(options or PythonStructureOptions()).build(tree)
    procedure = _emit(module, name)
    file_scope = Scope(FILE, {"n": name}, [procedure])
    return Scope(LOAD_MODULE, {"n": name, "has-calls": "0", "v": "{}"}, [file_scope])


def recover_structure(
    path: str | os.PathLike[str],
    source: bytes | str | None = None,
    options: PythonStructureOptions | None = None,
) -> StructureFile:
    """A whole hpcstruct file for one Python source, ids assigned as hpcstruct assigns them."""
    structure = StructureFile(modules=[recover_module(path, source, options)], doctype=DTD_4_9)
    renumber(structure)
    return structure
