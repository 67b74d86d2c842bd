"""The one error the PTX pass raises for PTX it cannot read or rewrite."""

from __future__ import annotations

from pyhpctk.errors import PyhpctkError


class PtxError(PyhpctkError):
    """PTX the pass cannot parse or instrument; the message names the line and the problem."""

    exit_code = 2

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(f"PTX line {line}: {problem}" if line else f"PTX: {problem}")
