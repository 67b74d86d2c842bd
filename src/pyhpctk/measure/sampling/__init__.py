"""How samples are taken: the engine (:mod:`.engine`) or the Python sampler (:mod:`.python`),
each driven by the sampling thread (:mod:`.thread`); the door they share is
:class:`~.sampler.Sampler`, and each holds the session's
:class:`~pyhpctk.measure.session.table.ThreadTable`, nothing else of it.

Standard library only: this runs inside the measured program.
"""
