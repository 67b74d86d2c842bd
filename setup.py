"""Build of the optional C parts: pyrun's sampling engine and its CUPTI callback.

Everything else is declared in pyproject.toml. Both extensions are optional: where no C compiler
(or no Python headers) is found the install still succeeds, and pyrun falls back to its Python
sampler thread (self time then lands at GIL switch points; docs/pyrun.md) and to CUPTI
callbacks in Python (slower per GPU API call; docs/gpu.md). The engine reads the interpreter's
internal structures through its own headers, so it is compiled per interpreter (CPython 3.11 to
3.13 with the GIL; elsewhere it is not built).
"""

import sys
import sysconfig

from setuptools import Extension, setup

# The C hook's parts, _cuptihook{part}.c: the callback, call sites, operations and modules handed
# to the monitor, activity buffers, per-record work, synchronizations timed at the API.
HOOK_PARTS = ("", "_sites", "_queues", "_buffers", "_records", "_syncs")
ENGINE_DIR = "src/pyhpctk/measure/engine_c"
ENGINE_SUPPORTED = (
    sys.platform == "linux"
    and sys.implementation.name == "cpython"
    and (3, 11) <= sys.version_info[:2] <= (3, 13)
    and not sysconfig.get_config_var("Py_GIL_DISABLED")
)
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
        depends=[f"{ENGINE_DIR}/engine.h"],
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        libraries=["rt", "pthread"],
        optional=True,
    )
]

setup(
    ext_modules=[
        *(engine if ENGINE_SUPPORTED else []),
        Extension(
            "pyhpctk.measure.gpu._cuptihook",
            sources=[f"src/pyhpctk/measure/gpu/_cuptihook{part}.c" for part in HOOK_PARTS],
            depends=["src/pyhpctk/measure/gpu/_cuptihook.h"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl", "pthread"],
            optional=True,
        )
    ]
)
