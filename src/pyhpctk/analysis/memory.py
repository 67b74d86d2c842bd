"""How much memory pyprof may use (``--memory-limit``), and the work no limit can split.

pyprof's default limit is a share (:data:`DEFAULT_SHARE`, a half) of the memory this process can
still get: the least of the machine's available memory (``MemAvailable`` in ``/proc/meminfo``:
free memory plus the page cache the kernel can drop), the room left in its control group
(cgroup v2 ``memory.max`` − ``memory.current``, v1 ``memory.limit_in_bytes`` −
``memory.usage_in_bytes``) and the room left under its address-space limit (``ulimit -v``).
Half, because the limit counts the values pyprof holds, not its own footprint (the interpreter,
numpy, the call-path tree), and the page cache that writing the database fills competes for
the rest.

Under a limit the driver splits its work (:mod:`.pipeline`: profiles read twice, blocks kept
in a scratch file, cct.db built in rounds), but two units of work are never split: reading one
profile (:data:`~.state.RAW_BYTES_PER_INPUT_BYTE` bytes a byte of it) and one context's values
in a cct.db round (:data:`~.exchange.BYTES_PER_VALUE` bytes a value). When one of them needs
more than the limit, pyprof stops with a :class:`MemoryLimitError` that names it and the limit
it needs, before the work (:func:`check_profiles`, :func:`check_contexts`). Units of at most
:data:`ALWAYS_FITS` always proceed: pyprof's own footprint, which no limit counts, is larger.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.exchange import BYTES_PER_VALUE
from pyhpctk.analysis.state import RAW_BYTES_PER_INPUT_BYTE
from pyhpctk.errors import PyhpctkError

DEFAULT_SHARE = 0.5
"""The share of the available memory pyprof takes by default."""

ALWAYS_FITS = 64 << 20
"""Bytes a single unit of work may need whatever the limit (the order of pyprof's own
footprint, which the limit does not count)."""

_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge page-rounded number


class MemoryLimitError(PyhpctkError):
    """A unit of work needs more memory than ``--memory-limit`` allows (exit status 2)."""

    exit_code = 2


def size_text(n: int) -> str:
    """``n`` bytes for a message: ``512.0 MiB``, ``3.5 GiB``."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def _option_text(n: int) -> str:
    """The smallest whole ``--memory-limit`` in MiB that holds ``n`` bytes (``368M``)."""
    return f"{-(-n // (1 << 20))}M"


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _cgroup_room(proc: Path, cgroup: Path) -> int | None:
    """Bytes this process's control group may still take, or None without a limit."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    rooms = []
    for line in lines:
        _, controllers, where = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        where = where.lstrip("/")
        if controllers == "":  # cgroup v2
            limit = _number(cgroup / where / "memory.max")
            used = _number(cgroup / where / "memory.current")
        elif "memory" in controllers.split(","):
            limit = _number(cgroup / "memory" / where / "memory.limit_in_bytes")
            used = _number(cgroup / "memory" / where / "memory.usage_in_bytes")
            if limit is None:  # a container sees its own group at the mount's root
                limit = _number(cgroup / "memory" / "memory.limit_in_bytes")
                used = _number(cgroup / "memory" / "memory.usage_in_bytes")
        else:
            continue
        if limit is not None and limit < _NO_LIMIT:
            rooms.append(max(limit - (used or 0), 0))
    return min(rooms) if rooms else None


def _meminfo(proc: Path, key: str) -> int | None:
    """A ``/proc/meminfo``-style field in bytes (``MemAvailable``), or None."""
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name == key and fields and fields[0].isdigit():
            return int(fields[0]) * 1024
    return None


def _address_room(proc: Path) -> int | None:
    """Room left under ``ulimit -v`` (RLIMIT_AS), or None without one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        status = (proc / "self" / "status").read_text().splitlines()
    except OSError:
        status = []
    used = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:")), 0)
    return max(soft - used, 0)


def available_memory(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes of memory this process can still get (see the module docstring)."""
    free = _meminfo(proc, "MemAvailable")
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            free = 1 << 30  # nothing says: assume a small machine
    rooms = [r for r in (_cgroup_room(proc, cgroup), _address_room(proc)) if r is not None]
    return min([free, *rooms])


def default_limit(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """pyprof's ``--memory-limit`` when none is given: :data:`DEFAULT_SHARE` of
    :func:`available_memory`, at least 1 MiB."""
    return max(int(available_memory(proc, cgroup) * DEFAULT_SHARE), 1 << 20)


def _largest_unit(
    amounts: npt.NDArray[np.int64], per_unit: int, limit: int | None
) -> tuple[int, int] | None:
    """The largest of ``amounts`` and the bytes it needs (``per_unit`` each), when that is
    more than ``limit`` allows; None when it fits (or there is no limit)."""
    if limit is None or not len(amounts):
        return None
    largest = int(np.argmax(amounts))
    need = int(amounts[largest]) * per_unit
    return (largest, need) if need > max(limit, ALWAYS_FITS) else None


def _refusal(limit: int, what: str, need: int) -> MemoryLimitError:
    return MemoryLimitError(
        f"--memory-limit {size_text(limit)} cannot be kept: {what} (about {size_text(need)}); "
        f"give --memory-limit {_option_text(need)} or more"
    )


def check_profiles(
    sizes: npt.NDArray[np.int64], name: Callable[[int], str], limit: int | None
) -> None:
    """Raise MemoryLimitError when reading the largest profile (``sizes``: bytes of each
    profile and its trace; ``name(i)`` names profile ``i``) needs more than ``limit``."""
    found = _largest_unit(sizes, RAW_BYTES_PER_INPUT_BYTE, limit)
    if found is not None and limit is not None:
        i, need = found
        what = f"reading the profile {name(i)} ({size_text(int(sizes[i]))} with its trace) takes"
        raise _refusal(limit, what, need)


def check_contexts(counts: npt.NDArray[np.int64], limit: int | None) -> None:
    """Raise MemoryLimitError when one context's values (``counts``: per context, over every
    profile) need more than ``limit`` in a cct.db round."""
    found = _largest_unit(counts, BYTES_PER_VALUE, limit)
    if found is not None and limit is not None:
        c, need = found
        what = f"context {c} has {int(counts[c]):,} values, which building cct.db holds at once"
        raise _refusal(limit, what, need)
