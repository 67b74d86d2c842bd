"""Per-thread calling context trees with sparse per-kind metric storage, and Python frame ids.

A :class:`ThreadCCT` is one thread's tree in the shape hpcrun writes (formats.md §1.5):
``^Primary`` (placeholder root) → ``| Main  `` or ``| Thread`` fence → frames. Nodes live in
parallel lists indexed by a dense *node index*; a dict keyed by ``(parent, lm, ip)`` finds a
child in O(1). Each node also gets a persistent *node id* from the process-wide
:class:`NodeIdAllocator` (even numbers from 12 step 2, as hpcrun allocates them; a node a trace
references is written with bit 0 set).

Metric values are stored sparsely by *metric kind* (:class:`MetricKind`): a kind (CPU sampling,
later GPU kernels, GPU instructions...) owns a few metrics, and a thread stores, per kind, only
the nodes that have values of that kind, in one flat ``array('d')`` of ``width`` slots per node.
A GPU layer adds its own kind with :meth:`~pyhpctk.measure.session.Session.add_metric_kind`,
inserts placeholders with :meth:`ThreadCCT.placeholder` and attributes with :meth:`ThreadCCT.add`.

Python frames are *logical frames* (formats.md §1.10): one CCT node per frame with
``lm_id`` = the ``logical/python.XXXXXXXX`` load module and ``lm_ip = fid << 32 | line``, where
:class:`FunctionTable` gives each code object a fid and records its stanza. Its caches are keyed
by the code object's identity, never by the code object: code objects compare equal by value,
and CPython's code equality ignores ``co_filename``, so two copies of one function in two files
(two copies of a module) would share a fid.

This module runs inside measured programs: standard library only, no numpy, no I/O.
"""

from __future__ import annotations

import itertools
import threading
from array import array

# formats.md §1.5, §1.10: placeholder names (8 ASCII characters, packed big-endian into lm_ip),
# the placeholders' lm id and Python frames' lm_ip, declared with the format's other constants.
from pyhpctk.formats.hpcrun_constants import LOGICAL_FID_SHIFT as FID_SHIFT
from pyhpctk.formats.hpcrun_constants import LOGICAL_LINE_MASK as LINE_MASK
from pyhpctk.formats.hpcrun_constants import MAIN_FENCE as MAIN_FENCE
from pyhpctk.formats.hpcrun_constants import NO_ACTIVITY as NO_ACTIVITY
from pyhpctk.formats.hpcrun_constants import PLACEHOLDER_LM_ID as PLACEHOLDER_LM
from pyhpctk.formats.hpcrun_constants import PRIMARY_ROOT as PRIMARY_ROOT
from pyhpctk.formats.hpcrun_constants import THREAD_FENCE as THREAD_FENCE
from pyhpctk.formats.hpcrun_constants import frame_name
from pyhpctk.formats.hpcrun_constants import placeholder_ip as placeholder_ip

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from types import CodeType, FrameType

FIRST_NODE_ID = 12  # formats.md §1.5: hpcrun allocates ids 12, 14, 16...


#: The engine's encoding of a native frame's ip: NATIVE_BIT | load module << 48 | offset.
NATIVE_BIT = 1 << 63
NATIVE_OFFSET_MASK = (1 << 48) - 1


class NodeIdAllocator:
    """Process-wide node ids, as hpcrun's global counter: 12, 14, 16... (formats.md §1.5).

    ``next`` on an :func:`itertools.count` is atomic under the GIL, so threads share one
    allocator without a lock. After ``fork`` the child starts a new allocator.
    """

    __slots__ = ("_counter",)

    def __init__(self, first: int = FIRST_NODE_ID) -> None:
        self._counter = itertools.count(first, 2)

    def allocate(self) -> int:
        return next(self._counter)


class MetricSpec:
    """One metric of a kind, as the metric table will describe it (formats.md §1.6).

    The classes here are plain slotted classes, not dataclasses: importing and building
    dataclasses would cost every measured process milliseconds at start-up.
    """

    __slots__ = ("description", "is_real", "move_to_proc", "name", "period", "show", "show_percent")

    def __init__(
        self,
        name: str,
        description: str = "",
        is_real: bool = True,
        show: int = 1,
        show_percent: bool = True,
        move_to_proc: bool = False,
        period: int = 1,
    ) -> None:
        self.name = name
        self.description = description
        self.is_real = is_real
        self.show = show
        self.show_percent = show_percent
        self.move_to_proc = move_to_proc
        self.period = period

    def flags(self) -> bytes:
        """The 16 raw flag bytes: type raw, valTy null, valFmt, move2proc, show, showPercent."""
        return bytes(
            [
                1,  # type: raw
                0,  # valTy: null
                2 if self.is_real else 1,  # valFmt: real / integer
                int(self.move_to_proc),
                0,  # partner (u16 little-endian)
                0,
                self.show,
                int(self.show_percent),
            ]
        ) + bytes(8)


class MetricKind:
    """A group of metrics stored together (CPU sampling, GPU kernels, ...).

    ``base`` is the index of the kind's first metric in the profile's metric table; the session
    assigns it when the kind is added. Kinds compare by identity.
    """

    __slots__ = ("base", "metrics", "name")

    def __init__(self, name: str, metrics: tuple[MetricSpec, ...], base: int = -1) -> None:
        self.name = name
        self.metrics = tuple(metrics)
        self.base = base

    @property
    def width(self) -> int:
        return len(self.metrics)


class KindValues:
    """One thread's values of one kind: node index → slot, and ``width`` doubles per slot."""

    __slots__ = ("kind", "slot_of", "values")

    def __init__(self, kind: MetricKind) -> None:
        self.kind = kind
        self.slot_of: dict[int, int] = {}
        self.values: array[float] = array("d")

    def add(self, node: int, metric: int, value: float) -> None:
        slot = self.slot_of.get(node)
        if slot is None:
            slot = len(self.slot_of)
            self.slot_of[node] = slot
            self.values.extend([0.0] * self.kind.width)
        self.values[slot * self.kind.width + metric] += value

    def get(self, node: int, metric: int) -> float:
        slot = self.slot_of.get(node)
        return 0.0 if slot is None else self.values[slot * self.kind.width + metric]


class FunctionStanza:
    """One record of the logical metadata file (formats.md §1.10).

    ``funcname`` "" stands for NULL (module-level code); ``filename`` "" for NULL (a C function
    called from Python).
    """

    __slots__ = ("fid", "filename", "funcname", "lineno")

    def __init__(self, fid: int, funcname: str, filename: str, lineno: int) -> None:
        self.fid = fid
        self.funcname = funcname
        self.filename = filename
        self.lineno = lineno

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FunctionStanza):
            return NotImplemented
        return (self.fid, self.funcname, self.filename, self.lineno) == (
            other.fid,
            other.funcname,
            other.filename,
            other.lineno,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FunctionStanza({self.fid}, {self.funcname!r}, {self.filename!r}, {self.lineno})"


class FunctionTable:
    """Code object → fid, and the stanzas of the ``logical/python.XXXXXXXX`` file.

    A fid of 0 in the cache marks a code object to skip: frames of pyrun itself. fid 0 is
    reserved for "unknown" by the format, so it is never a real function.

    The caches are keyed by ``id(code)`` (see the module docstring); the table keeps every code
    object it has seen alive, so that an id is never reused by another code object while the
    table holds it. An int key also hashes faster than a code object, whose hash is computed
    from its contents at every lookup.
    """

    __slots__ = ("_by_key", "_codes", "_lock", "fid_of", "ip_of", "skip_prefixes", "stanzas")

    def __init__(self, skip_prefixes: tuple[str, ...] = ()) -> None:
        self.fid_of: dict[int, int] = {}  # id(code) -> fid
        # (id(code), f_lasti) -> fid << 32 | line, or 0 for a frame to skip: one dict lookup
        # per frame in the sampler instead of a fid lookup plus a line-table scan (f_lineno).
        self.ip_of: dict[tuple[int, int], int] = {}
        self.stanzas: list[FunctionStanza] = []
        self.skip_prefixes = skip_prefixes
        self._by_key: dict[tuple[str, str, int], int] = {}
        self._codes: list[CodeType] = []  # every code object registered, kept alive
        self._lock = threading.Lock()

    def fid(self, code: CodeType) -> int | None:
        """The fid ``code`` was given (0: a frame skipped), None before its first sighting."""
        return self.fid_of.get(id(code))

    def register(self, code: CodeType) -> int:
        """The fid of ``code`` (allocating one on first sight), or 0 for a frame to skip."""
        filename = code.co_filename
        if id(code) not in self.fid_of:
            self._codes.append(code)
        if self.skip_prefixes and filename.startswith(self.skip_prefixes):
            self.fid_of[id(code)] = 0
            return 0
        # formats.md §1.10: module-level code is a stanza with a NULL name (and, as hpcrun
        # writes it, line 0); a function is (its qualified name, co_filename, co_firstlineno):
        # Vector.__sub__ is told from Point.__sub__ (issue #36 item 5; frame_name).
        module_level = code.co_name == "<module>"
        funcname = "" if module_level else frame_name(code.co_qualname)
        lineno = 0 if module_level else code.co_firstlineno
        fid = self.named(funcname, filename, lineno)
        self.fid_of[id(code)] = fid
        return fid

    def named(self, funcname: str, filename: str = "", lineno: int = 0) -> int:
        """The fid of a frame that is no code object: ``<unknown code>`` (a NULL file name), or
        a GPU kernel's function and its source file from the kernel's PTX (issue #34)."""
        key = (funcname, filename, lineno)
        # A garbage collection can start at any allocation of a tracked object, and the Python
        # sampler's gc.callbacks entry then names the collecting thread's frames (gc_context):
        # nothing is allocated while the lock is held, or that thread waits for itself.
        while True:
            with self._lock:
                fid = self._by_key.get(key)
                if fid is not None:
                    return fid
                fid = len(self.stanzas) + 1
            stanza = FunctionStanza(fid, funcname, filename, lineno)
            with self._lock:
                if key not in self._by_key and len(self.stanzas) + 1 == fid:
                    self.stanzas.append(stanza)
                    self._by_key[key] = fid
                    return fid
            # another name took that fid (or this one) meanwhile: look again


class ThreadCCT:
    """One thread's calling context tree and sparse metric values (see the module docstring)."""

    __slots__ = (
        "child_of",
        "fence",
        "ids",
        "ip",
        "kinds",
        "last_leaf",
        "lm",
        "no_activity",
        "node_id",
        "parent",
        "phase",
        "retained",
        "root",
        "unwound",
    )

    def __init__(self, ids: NodeIdAllocator, main: bool, with_no_activity: bool = False) -> None:
        self.ids = ids
        self.parent: array[int] = array("l")
        self.lm: array[int] = array("L")
        self.ip: array[int] = array("Q")
        self.node_id: array[int] = array("L")
        self.unwound = bytearray()
        self.retained = bytearray()
        self.child_of: dict[tuple[int, int, int], int] = {}
        self.kinds: dict[str, KindValues] = {}
        self.root = self._new_node(-1, PLACEHOLDER_LM, placeholder_ip(PRIMARY_ROOT), True)
        # hpcrun puts NoActvty right under the root of traced threads (meas/small.m).
        self.no_activity = self.placeholder(self.root, NO_ACTIVITY) if with_no_activity else -1
        self.fence = self.placeholder(self.root, MAIN_FENCE if main else THREAD_FENCE)
        # Where sampled paths begin: the fence, or the node of the phase a mark named under it
        # (``pyrun ctl PID mark NAME``, docs/pyrun.md "Windows of long jobs").
        self.phase = self.fence
        self.last_leaf = self.fence

    def __len__(self) -> int:
        return len(self.parent)

    def _new_node(self, parent: int, lm: int, ip: int, unwound: bool) -> int:
        index = len(self.parent)
        self.parent.append(parent)
        self.lm.append(lm)
        self.ip.append(ip)
        self.node_id.append(self.ids.allocate())
        self.unwound.append(1 if unwound else 0)
        self.retained.append(0)
        if parent >= 0:
            self.child_of[(parent, lm, ip)] = index
        return index

    def child(self, parent: int, lm: int, ip: int, unwound: bool = True) -> int:
        """The node for frame ``(lm, ip)`` under ``parent``, created on first use."""
        node = self.child_of.get((parent, lm, ip))
        if node is None:
            node = self._new_node(parent, lm, ip, unwound)
        return node

    def new_child(self, parent: int, lm: int, ip: int) -> int:
        """A new node for frame ``(lm, ip)`` under ``parent``, which has none yet (the caller
        looked in :attr:`child_of`)."""
        return self._new_node(parent, lm, ip, True)

    def placeholder(self, parent: int, text: str) -> int:
        """The placeholder node ``text`` (``GPUKernl``, ``NoActvty``...) under ``parent``."""
        return self.child(parent, PLACEHOLDER_LM, placeholder_ip(text))

    def path(self, lm: int, ips_leaf_first: list[int]) -> int:
        """The node of a call path (innermost frame first) below :attr:`phase`; the leaf's index."""
        node = self.phase
        child_of = self.child_of
        for ip in reversed(ips_leaf_first):
            found = child_of.get((node, lm, ip))
            node = self._new_node(node, lm, ip, True) if found is None else found
        return node

    def insert_samples(
        self,
        entries: list[tuple[int, tuple[int, ...], int, int, int, int, int]],
        lm: int,
        kind: MetricKind,
        rules: tuple[tuple[tuple[tuple[int, int], ...], ...], ...],
        nodes: list[int],
        trace: tuple[array[int], array[int]] | None,
        unrecorded: int,
    ) -> bool:
        """Insert the engine's samples of this thread (one drain); True when one was traced.

        Each entry is ``(common, ips, timer, gil, cpu_ns, wall_ns, when_ns)``: the sample's
        path shares ``common`` frames with the previous one (``nodes``, outermost first, kept
        up to date) and goes on with ``ips``, a native frame encoded as :data:`NATIVE_BIT` |
        load module << 48 | offset; ``rules[timer][gil]`` are the (metric, field) pairs of
        ``kind`` the sample adds to (field 0: CPU time, 1: wall time). With ``trace``
        (times, nodes), each sample but a thread's end (timer ``unrecorded``) is a record, its
        time never before the last one's: a record whose handler was interrupted before it
        committed can reach a later drain than an idle mark made after its timestamp.
        """
        find = self.child_of.get
        new_node = self.new_child
        append = nodes.append
        values = self.values_of(kind)  # KindValues.add, inlined: the loop runs per entry
        slot_of = values.slot_of
        slot_get = slot_of.get
        sums = values.values
        width = values.kind.width
        zeros = [0.0] * width
        phase = self.phase
        node = nodes[-1] if nodes else phase
        traced = False
        times, trace_nodes = trace if trace is not None else (None, None)
        last = times[-1] if times else 0
        for common, ips, timer, gil, cpu, wall, when in entries:
            if common < len(nodes):
                del nodes[common:]
                node = nodes[-1] if nodes else phase
            for ip in ips:
                if ip >= NATIVE_BIT:  # a native frame: (load module, offset)
                    frame_lm, ip = (ip >> 48) & 0x7FFF, ip & NATIVE_OFFSET_MASK
                else:
                    frame_lm = lm
                found = find((node, frame_lm, ip))
                node = new_node(node, frame_lm, ip) if found is None else found
                append(node)
            for metric, field in rules[timer][gil]:
                value = wall if field else cpu
                if value > 0:
                    slot = slot_get(node)
                    if slot is None:
                        slot = slot_of[node] = len(slot_of)
                        sums.extend(zeros)
                    sums[slot * width + metric] += value * 1e-9
            if times is not None and trace_nodes is not None and timer != unrecorded:
                self.retained[node] = 1
                last = when if when > last else last
                times.append(last)
                trace_nodes.append(node)
                traced = True
            self.last_leaf = node
        return traced

    def values_of(self, kind: MetricKind) -> KindValues:
        store = self.kinds.get(kind.name)
        if store is None:
            store = self.kinds[kind.name] = KindValues(kind)
        return store

    def add(self, kind: MetricKind, node: int, metric: int, value: float) -> None:
        """Add ``value`` to metric ``metric`` (0-based within ``kind``) at ``node``."""
        self.values_of(kind).add(node, metric, value)

    def retain(self, node: int) -> None:
        """Mark ``node`` as referenced by a trace record (its id gets bit 0, formats.md §1.5)."""
        self.retained[node] = 1

    def written_id(self, node: int) -> int:
        """The id ``node`` has in the file: odd when a trace references it."""
        return self.node_id[node] | self.retained[node]


def python_frame_ips(
    frame: FrameType | None,
    table: FunctionTable,
    fid_of: dict[int, int],
    stop: FrameType | None = None,
) -> list[int]:
    """``fid << 32 | line`` of every frame of a Python stack, innermost first (formats.md §1.10).

    Frames whose code the table skips (pyrun's own) are left out. ``fid_of`` is
    ``table.fid_of``, passed in so the hot loop reads a local. ``stop``: the outermost frame
    taken (an asyncio task's: :mod:`pyhpctk.measure.sampling.tasks`).
    """
    ips: list[int] = []
    append = ips.append
    ip_of = table.ip_of
    while frame is not None:
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        ip = ip_of.get(key)
        if ip is None:
            fid = fid_of.get(key[0])
            if fid is None:
                fid = table.register(code)
            ip = ((fid << FID_SHIFT) | ((frame.f_lineno or 0) & LINE_MASK)) if fid else 0
            ip_of[key] = ip
        if ip:
            append(ip)
        if frame is stop:
            break
        frame = frame.f_back
    return ips
