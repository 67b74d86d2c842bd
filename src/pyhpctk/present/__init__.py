"""pyview: views, derived metrics, per-thread statistics, trace export and reports of a database.

The library behind the ``pyview`` command (architecture.md, ``present/``). Start with
:func:`open_database`; :mod:`pyhpctk.present.model` declares the tree + values interface every
view is computed from, and :mod:`pyhpctk.present.source` fills it from the format readers.
"""

from pyhpctk.present.api import Database, open_database

__all__ = ["Database", "open_database"]
