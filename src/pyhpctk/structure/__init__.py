"""pystruct: recover program structure (hpcstruct XML, formats.md §4) from binaries and sources.

Entry points: :func:`pyhpctk.structure.driver.analyze_target` (one ELF binary, cubin or Python
source -> :class:`~pyhpctk.formats.hpcstruct_model.StructureFile`),
:func:`~pyhpctk.structure.driver.struct_measurements` (a measurement directory -> ``structs/``),
and :mod:`pyhpctk.structure.compare` (precision/recall against another structure file). The
submodules are imported lazily by their users so that importing this package stays cheap.
"""
