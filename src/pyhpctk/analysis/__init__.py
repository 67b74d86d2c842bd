"""pyprof's library: aggregate measurement directories into HPCToolkit databases.

Entry points: :func:`pyhpctk.analysis.pipeline.run` (the one analysis driver: aggregate and
write, in one process or, given a communicator, on every MPI rank),
:func:`pyhpctk.analysis.pipeline.aggregate` (in memory), :mod:`pyhpctk.analysis.compare` (compare
two databases by meaning). The driver's stages are functions of :mod:`.pipeline` and
:mod:`.write_stages` sharing an :class:`.state.Analysis`; the work they call lives in
:mod:`.inputs` and :mod:`.screening` (reading), :mod:`.unify`, :mod:`.expand` (with
:mod:`.structures`, :mod:`.structmap`, :mod:`.symbols`, :mod:`.gpu`), :mod:`.stats` and
:mod:`.planes` (statistics, traces), :mod:`.exchange` (cct.db between ranks) and :mod:`.write`
(with :mod:`.taxonomy`); collectives in :mod:`.comm`; ``docs/pyprof.md`` describes them. This
package reads and writes files only through :mod:`pyhpctk.formats`.
"""
