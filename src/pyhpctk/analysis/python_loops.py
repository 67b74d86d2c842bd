"""Python loops for logical frames: which loops of a function enclose a sampled line.

HPCToolkit places Python samples at function and line only (formats.md §3.8). pystruct recovers
Python sources' loops (``structure.python_source``: ``P`` per code object, ``L`` per loop at its
header line, ``S`` per line, lines used as addresses), so pyprof can put a line sample inside the
loops that contain it — the Python twin of what hpcstruct does for binaries. Given a structure
file's ``LM`` for a source file, :class:`PythonLoops` answers, for a frame ``(co_name,
co_firstlineno, line)``, the header lines of the enclosing loops, outermost first.

A line belongs to the deepest scope of its procedure (nested procedures excluded) that has a
statement on that line: a loop's header line belongs to the loop itself, as in hpcstruct's output.
"""

from __future__ import annotations

from pyhpctk.formats.hpcrun_constants import frame_name
from pyhpctk.formats.hpcstruct_model import LOOP, PROCEDURE, STATEMENT, Scope

LoopPath = tuple[int, ...]


def _procedure_lines(procedure: Scope) -> dict[int, LoopPath]:
    """line -> header lines of the loops enclosing it (outermost first), for one procedure."""
    found: dict[int, LoopPath] = {}
    stack: list[tuple[Scope, LoopPath]] = [(child, ()) for child in procedure.children]
    while stack:
        scope, loops = stack.pop()
        if scope.tag == PROCEDURE:
            continue  # a nested function has its own frames
        if scope.tag == STATEMENT:
            previous = found.get(scope.line)
            if previous is None or len(loops) > len(previous):
                found[scope.line] = loops
        elif scope.tag == LOOP:
            inner = (*loops, scope.line)
            stack.extend((child, inner) for child in scope.children)
        else:  # F or A: transparent here
            stack.extend((child, loops) for child in scope.children)
    return found


class PythonLoops:
    """Loop lookups for the functions of one Python source file (its structure file's ``LM``)."""

    __slots__ = ("_cache", "_procedures")

    def __init__(self, module: Scope) -> None:
        self._procedures: dict[tuple[str, int], list[Scope]] = {}
        for scope in module.walk():
            if scope.tag == PROCEDURE:
                # pyrun names a frame by its qualified name (co_qualname, the P's ``ln`` where it
                # differs from ``n``); a measurement from before that, by co_name.
                qualname = scope.attrs.get("ln", scope.name)
                names = {scope.name, qualname, frame_name(qualname)}
                for name in names:
                    self._procedures.setdefault((name, scope.line), []).append(scope)
        self._cache: dict[tuple[str, int], dict[int, LoopPath]] = {}

    def loops(self, name: str, first_line: int, line: int) -> LoopPath:
        """Header lines of the loops around ``line`` in function ``name`` (``co_qualname`` or
        ``co_name``; ``first_line``: ``co_firstlineno``).

        Empty when the function or line is unknown (an edited source, a name two lambdas share
        with different loops): the frame then stays function → line, as HPCToolkit shows it.
        """
        key = (name, first_line)
        table = self._cache.get(key)
        if table is None:
            table = {}
            procedures = self._procedures.get(key, [])
            for procedure in procedures:
                for where, loops in _procedure_lines(procedure).items():
                    if where in table and table[where] != loops:
                        table[where] = ()  # ambiguous between two same-named procedures
                    else:
                        table[where] = loops
            self._cache[key] = table
        return table.get(line, ())
