"""pyrun's bootstrap: Python imports this at start-up when pyrun put this directory on PYTHONPATH.

It first chains to the ``sitecustomize`` that would have run without pyrun (the next one on
``sys.path``), then starts measuring this process if pyrun's environment variables ask for it,
and tells pyrun it does (:func:`pyhpctk.measure.losses.tell_started`). When ``PYTHONPATH``
came through but the variables did not (a launcher that passes only some), it looks for the
pyrun above it (``rescue.py`` beside this file) and takes them from there.
It must never stop the program from running: any failure is one line on stderr and the program
runs unmeasured. It takes this directory off ``sys.path`` again, so the program does not see it;
``PYTHONPATH`` keeps it for the processes the program starts.
"""

import os
import sys


def _chain(here: str) -> None:
    """Import the next ``sitecustomize`` on the path, as Python would have without pyrun."""
    ours = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  # the program's own
    except ImportError as error:
        if error.name != "sitecustomize":
            sys.stderr.write(f"pyrun: the program's sitecustomize failed: {error}\n")
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    except Exception as error:  # as site.py does: report and go on
        sys.stderr.write(f"pyrun: the program's sitecustomize failed: {error!r}\n")
    finally:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def _restore(here: str) -> bool:
    """Take pyrun's variables from the nearest pyrun ancestor (``rescue.py``, exec'd so that
    nothing is added to ``sys.modules``); False when there is none."""
    path = os.path.join(here, "rescue.py")
    namespace = {"__name__": "_pyhpctk_pyrun_rescue"}
    try:
        with open(path, "rb") as stream:
            exec(compile(stream.read(), path, "exec"), namespace)
        return bool(namespace["restore_settings"]())  # type: ignore[operator]
    except Exception as error:
        sys.stderr.write(f"pyrun: cannot look for pyrun's settings ({sys.executable}): {error!r}\n")
        return False


def _measure(here: str) -> None:
    if not os.environ.get("PYHPCTK_PYRUN_OPTIONS") and not _restore(here):
        return
    if sys.version_info < (3, 11):  # noqa: UP036  # a foreign interpreter may be older
        sys.stderr.write(f"pyrun: not measuring {sys.executable}: pyrun needs Python >= 3.11\n")
        return
    try:
        try:
            from pyhpctk.measure.launch import runtime
        except ImportError:
            root = os.environ.get("PYHPCTK_PYRUN_PACKAGE_ROOT", "")
            if not root or root in sys.path:
                raise
            sys.path.append(root)
            from pyhpctk.measure.launch import runtime
        session = runtime.start_from_env()
        if session is not None:
            from pyhpctk.measure import losses

            losses.tell_started(session.options.report)
    except Exception as error:
        sys.stderr.write(f"pyrun: not measuring this process ({sys.executable}): {error!r}\n")


_chain(os.path.dirname(os.path.abspath(__file__)))
_measure(os.path.dirname(os.path.abspath(__file__)))
