"""The sampling thread: wakes its sampler and writes the periodic checkpoints.

One raw thread per measured process (``_thread``, invisible to ``threading.enumerate``), named
``pyrun-drain`` under the engine and ``pyrun-sampler`` with the Python sampler. Each wake-up
calls :meth:`~.sampler.Sampler.wake` (a drain of the engine's samples, or a sample of every
thread) and then writes a checkpoint if one is due: early ones first, backing off to
``--checkpoint`` seconds (:meth:`SamplingThread.checkpoint_if_due`). With control on, it also
acts on ``pyrun ctl``'s commands (:class:`~pyhpctk.measure.session.windows.Windows`); between
windows it only does that, every :data:`~pyhpctk.measure.control.POLL_INTERVAL_S`.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import _thread
import sys
import time

from pyhpctk.measure.control import POLL_INTERVAL_S
from pyhpctk.measure.thread_names import name_own_thread

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from pyhpctk.measure.sampling.sampler import Sampler
    from pyhpctk.measure.session.table import ThreadTable
    from pyhpctk.measure.session.windows import Windows

# Checkpoints (SamplingThread.checkpoint_if_due): the first this soon after measuring began,
# the next ones after a share of the time measured so far and a multiple of their own cost.
FIRST_CHECKPOINT_S = 0.25
CHECKPOINT_SHARE = 4
CHECKPOINT_COST_SHARE = 100


class SamplingThread:
    """Drives one :class:`~.sampler.Sampler` and checkpoints ``table``'s threads."""

    def __init__(
        self,
        table: ThreadTable,
        sampler: Sampler,
        name: str,
        step: str,
        control: Windows | None = None,
    ) -> None:
        self.table = table
        self.sampler = sampler
        self.control = control  # pyrun ctl's commands and the windows, when control is on
        self.name = name  # the thread's kernel name (pyrun-drain, pyrun-sampler)
        self.step = step  # what one wake-up is, in pyrun's messages ("drain", "sample")
        self.ident: int | None = None  # the running thread's, once started
        self._stop_lock: _thread.LockType | None = None
        self._stopped_lock: _thread.LockType | None = None
        self._measuring_since = self._last_checkpoint = time.monotonic()
        self._measuring_since_cpu = self._last_checkpoint_cpu = time.process_time()
        self._checkpoint_cost = 0.0

    @property
    def running(self) -> bool:
        """Started and not asked to stop."""
        return self._stop_lock is not None

    def start(self) -> None:
        """Start the thread; returns once it has left itself out of sampling."""
        stop = _thread.allocate_lock()
        stop.acquire()
        stopped = _thread.allocate_lock()
        stopped.acquire()
        self._stop_lock, self._stopped_lock = stop, stopped
        started = _thread.allocate_lock()
        started.acquire()
        _thread.start_new_thread(self._main, (stop, stopped, started))
        started.acquire()

    def _main(
        self, stop: _thread.LockType, stopped: _thread.LockType, started: _thread.LockType
    ) -> None:
        self.ident = _thread.get_ident()
        name_own_thread(self.name)
        sampler = self.sampler
        sampler.thread_began()
        started.release()
        failures = 0
        control = self.control
        try:
            wait = sampler.first_wait()
            while not stop.acquire(True, wait):
                try:
                    if control is None or not control.paused:
                        sampler.wake()
                        self.checkpoint_if_due()
                    if control is not None:
                        control.poll()
                except Exception as error:  # one bad wake-up must not end the measurement
                    failures += 1
                    if failures == 1:
                        sys.stderr.write(f"pyrun: a {self.step} failed: {error!r}\n")
                    if failures >= 100:
                        raise
                paused = control is not None and control.paused
                wait = POLL_INTERVAL_S if paused else sampler.next_wait()
        except Exception as error:  # never kill the program; say once why measurement stopped
            sys.stderr.write(f"pyrun: sampler stopped: {error!r}\n")
        finally:
            sampler.thread_ended()
            stopped.release()

    def checkpoint_if_due(self) -> None:
        """Write a checkpoint if one is due (the thread asks after each wake-up).

        The first comes :data:`FIRST_CHECKPOINT_S` after measuring began, each next one once
        1/:data:`CHECKPOINT_SHARE` of the time measured so far has passed since the last, on
        the wall clock or on the process's CPU clock, whichever comes first, backing off to
        ``--checkpoint`` seconds: a crash or SIGKILL at any moment keeps about four fifths of
        what came before it, in wall-clock and in CPU time, on a loaded machine too (a crash
        after 1.5 s keeps 1.2 s), where a first checkpoint after 10 s kept nothing of a shorter
        run. Each waits at least :data:`CHECKPOINT_COST_SHARE` times the CPU time the last one
        took (the first's cost, which holds one-time work, excepted), so that checkpoints of
        many threads cost at most 1 % of a CPU.
        """
        interval = self.table.options.checkpoint_s
        if not interval:
            return
        now, cpu = time.monotonic(), time.process_time()
        floor = max(FIRST_CHECKPOINT_S, self._checkpoint_cost * CHECKPOINT_COST_SHARE)
        wall_since, cpu_since = now - self._last_checkpoint, cpu - self._last_checkpoint_cpu
        due = wall_since >= interval or (
            wall_since >= floor
            and (
                wall_since >= (now - self._measuring_since) / CHECKPOINT_SHARE
                or cpu_since >= (cpu - self._measuring_since_cpu) / CHECKPOINT_SHARE
            )
        )
        if not due:
            return
        began = time.thread_time()
        self.table.checkpoint()
        first = self._last_checkpoint == self._measuring_since
        self._last_checkpoint, self._last_checkpoint_cpu = time.monotonic(), time.process_time()
        # The first checkpoint pays once for what later ones reuse (imports such as hashlib's
        # OpenSSL, 8 ms; new files): its cost would hold the second back past a crash at 1.5 s.
        self._checkpoint_cost = 0.0 if first else time.thread_time() - began

    def window_began(self) -> None:
        """Sampling resumed: checkpoints start early again, as at the start of measurement
        (a crash a second into a window keeps most of it)."""
        self._measuring_since = self._last_checkpoint = time.monotonic()
        self._measuring_since_cpu = self._last_checkpoint_cpu = time.process_time()

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop the thread and wait (bounded) for it to finish its wake-up; False when it was
        not running."""
        stop, stopped = self._stop_lock, self._stopped_lock
        if stop is None or stopped is None:
            return False
        self._stop_lock = self._stopped_lock = None
        stop.release()
        if _thread.get_ident() != self.ident:
            stopped.acquire(True, timeout)
        return True
