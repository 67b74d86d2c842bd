"""pyprof's library: aggregate measurement directories into HPCToolkit databases.

Entry points: :func:`pyhpctk.analysis.pipeline.run` (aggregate and write),
:func:`pyhpctk.analysis.pipeline.aggregate` (in memory), :mod:`pyhpctk.analysis.compare`
(compare two databases by meaning). The stages live in :mod:`.inputs`, :mod:`.unify`,
:mod:`.expand` (with :mod:`.structmap`, :mod:`.symbols`, :mod:`.gpu`), :mod:`.stats` and
:mod:`.write` (with :mod:`.taxonomy`); ``docs/pyprof.md`` describes them. pyprof-mpi runs the
same stages over MPI ranks in :mod:`.distributed` (collectives in :mod:`.comm`). This package
reads and writes files only through :mod:`pyhpctk.formats`.
"""
