"""Which kernels and launches ``gpu=...,blocks`` counts: the backend options ``kernel-name=REGEX``,
``launch-skip=N`` and ``launch-count=M`` (issue #34, item 5; Nsight Compute's ``-k``,
``--launch-skip`` and ``--launch-count``, with their meaning).

``kernel-name`` chooses the kernels the PTX pass instruments, by a regular expression searched
in the kernel's (mangled) name (``regex:`` in front, as ncu writes it, is allowed); the others
run as compiled. ``launch-skip=N`` leaves the first N launches of instrumented kernels
uncounted, ``launch-count=M`` counts M launches after them (0, the default: every one). The
options travel inside the ``gpu=`` spec, so a regular expression cannot hold a comma. Standard
library only: every measured process reads it.
"""

from __future__ import annotations

import re

from pyhpctk.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.spec import GpuSpec

#: The options, as ``pyrun -L`` and the spec name them.
FILTER_OPTIONS = ("kernel-name", "launch-skip", "launch-count")


class KernelFilter:
    """Kernels by name, launches by index (a value; not a dataclass, to import fast)."""

    __slots__ = ("count", "regex", "skip")

    def __init__(self, regex: str = "", skip: int = 0, count: int = 0) -> None:
        self.regex = regex.removeprefix("regex:")
        self.skip = skip
        self.count = count

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """The kernels to instrument (None: every kernel)."""
        return re.compile(self.regex) if self.regex else None

    def counted(self, index: int) -> bool:
        """Whether launch ``index`` (0-based, among launches of instrumented kernels) is."""
        return index >= self.skip and (not self.count or index < self.skip + self.count)

    def finished(self, index: int) -> bool:
        """Whether no launch from ``index`` on is counted."""
        return bool(self.count) and index >= self.skip + self.count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KernelFilter):
            return NotImplemented
        return (self.regex, self.skip, self.count) == (other.regex, other.skip, other.count)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KernelFilter({self.regex!r}, skip={self.skip}, count={self.count})"


def kernel_filter(spec: GpuSpec, counting: bool) -> KernelFilter:
    """The filter ``spec`` asks for; its values refused in one line, and the options refused
    without ``blocks`` or ``trace`` (``counting``): they choose what those instrument."""
    said = [key for key, _ in spec.options if key in FILTER_OPTIONS]
    if said and not counting:
        raise UsageError(
            f"gpu={spec.backend}: {said[0]}= chooses the kernels or launches that blocks counts "
            "or trace traces: add one of them (pyrun -L)"
        )
    numbers = []
    for key in FILTER_OPTIONS[1:]:
        text = spec.option(key)
        if text and not text.isdigit():
            raise UsageError(f"gpu={spec.backend}: {key}={text!r}: say a number >= 0")
        numbers.append(int(text or 0))
    kernels = KernelFilter(spec.option("kernel-name"), *numbers)
    if "kernel-name" in said and not kernels.regex:
        raise UsageError(f"gpu={spec.backend}: kernel-name= needs a regular expression")
    try:
        re.compile(kernels.regex)
    except re.error as error:
        raise UsageError(
            f"gpu={spec.backend}: kernel-name={kernels.regex!r} is no regular expression: {error}"
        ) from None
    return kernels
