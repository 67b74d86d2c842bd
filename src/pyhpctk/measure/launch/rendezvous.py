"""pyrun's side of the road to processes whose environment was cleared (``bootstrap/rescue.py``).

While the command runs, pyrun leaves its ``PYHPCTK_PYRUN_*`` variables in a file named after its
own pid and start time in a directory only this user can write (:func:`publish`), and removes
it when the command ends (:func:`withdraw`). A measured process that lost the variables finds
that file by walking its ancestors in ``/proc``.

Python reads nothing outside its environment and its installation at start-up, so a process
started with ``env -i`` is reached only through its installation: :func:`install_pth` writes a
one-line ``.pth`` into the site-packages of an interpreter (a venv) the user names, and
:func:`uninstall_pth` removes it. Runs in pyrun, never in a measured process.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from pyhpctk.errors import UsageError
from pyhpctk.measure.control import forget_stale, start_time
from pyhpctk.measure.launch.bootstrap import rescue
from pyhpctk.measure.launch.config import BOOTSTRAP_DIR

#: The file ``--install-pth`` writes into site-packages.
PTH_NAME = "pyhpctk-pyrun.pth"
_PTH_MARK = "# pyhpctk: pyrun --install-pth"


def publish(env: Mapping[str, str]) -> str | None:
    """Leave pyrun's variables from ``env`` where its descendants can find them; the file's
    path, or None when no private directory can be had (the rescue then just finds nothing)."""
    start = start_time(os.getpid())
    if start is None:
        return None
    directory = rescue.run_directory()
    with contextlib.suppress(FileExistsError, OSError):
        os.mkdir(directory, 0o700)
    if not rescue.is_private(directory, True):
        return None  # someone else's, or open to others: never trusted, never written
    forget_stale(directory, rescue.SETTINGS_SUFFIX)
    path = os.path.join(directory, rescue.settings_name(os.getpid(), start))
    entries = [f"{name}={value}" for name, value in env.items() if name.startswith(rescue.PREFIX)]
    temporary = f"{path}.{os.urandom(4).hex()}.tmp"
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write("\0".join(entries).encode("utf-8", "surrogateescape"))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return None
    return path


def withdraw(path: str | None) -> None:
    """Remove what :func:`publish` left."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def site_packages(target: str) -> tuple[str, Path]:
    """(interpreter, its site-packages) for ``target``: a venv directory or an interpreter."""
    where = Path(os.path.abspath(target))  # not resolved: a venv's python is a link to keep
    interpreter = where / "bin" / "python" if (where / "pyvenv.cfg").is_file() else where
    if not interpreter.is_file() or not os.access(interpreter, os.X_OK):
        raise UsageError(f"{target}: neither a venv (no pyvenv.cfg) nor a Python interpreter")
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    try:
        done = subprocess.run(
            [str(interpreter), "-I", "-c", query], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"{interpreter}: cannot run it: {error}") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise UsageError(f"{interpreter}: did not name its site-packages: {done.stderr.strip()}")
    return str(interpreter), Path(done.stdout.strip())


def pth_line() -> str:
    """The ``.pth`` line: one ``stat`` at every start of that interpreter, and only when this
    user has a pyrun settings directory does it read ``rescue.py`` (which walks the ancestors)."""
    script = os.path.join(BOOTSTRAP_DIR, "rescue.py")
    run = (
        f"with open({script!r}, 'rb') as f: "
        f"exec(compile(f.read(), {script!r}, 'exec'), {{'__name__': '_pyhpctk_pyrun_pth'}})"
    )
    where = f"{rescue.RUN_DIRECTORY!r}.format(uid=os.getuid())"
    return f"import os; os.path.isdir({where}) and os.path.isfile({script!r}) and exec({run!r})"


def install_pth(target: str) -> Path:
    """Write the ``.pth`` into ``target``'s site-packages; its path."""
    interpreter, directory = site_packages(target)
    path = directory / PTH_NAME
    text = (
        f"{_PTH_MARK}: Python processes of {interpreter} started under pyrun with a cleared\n"
        f"# environment find pyrun through this line; pyrun --uninstall-pth {interpreter}\n"
        "# removes it. Outside pyrun it costs one stat at start-up and changes nothing.\n"
        f"{pth_line()}\n"
    )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / f".{PTH_NAME}.{os.getpid()}.tmp"
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        raise UsageError(f"{path}: cannot write: {error.strerror or error}") from None
    return path


def uninstall_pth(target: str) -> Path | None:
    """Remove the ``.pth`` from ``target``'s site-packages; its path, None if there was none."""
    _, directory = site_packages(target)
    path = directory / PTH_NAME
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror or error}") from None
    if not text.startswith(_PTH_MARK):
        raise UsageError(f"{path}: not written by pyrun --install-pth; not removing it")
    try:
        path.unlink()
    except OSError as error:
        raise UsageError(f"{path}: cannot remove: {error.strerror or error}") from None
    return path
