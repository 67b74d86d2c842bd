"""Writing one process's profiles: encoding a thread's files and writing them atomically.

A :class:`ProfileWriter` belongs to one process's session (a forked child makes its own): it
names the process's profiles (rank, host, pid), encodes a thread's profile, trace and the
``logical/`` file, writes them through a temporary name (:mod:`pyhpctk.measure.profile_files`),
keeps the ``threads/``, ``sources/`` and ``modules/`` side files, and tells pyrun which profiles
it could not write (:mod:`pyhpctk.measure.losses`). What went wrong is said once, a line on stderr.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import sys
import threading

from pyhpctk.measure import losses, naming
from pyhpctk.measure.encode import (
    ProfileIdentity,
    encode_logical,
    encode_profile,
    encode_trace,
)
from pyhpctk.measure.module_files import ModuleRecorder
from pyhpctk.measure.profile_files import atomic_write, reserve_stem, unlink_quietly
from pyhpctk.measure.source_files import SourceRecorder
from pyhpctk.measure.thread_names import ThreadNames, thread_name

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from pyhpctk.measure.cct import FunctionTable, MetricKind
    from pyhpctk.measure.launch.config import MeasureOptions
    from pyhpctk.measure.thread_state import ThreadState

    # A thread's encoded files: base stem, profile, trace, logical file, its name (None: a
    # stream, not a thread).
    Encoded = tuple[str, bytes, bytes | None, bytes, str | None, int]


class ProfileWriter:
    """Encodes and writes the files of one process's threads (see the module docstring)."""

    def __init__(
        self,
        options: MeasureOptions,
        functions: FunctionTable,
        load_modules: list[tuple[int, str, int]],
        kinds: list[MetricKind],
    ) -> None:
        self.options = options
        self.functions = functions
        self.load_modules = load_modules  # the session's load map, as it grows
        self.kinds = kinds  # the session's metric kinds, as they are added
        self.pid = os.getpid()
        tag = f"{int.from_bytes(os.urandom(4), 'big'):08x}"
        self.logical_path = os.path.join("logical", f"python.{tag}")
        self.thread_names = ThreadNames(tag, self.pid)
        self.loaded_sources = SourceRecorder(tag, self.pid)
        self.native_modules = ModuleRecorder(tag, self.pid)
        # Serialises file writes (checkpoints, thread ends, exit) so a thread's name is claimed
        # once; never held while sampling.
        self._write_lock = threading.Lock()
        self._mpi_rank: int | None = None
        self._host_id: int | None = None
        self.write_errors: list[str] = []
        self._lost: set[str] = set()  # profiles whose last write failed (told to pyrun)
        self._encodings = 0  # numbers the encodings: the newest of a thread's is written last

    def identity(self, state: ThreadState) -> ProfileIdentity:
        return self.identity_of(state.number)

    def identity_of(self, number: int) -> ProfileIdentity:
        env = os.environ
        rank = naming.rank_from_mpi4py()
        if rank is None:
            rank = naming.rank_from_env(env)
        if rank is not None:
            self._mpi_rank = rank
        if self._host_id is None:
            self._host_id = naming.host_id()
        return ProfileIdentity(
            program_name=os.path.basename(sys.executable) or "python",
            program_path=sys.executable,
            env_path=env.get("PATH", ""),
            job_id=naming.job_id_from_env(env),
            mpi_rank=self._mpi_rank,
            thread=number,
            host_id=self._host_id,
            pid=self.pid,
        )

    def encode(self, state: ThreadState) -> Encoded:
        """Encode a thread's files (call with the session's lock held); returns (base stem,
        ..., the encoding's sequence number)."""
        self._encodings += 1
        sequence = self._encodings
        identity = self.identity(state)
        times = state.trace_times
        span = (min(times), max(times)) if times else (0, 0)
        try:
            profile = encode_profile(state.cct, identity, self.load_modules, self.kinds, span)
        except ValueError as error:  # a count the file cannot hold: write the rest, say so
            sys.stderr.write(
                f"pyrun: thread {state.number}: {error}; it is written as the nearest value the"
                " file holds (an accounting error in pyrun: please report it)\n"
            )
            profile = encode_profile(
                state.cct, identity, self.load_modules, self.kinds, span, clamp_counts=True
            )
        trace = (
            encode_trace(state.cct, state.trace_times, state.trace_nodes)
            if self.options.trace
            else None
        )
        logical = encode_logical(list(self.functions.stanzas))
        base = naming.file_stem(
            identity.program_name,
            identity.mpi_rank or 0,
            identity.thread,
            identity.host_id,
            identity.pid,
            0,
        )
        name = None if state.is_stream else thread_name(state)
        return base, profile, trace, logical, name, sequence

    def write(self, state: ThreadState, data: Encoded) -> None:
        """Write what :meth:`encode` made, unless a newer encoding of the thread was written
        meanwhile (a checkpoint encodes under the session's lock and writes after it: the
        thread's end may encode and write in between)."""
        with self._write_lock:
            sequence = data[-1]
            if sequence < state.written:
                return
            state.written = sequence
            self._write_files(state, data)

    def _write_files(self, state: ThreadState, data: Encoded) -> None:
        base, profile, trace, logical, called, _ = data
        old = state.stem
        directory = self.options.output_dir
        # The logical file goes first: a profile is never written without the functions it
        # names. A failure leaves the previous complete files (or none), never a partial one.
        try:
            atomic_write(os.path.join(directory, self.logical_path), logical)
            if not state.stem or not state.stem.startswith(base[: base.rfind("-")]):
                state.stem = reserve_stem(directory, base, profile)
                if old:
                    for suffix in (".hpcrun", ".hpctrace"):
                        unlink_quietly(os.path.join(directory, old + suffix))
            else:
                atomic_write(os.path.join(directory, state.stem + ".hpcrun"), profile)
            if trace is not None:
                atomic_write(os.path.join(directory, state.stem + ".hpctrace"), trace)
        except OSError as error:
            name = (state.stem or base) + ".hpcrun"
            self._lost.add(name)
            losses.tell_pyrun(self.options.report, losses.LOST, name, error.strerror or str(error))
            self.tell_once(f"pyrun: cannot write measurement files to {directory}: {error}")
            return
        if self._lost:
            name = state.stem + ".hpcrun"
            for lost in (name, base + ".hpcrun"):  # a checkpoint that failed, written now
                if lost in self._lost:
                    self._lost.discard(lost)
                    losses.tell_pyrun(self.options.report, losses.WRITTEN, lost)
        if called is not None:
            names = self.thread_names
            self._write_side_file(names, names.record(state.stem, called, old), "thread names")
        table = self.loaded_sources.record(self.functions.stanzas)
        self._write_side_file(self.loaded_sources, table, "sources")
        modules = self.native_modules.encode()
        self._write_side_file(self.native_modules, modules, "native modules' identities")

    def _write_side_file(
        self, side: ThreadNames | SourceRecorder | ModuleRecorder, data: bytes | None, what: str
    ) -> None:
        """Rewrite ``threads/``, ``sources/`` or ``modules/`` with ``data`` (None: unchanged)."""
        if data is None:
            return
        directory = self.options.output_dir
        try:
            atomic_write(os.path.join(directory, side.path), data)
        except OSError as error:  # the profiles are written: only this side file is missing
            self.tell_once(f"pyrun: cannot write the {what} to {directory}: {error}")
            return
        side.written(data)

    def tell_once(self, message: str) -> None:
        """Say ``message`` (a line of pyrun's) on stderr, once per process: what went wrong in
        pyrun's own work is a line, never a traceback in the program's stderr."""
        if message not in self.write_errors:
            self.write_errors.append(message)
            try:  # noqa: SIM105  # contextlib is one more import in every measured process
                sys.stderr.write(message + "\n")
            except Exception:  # a closed or broken stderr: the program's business
                pass
