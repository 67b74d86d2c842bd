#!/bin/bash
# Build pyrun's C parts in place — the CUPTI hook (src/pyhpctk/measure/gpu/_cuptihook*.so) and
# the sampling engine (src/pyhpctk/measure/_engine*.so) — with the running python3's headers:
# what `pip install` does through setup.py (same sources and flags), for a checkout used from
# PYTHONPATH=src (the device machine). Usage: bash tests/data/gpu/build_hook.sh [PYTHON]
python=${1:-python3}
read -r include suffix < <("$python" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
src=$(dirname "$0")/../../../src/pyhpctk/measure
flags="-O2 -Wall -Wextra -Wno-unused-parameter -shared -fPIC -I$include"
# every C file of each part, as setup.py's HOOK_PARTS and engine sources list them
${CC:-gcc} $flags "$src"/gpu/_cuptihook*.c -o "$src/gpu/_cuptihook$suffix" -ldl -lpthread || exit 1
${CC:-gcc} $flags "$src"/engine_c/*.c -o "$src/_engine$suffix" -lrt -lpthread
