"""What a Python command line runs, read before pyrun creates anything (issue #36 item 9).

``pyrun -o m python3 app.py`` with ``app.py`` mistyped used to start Python, measure its two
lines of error and leave ``m`` behind, which then refused the corrected run. The launcher asks
:func:`missing_script` first and refuses in one line, creating nothing. Only the interpreter's
own command line is read (``python``, ``python3``, ``python3.12``: CPython's options as
``python --help`` lists them); any other command is left to run.
"""

from __future__ import annotations

import os
import re

#: The names of a Python interpreter's executable.
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")
#: Long options that take the next argument as their value.
_LONG_WITH_VALUE = frozenset({"--check-hash-based-pycs"})


def _script(arguments: list[str]) -> str | None:
    """The script a Python command line names (None: ``-c``, ``-m``, stdin, no script)."""
    rest = iter(arguments)
    for argument in rest:
        if argument == "--":
            return next(rest, None)
        if argument.startswith("--"):
            if argument in _LONG_WITH_VALUE:
                next(rest, None)
            continue
        if argument.startswith("-") and argument != "-":
            letters = argument[1:]
            for at, letter in enumerate(letters):
                if letter in "cm":
                    return None  # -c CMD, -m MODULE: no script file
                if letter in "WX":  # -W ARG, -X OPT: the rest is the value, or the next argument
                    if at == len(letters) - 1:
                        next(rest, None)
                    break
            continue
        return None if argument == "-" else argument
    return None


def missing_script(command: tuple[str, ...], executable: str) -> str | None:
    """Why ``command`` (its executable resolved as ``executable``) cannot start the Python
    script it names, in one line; None when it is no Python command or the script is there."""
    if not _PYTHON.match(os.path.basename(executable)):
        return None
    script = _script(list(command[1:]))
    if script is None or os.path.exists(script):
        return None
    return f"{script}: no such file: Python would not start it (nothing was measured or created)"
