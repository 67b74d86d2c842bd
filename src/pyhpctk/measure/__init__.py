"""pyrun's measurement: sample every thread of every Python process a command starts.

- :mod:`.launcher` — what the ``pyrun`` command does (output directory, environment, running the
  command, exit status); :mod:`pyhpctk.cli.pyrun` is its click front end.
- :mod:`.config`, :mod:`.events`, :mod:`.naming` — options and how they travel to the measured
  processes, hpcrun's event syntax, ranks / jobs / file names.
- ``bootstrap/sitecustomize.py`` — imported at start-up by every Python under pyrun; calls
  :func:`.runtime.start_from_env`.
- :mod:`.session` (sampler thread, per-thread state, writing), :mod:`.hooks` (exit, signals,
  fork, ``os._exit``, thread start/end), :mod:`.cct` (per-thread CCTs, sparse per-kind metrics,
  Python frame ids), :mod:`.encode` (the measurement files' bytes).

Everything the measured process imports (all but the launcher) uses the standard library only —
never numpy — and this package's import must stay empty: it runs in every measured process.
See ``docs/pyrun.md``.
"""
