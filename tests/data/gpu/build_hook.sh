#!/bin/bash
# Build pyrun's C parts in place — the CUPTI hook (src/pyhpctk/measure/gpu/_cuptihook*.so) and
# the sampling engine (src/pyhpctk/measure/_engine*.so) — with the running python3's headers:
# what `pip install` does through setup.py (same sources and flags), for a checkout used from
# PYTHONPATH=src (the device machine). Usage: bash tests/data/gpu/build_hook.sh [PYTHON]
python=${1:-python3}
read -r include suffix < <("$python" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
src=$(dirname "$0")/../../../src/pyhpctk/measure
flags="-O2 -Wall -Wextra -Wno-unused-parameter -shared -fPIC -I$include"
${CC:-gcc} $flags "$src"/gpu/_cuptihook.c "$src"/gpu/_cuptihook_sites.c \
  "$src"/gpu/_cuptihook_buffers.c -o "$src/gpu/_cuptihook$suffix" -ldl -lpthread || exit 1
${CC:-gcc} $flags "$src"/engine_c/module.c "$src"/engine_c/handler.c "$src"/engine_c/threads.c \
  "$src"/engine_c/unwind.c "$src"/engine_c/modules.c "$src"/engine_c/natives.c -o "$src/_engine$suffix" -lrt -lpthread
