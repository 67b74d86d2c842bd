"""``pyrun attach PID``: start measuring a Python process that was not started under pyrun.

CPython 3.14 lets a process run a script in another one of the same version (PEP 768,
``sys.remote_exec(pid, path)``: the target's main thread runs the file at its next bytecode
boundary, as it runs a signal handler). pyrun writes a script (:func:`attach_script`) into its
private control directory that starts this process's measurement with control on
(:func:`pyhpctk.measure.launch.runtime.attach`), then waits for the target's control socket
(:mod:`pyhpctk.measure.control`) to appear: from then on ``pyrun ctl PID stop|start|mark`` opens
and closes windows as for a job started under ``pyrun --start-paused``, and the files are written
at each stop and when the process ends.

Written to the documented API (the ``sys`` module's reference, "Remote debugging attachment
protocol" howto): CPython 3.14 cannot be installed on the machines this was written on, so the
road through ``sys.remote_exec`` is not exercised by the tests; the script it runs is (the tests
run it in a process of their own). On older interpreters :func:`attach` says so in one line.
Runs in ``pyrun``, never in a measured process.
"""

from __future__ import annotations

import os
import sys
import time

from pyhpctk.errors import PyhpctkError, UsageError
from pyhpctk.measure.control import control_directory, ensure_directory, socket_name, start_time
from pyhpctk.measure.launch.config import PACKAGE_ROOT, MeasureOptions

#: The first CPython with ``sys.remote_exec`` (PEP 768).
REMOTE_EXEC_VERSION = (3, 14)
#: How long pyrun waits for the target to run the script and open its control socket.
ATTACH_TIMEOUT_S = 10.0


class AttachError(PyhpctkError):
    """The process could not be attached to (one line says why)."""

    exit_code = 1


def attach_script(options: MeasureOptions, path: str) -> str:
    """The script the target runs: it removes itself, finds pyhpctk, and starts measuring with
    the options pyrun was given (any failure is one line on the target's stderr)."""
    variables: dict[str, str] = {}
    options.export(variables)
    settings = {k: v for k, v in variables.items() if k.startswith("PYHPCTK_PYRUN_")}
    return (
        "# pyrun attach (pyhpctk): start measuring this process (PEP 768, sys.remote_exec)\n"
        "import os, sys\n"
        "try:\n"
        f"    os.unlink({path!r})\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        f"    if {PACKAGE_ROOT!r} not in sys.path:\n"
        f"        sys.path.append({PACKAGE_ROOT!r})\n"
        "    from pyhpctk.measure.launch import runtime\n"
        f"    runtime.attach({settings!r})\n"
        "except Exception as error:\n"
        "    sys.stderr.write(f'pyrun attach: not measuring this process: {error}\\n')\n"
    )


def remote_exec_missing(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> str:
    """Why this interpreter cannot attach ('' when it has ``sys.remote_exec``)."""
    if version >= REMOTE_EXEC_VERSION and hasattr(sys, "remote_exec"):
        return ""
    shown = ".".join(str(part) for part in version)
    return (
        f"pyrun attach needs CPython 3.14 or newer (sys.remote_exec, PEP 768) for pyrun and for"
        f" the process; this pyrun runs on CPython {shown}: start the job under pyrun"
        " --start-paused and open windows with pyrun ctl PID start|stop instead"
    )


def check_target(pid: int) -> str:
    """The control socket process ``pid`` will listen on; :class:`AttachError` when it cannot
    be attached to (no such process, another user's, measured already)."""
    start = start_time(pid)
    if start is None:
        raise AttachError(f"no process {pid}")
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError as error:
        raise AttachError(f"process {pid} cannot be looked at: {error.strerror}") from None
    if owner != os.getuid():
        raise AttachError(
            f"process {pid} is another user's (uid {owner}): attach to your own processes"
        )
    socket_path = os.path.join(control_directory(), socket_name(pid, start))
    if os.path.exists(socket_path):
        raise AttachError(
            f"process {pid} is measured by pyrun already: pyrun ctl {pid} start|stop|mark NAME"
        )
    return socket_path


def attach(pid: int, options: MeasureOptions) -> str:
    """Start measuring process ``pid`` as ``options`` say; the line that says so."""
    missing = remote_exec_missing()
    if missing:
        raise UsageError(missing)
    socket_path = check_target(pid)
    directory = ensure_directory()
    script = os.path.join(directory, f"attach-{pid}-{os.urandom(6).hex()}.py")
    descriptor = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
        stream.write(attach_script(options, script))
    remote_exec = getattr(sys, "remote_exec")  # noqa: B009  # 3.14+, checked above
    try:
        remote_exec(pid, script)
    except (OSError, RuntimeError, ValueError) as error:
        os.unlink(script)
        raise AttachError(
            f"cannot attach to process {pid}: {error} (the process must run CPython"
            f" {sys.version_info[0]}.{sys.version_info[1]} without -X disable_remote_debug or"
            " PYTHON_DISABLE_REMOTE_DEBUG, and ptrace must be allowed: docs/pyrun.md)"
        ) from None
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while not os.path.exists(socket_path):
        if time.monotonic() > deadline:
            raise AttachError(
                f"process {pid} did not start measuring within {ATTACH_TIMEOUT_S:.0f} s: its"
                " main thread runs the script at its next bytecode (a long call into C delays"
                " it); its stderr says why if it failed"
            )
        time.sleep(0.05)
    state = "paused" if options.paused else "measuring"
    return (
        f"pyrun attach: process {pid} is {state} into {options.output_dir}; pyrun ctl {pid}"
        " start|stop|mark NAME opens and closes windows (each stop writes the files)"
    )
