"""How pyview names source files: by where they sit in a package or the program, not by basename.

A bare basename says little in a real program (``__init__.py: 231`` is one of hundreds), and a
full path is mostly the same long prefix. So a file is shown (issue #21 item 2):

* below ``site-packages`` / ``dist-packages``, as its path there (``torch/nn/modules/conv.py``);
* in Python's standard library (``.../lib/pythonX.Y/``), as its path there
  (``multiprocessing/pool.py``);
* a C source of the interpreter itself, named by its debug information at the path CPython was
  built in (``/tmp/python-build.20260509073455.222/Python-3.11.7/Modules/_randommodule.c``,
  ``/build/cpython/Objects/listobject.c``), as its path in CPython's source tree, marked
  ``[python]``: ``Modules/_randommodule.c [python]`` (issue #36 item 2);
* otherwise relative to the *program's root*: the deepest directory holding every Python source
  of the database outside those (one script: its directory, so ``app.py``); when they share no
  directory but ``/``, by their full paths. Native sources (``malloc.c``, named by a library's
  debug information at the path it was built from) do not move the root: the program's own
  files read the same in a database with and without them (issue #36 item 5; before, one
  ``/build/glibc/malloc.c`` turned every name absolute).

Names that are not absolute paths (``<frozen importlib._bootstrap>``, ``[libc-2.31.so]``,
``<string>``, a relative path) are shown as they are. Nothing here reads the file system.

Every name a view shows (functions, files, modules, threads, identifier kinds, the title) is
first passed through :func:`shown_name`: a character a terminal would act on rather than show
(``\\x1b[2J`` clears the screen; a NUL, a newline, a bidirectional override) is written as
Python escapes it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

#: Directories below which a file is named by its path inside an installed package.
PACKAGE_DIRECTORIES = ("site-packages", "dist-packages")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/")
#: A C source in CPython's own tree (an unpacked ``Python-3.11.7`` or a ``cpython`` checkout):
#: the last such directory and the file's path below it.
_INTERPRETER = re.compile(
    r".*/(?:Python-\d+\.\d+[\w.+-]*|cpython[\w.+-]*)/"
    r"((?:Modules|Objects|Python|Parser|Include|Programs)/.+)$"
)
INTERPRETER_MARK = " [python]"


def shown_name(text: str) -> str:
    """``text`` with each character that is not printable written as Python's repr writes it
    (``\\x1b``, ``\\x00``, ``\\n``, ``\\u202e``); a surrogate escape (a byte of a name that was not
    UTF-8) stays, for the output's encoding to write as a byte or escape (docs/pyview.md)."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or "\ud800" <= c <= "\udfff" else repr(c)[1:-1] for c in text
    )


def _library_name(path: str) -> str | None:
    """A file's name inside site-packages or the standard library, or None for other files."""
    parts = path.split("/")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in PACKAGE_DIRECTORIES:
            return "/".join(parts[i + 1 :])
    ends = [match.end() for match in _STDLIB.finditer(path)]
    if ends:
        return path[ends[-1] :]
    interpreter = _INTERPRETER.match(path)
    return interpreter[1] + INTERPRETER_MARK if interpreter else None


#: What a Python source of the program is named (a script without one counts when no file
#: of the program has one).
PYTHON_SOURCES = (".py", ".pyw")


def program_root(paths: Sequence[str]) -> str | None:
    """The deepest directory holding every absolute Python source of ``paths`` outside the
    libraries (every absolute path outside them, when none is a Python source).

    None when there is no such file or they share nothing but ``/``.
    """
    own = [p for p in paths if p.startswith("/") and _library_name(p) is None]
    python = [p for p in own if p.endswith(PYTHON_SOURCES)]
    own = python or own
    if not own:
        return None
    root = posixpath.commonpath([posixpath.dirname(p) for p in own])
    return None if root in ("/", "") else root


def short_paths(paths: Sequence[str]) -> tuple[str, ...]:
    """The name pyview shows for each path (see the module docstring), in the same order."""
    root = program_root(paths)
    out = []
    for path in paths:
        if not path.startswith("/"):
            out.append(path)
            continue
        library = _library_name(path)
        if library:
            out.append(library)
        elif root is not None and path.startswith(root + "/"):
            out.append(path[len(root) + 1 :])
        else:
            out.append(path)
    return tuple(out)
