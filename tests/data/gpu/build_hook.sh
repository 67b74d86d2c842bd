#!/bin/bash
# Build pyrun's C parts in place — the CUPTI hook (src/pyhpctk/measure/gpu/cupti/_cuptihook*.so) and
# the sampling engine (src/pyhpctk/measure/_engine*.so) — with the running python3's headers:
# what `pip install` does through setup.py (same sources and flags), for a checkout used from
# PYTHONPATH=src (the device machine). Usage: bash tests/data/gpu/build_hook.sh [PYTHON]
python=${1:-python3}
read -r include suffix < <("$python" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
src=$(dirname "$0")/../../../src/pyhpctk/measure
flags="-O2 -Wall -Wextra -Wno-unused-parameter -shared -fPIC -I$include -I$src"
# setup.py's one version gate of the frame reader (pyframes.h): CPython 3.11-3.13 with the GIL
if "$python" -c 'import sys, sysconfig; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 13) and not sysconfig.get_config_var("Py_GIL_DISABLED")))'; then
  hookflags="-DPYHPCTK_INTERPRETER_FRAMES=1"
fi
# every C file of each part, as setup.py's HOOK_PARTS and engine sources list them
${CC:-gcc} $flags $hookflags "$src"/gpu/cupti/_cuptihook*.c -o "$src/gpu/cupti/_cuptihook$suffix" -ldl -lpthread || exit 1
${CC:-gcc} $flags "$src"/engine_c/*.c -o "$src/_engine$suffix" -lrt -lpthread
