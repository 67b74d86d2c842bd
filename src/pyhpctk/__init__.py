"""pyhpctk: measure, analyze and view the performance of Python programs on CPUs and GPUs.

The toolchain mirrors HPCToolkit (hpcrun, hpcstruct, hpcprof, viewer) and reads and writes its
file formats. This package's top level only names the version; the work lives in the subpackages.
"""

__version__ = "0.1.0"
