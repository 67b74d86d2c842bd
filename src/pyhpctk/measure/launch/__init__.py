"""Launching measured processes: what pyrun does around the command it runs.

:mod:`.launcher` (runs the command with the options exported, waits for every measured process,
reports), :mod:`.config` (:class:`~.config.MeasureOptions`: the one options object the launcher
exports and each measured process reads back), :mod:`.rendezvous` (where a process whose
environment was cleared finds pyrun's settings), :mod:`.runtime` (start and stop the session of
this process) and ``bootstrap/`` (the ``sitecustomize`` every measured Python process runs).

Standard library only: this runs inside the measured program.
"""
