"""Build of the optional C parts: pyrun's sampling engine and its CUPTI callback.

Everything else is declared in pyproject.toml. Both extensions are optional: where no C compiler
(or no Python headers) is found the install still succeeds, and pyrun falls back to its Python
sampler thread (self time then lands at GIL switch points; docs/pyrun.md) and to CUPTI
callbacks in Python (slower per GPU API call; docs/gpu.md). Both read the interpreter's frames
through one header (src/pyhpctk/measure/pyframes.h), so they are compiled per interpreter, under
one version gate (FRAMES_SUPPORTED: CPython 3.11 to 3.13 with the GIL; elsewhere the engine is
not built and the hook walks the public frame API).
"""

import sys
import sysconfig

from setuptools import Extension, setup

# The C hook's parts, _cuptihook{part}.c: the callback, call sites, operations and modules handed
# to the monitor, activity buffers, per-record work, synchronizations timed at the API.
HOOK_PARTS = ("", "_sites", "_queues", "_buffers", "_records", "_syncs")
MEASURE_DIR = "src/pyhpctk/measure"
ENGINE_DIR = f"{MEASURE_DIR}/engine_c"
HOOK_DIR = f"{MEASURE_DIR}/gpu/cupti"
#: The one version gate of pyrun's frame reader (pyframes.h: CPython 3.11 to 3.13 with the
#: GIL): the engine is built where it holds, and the CUPTI hook reads the interpreter's frames
#: there (elsewhere it walks the public frame API).
FRAMES_SUPPORTED = (
    sys.implementation.name == "cpython"
    and (3, 11) <= sys.version_info[:2] <= (3, 13)
    and not sysconfig.get_config_var("Py_GIL_DISABLED")
)
FRAMES_HEADER = f"{MEASURE_DIR}/pyframes.h"
ENGINE_SUPPORTED = sys.platform == "linux" and FRAMES_SUPPORTED
engine = [
    Extension(
        "pyhpctk.measure._engine",
        sources=[
            f"{ENGINE_DIR}/{name}.c"
            for name in (
                "module",
                "entries",
                "handler",
                "threads",
                "unwind",
                "modules",
                "natives",
                "account",
            )
        ],
        depends=[f"{ENGINE_DIR}/engine.h", FRAMES_HEADER],
        include_dirs=[MEASURE_DIR],
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        libraries=["rt", "pthread"],
        optional=True,
    )
]

setup(
    ext_modules=[
        *(engine if ENGINE_SUPPORTED else []),
        Extension(
            "pyhpctk.measure.gpu.cupti._cuptihook",
            sources=[f"{HOOK_DIR}/_cuptihook{part}.c" for part in HOOK_PARTS],
            depends=[f"{HOOK_DIR}/_cuptihook.h", FRAMES_HEADER],
            include_dirs=[MEASURE_DIR],
            define_macros=[("PYHPCTK_INTERPRETER_FRAMES", "1")] if FRAMES_SUPPORTED else [],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl", "pthread"],
            optional=True,
        )
    ]
)
