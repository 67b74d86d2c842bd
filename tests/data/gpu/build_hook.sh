#!/bin/bash
# Build pyrun's C CUPTI hook in place (src/pyhpctk/measure/gpu/_cuptihook*.so) with the
# running python3's headers: what `pip install` does through setup.py, for a checkout used
# from PYTHONPATH=src (the device machine). Usage: bash tests/data/gpu/build_hook.sh [PYTHON]
python=${1:-python3}
read -r include suffix < <("$python" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
dir=$(dirname "$0")/../../../src/pyhpctk/measure/gpu
exec ${CC:-gcc} -O2 -Wall -Wextra -Wno-unused-parameter -shared -fPIC -I"$include" \
  "$dir"/_cuptihook.c "$dir"/_cuptihook_sites.c "$dir"/_cuptihook_buffers.c \
  -o "$dir/_cuptihook$suffix" -ldl -lpthread
