"""Rooms of a size one can hold in mind (style.md item 18, issue #19 item 3), with doors (#33).

No module of ``src/`` over 800 lines and no function over 120: a module that grew past that
holds several sections that change for different reasons (layout, model, read, write, check)
and is split into a package; a function that long is several stages. The C sources and headers
of ``src/`` (the sampling engine, the CUPTI hook) are held to the same 800 lines per file, split
into parts of one extension; their functions are not measured. An exception below (a
room other work is rebuilding) names why, and the test fails once an exception is no longer
needed, so the list only shrinks; it is empty now.

And rooms talk through their doors (issue #33, "Done when"): no import circle among the modules
of ``src/`` (imports inside functions and under ``TYPE_CHECKING`` count: a lazy import hides a
circle, it does not break it), no private name (``_helper``) imported from another module, nor a
private module imported from outside its package, no class with more than 25 attributes (its
annotated fields, ``__slots__`` and ``self.x`` it assigns, with those of its bases in ``src/``),
and no two top-level classes or ``NewType`` ids of ``src/`` sharing a name (declared once, imported
everywhere). :data:`DOOR_EXCEPTIONS` lists the violations another room's rebuilding removes;
like :data:`EXCEPTIONS` it only shrinks, and it is empty now.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "pyhpctk"
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120
MAX_CLASS_ATTRIBUTES = 25

# path relative to src/pyhpctk (a module, C source or header), or "path:function" -> why it may
# stay too long.
EXCEPTIONS: dict[str, str] = {}


def _sizes() -> dict[str, int]:
    """Lines of every module, C source and header, and of every Python function (``path:name``,
    nested ones included)."""
    sizes: dict[str, int] = {}
    for path in sorted([*SRC.rglob("*.c"), *SRC.rglob("*.h")]):
        sizes[path.relative_to(SRC).as_posix()] = path.read_text(encoding="utf-8").count("\n")
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        sizes[name] = path.read_text(encoding="utf-8").count("\n")
        for node in _nodes(path):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                key = f"{name}:{node.name}"
                sizes[key] = max(sizes.get(key, 0), length)
    return sizes


def _too_long(sizes: dict[str, int]) -> set[str]:
    return {
        key
        for key, lines in sizes.items()
        if lines > (MAX_FUNCTION_LINES if ":" in key else MAX_MODULE_LINES)
    }


def test_no_module_or_function_outgrows_its_room() -> None:
    found = {key: _sizes()[key] for key in _too_long(_sizes()) - set(EXCEPTIONS)}
    assert found == {}, (
        f"over {MAX_MODULE_LINES} lines (a module, C source or header) or {MAX_FUNCTION_LINES}"
        " (a function); split these (style.md item 18): "
        + ", ".join(f"{key} ({lines} lines)" for key, lines in sorted(found.items()))
    )


def test_every_exception_is_still_needed() -> None:
    over = _too_long(_sizes())
    stale = sorted(key for key in EXCEPTIONS if key not in over)
    assert stale == [], f"no longer too long, remove from EXCEPTIONS: {stale}"


# -- doors (issue #33) ---------------------------------------------------------------------------
# "circle MODULE" (a module in an import circle), "private MODULE NAME" (a private name MODULE
# imports from another module), "attributes MODULE.CLASS" (more than 25) or "twice NAME" (a
# class or id declared in two modules) -> why it may stay, until the rebuilding named removes it.
DOOR_EXCEPTIONS: dict[str, str] = {}


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module, walked once: the checks below look at each module's nodes
    five times, and ``ast.walk`` was most of this file's minute (issue #36, item 9)."""
    return tuple(ast.walk(_parse(path)))


@functools.cache
def _modules() -> dict[str, Path]:
    """Every Python module of ``src/`` by its dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_submodule(package: Path, name: str) -> bool:
    """Whether ``name`` is a module of the package in ``package`` (Python, a stub, or a compiled
    extension such as ``_engine.cpython-311-x86_64-linux-gnu.so``)."""
    return (package / name).is_dir() or any(package.glob(f"{name}.*"))


@functools.cache
def _imports(module: str, path: Path) -> tuple[tuple[str, str | None], ...]:
    """(module imported, name imported from it or None) for every import of ``module``, those in
    functions and under ``TYPE_CHECKING`` included; ``from p import m`` of a module ``m`` is
    (``p.m``, None)."""
    return tuple(_each_import(module, path))


def _each_import(module: str, path: Path) -> Iterator[tuple[str, str | None]]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                folder = SRC.parent.joinpath(*base.split("."))
                if _is_submodule(folder, alias.name):
                    yield f"{base}.{alias.name}", None
                else:
                    yield base, alias.name


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _circles() -> set[str]:
    """Modules that sit on a cycle of the import graph of ``src/`` (Tarjan's strongly connected
    components, iteratively)."""
    modules = _modules()
    graph = {
        name: sorted({t for t, _ in _imports(name, path) if t in modules and t != name})
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[str] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if edge < len(graph[node]):
                work.append((node, edge + 1))
                target = graph[node][edge]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if work:  # back in the caller: it takes its child's low link
                caller = work[-1][0]
                low[caller] = min(low[caller], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.update(component)
    return {f"circle {name}" for name in circles}


def _private_imports() -> set[str]:
    """A private name imported from another module, or a private module imported from outside
    the package that holds it."""
    found: set[str] = set()
    for module, path in _modules().items():
        for target, name in _imports(module, path):
            if not target.startswith("pyhpctk"):
                continue  # the standard library's _thread is no room of ours
            if name is not None and _is_private(name):
                found.add(f"private {module} {target}.{name}")
            parts = target.split(".")
            for depth, part in enumerate(parts):
                package = ".".join(parts[:depth])
                inside = module == package or module.startswith(f"{package}.")
                if _is_private(part) and not inside:
                    found.add(f"private {module} {'.'.join(parts[: depth + 1])}")
        found.update(
            f"private {module} {target}.{attribute}"
            for target, attribute in _module_attributes(module, path)
            if target.startswith("pyhpctk") and _is_private(attribute)
        )
    return found


def _module_attributes(module: str, path: Path) -> Iterator[tuple[str, str]]:
    """(module, attribute) of every ``module.attribute`` read through a module imported whole
    (``from pyhpctk.structure import dwarf as dw`` ... ``dw._helper``)."""
    bound: dict[str, str] = {}
    for target, name in _imports(module, path):
        if name is None:
            bound[target.rpartition(".")[2]] = target
    for node in _nodes(path):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.asname and alias.name.rpartition(".")[2] in bound:
                    bound[alias.asname] = bound[alias.name.rpartition(".")[2]]
    for node in _nodes(path):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
        ):
            yield bound[node.value.id], node.attr


def _own_attributes(node: ast.ClassDef) -> set[str]:
    """Annotated fields (not ``ClassVar``), ``__slots__`` and ``self.x`` assigned in methods."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if "ClassVar" not in ast.unparse(item.annotation):
                names.add(item.target.id)
        elif isinstance(item, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets
        ):
            if isinstance(item.value, ast.Tuple | ast.List):
                names.update(e.value for e in item.value.elts if isinstance(e, ast.Constant))
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(item):
                targets: list[ast.expr] = []
                if isinstance(inner, ast.Assign):
                    targets = inner.targets
                elif isinstance(inner, ast.AnnAssign | ast.AugAssign):
                    targets = [inner.target]
                for target in targets:
                    for part in ast.walk(target):
                        if (
                            isinstance(part, ast.Attribute)
                            and isinstance(part.value, ast.Name)
                            and part.value.id == "self"
                        ):
                            names.add(part.attr)
    return names


def _large_classes() -> dict[str, int]:
    """``module.Class`` -> attributes, its bases' in ``src/`` included (a mixin's attributes are
    the class's), for classes over :data:`MAX_CLASS_ATTRIBUTES`."""
    classes: dict[str, tuple[set[str], list[str]]] = {}
    imported: dict[str, dict[str, str]] = {}
    for module, path in _modules().items():
        imported[module] = {name: f"{t}.{name}" for t, name in _imports(module, path) if name}
        for node in _nodes(path):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                classes[f"{module}.{node.name}"] = (_own_attributes(node), bases)

    def attributes(key: str, seen: frozenset[str]) -> set[str]:
        names, bases = classes[key]
        module = key.rpartition(".")[0]
        total = set(names)
        for base in bases:
            target = imported[module].get(base, f"{module}.{base}")
            if target in classes and target not in seen:
                total |= attributes(target, seen | {target})
        return total

    counts = {key: len(attributes(key, frozenset({key}))) for key in classes}
    return {key: n for key, n in counts.items() if n > MAX_CLASS_ATTRIBUTES}


def _declared_twice() -> dict[str, list[str]]:
    """Public top-level classes and ``NewType`` ids declared in more than one module."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, path in _modules().items():
        for node in _parse(path).body:
            name = None
            if isinstance(node, ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                called = node.value.func
                if isinstance(called, ast.Name) and called.id == "NewType":
                    target = node.targets[0]
                    name = target.id if isinstance(target, ast.Name) else None
            if name is not None and not _is_private(name):
                where[name].append(module)
    return {name: modules for name, modules in where.items() if len(modules) > 1}


@functools.cache
def _door_violations() -> dict[str, str]:
    found = {key: "an import circle" for key in _circles()}
    found.update({key: "a private name imported" for key in _private_imports()})
    found.update({f"attributes {key}": f"{n} attributes" for key, n in _large_classes().items()})
    found.update(
        {f"twice {name}": ", ".join(modules) for name, modules in _declared_twice().items()}
    )
    return found


def test_rooms_talk_through_doors() -> None:
    found = {k: v for k, v in _door_violations().items() if k not in DOOR_EXCEPTIONS}
    assert found == {}, (
        "import circles (lazy or type-only included), private names imported, classes over "
        f"{MAX_CLASS_ATTRIBUTES} attributes, or names declared twice (issue #33): "
        + "; ".join(f"{key} ({why})" for key, why in sorted(found.items()))
    )


def test_every_door_exception_is_still_needed() -> None:
    stale = sorted(set(DOOR_EXCEPTIONS) - set(_door_violations()))
    assert stale == [], f"no longer a violation, remove from DOOR_EXCEPTIONS: {stale}"
