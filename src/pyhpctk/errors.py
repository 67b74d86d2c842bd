"""Error types shared by every tool.

Every failure a user can cause (bad input, a missing file, an unwritable directory) is raised as a
:class:`PyhpctkError` carrying the process exit status the CLI maps it to, and a message of one
line that names what went wrong. Nothing here may import anything but the standard library.
"""

from __future__ import annotations

import os


class PyhpctkError(Exception):
    """Base class of every error a user can cause; ``exit_code`` is what the CLI exits with."""

    exit_code: int = 2


class UsageError(PyhpctkError):
    """The command line asks for something impossible (a bad option value, a missing input)."""

    exit_code = 2


class FormatError(PyhpctkError):
    """A file cannot be read: wrong magic, unsupported version, truncation, bad offsets, ...

    The message always names the file, the section of the format and the problem, as
    ``PATH: SECTION: PROBLEM``, so a user can tell at a glance which input is broken.
    """

    exit_code = 2

    def __init__(self, path: str | os.PathLike[str] | None, section: str, problem: str) -> None:
        self.path = os.fspath(path) if path is not None else "<buffer>"
        self.section = section
        self.problem = problem
        super().__init__(f"{self.path}: {section}: {problem}")


class FormatWarning(UserWarning):
    """A file is readable but something is off (e.g. a newer minor version than we know)."""
