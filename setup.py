"""Build of the optional C part: pyrun's CUPTI callback (src/pyhpctk/measure/gpu/_cuptihook*.c).

Everything else is declared in pyproject.toml. The extension is optional: where no C compiler
(or no Python headers) is found the install still succeeds, and pyrun falls back to CUPTI
callbacks in Python (slower per GPU API call; ``pyrun --help`` and docs/gpu.md say so).
"""

from setuptools import Extension, setup

HOOK_PARTS = ("", "_sites", "_buffers")  # the callback, its call-site table, activity buffers

setup(
    ext_modules=[
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
