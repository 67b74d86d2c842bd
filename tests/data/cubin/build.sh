#!/bin/bash
# Rebuild the cubin fixtures of tests/test_pystruct_cubins.py and tests/test_pyprof_gpu_recursion.py
# from units/*.cu (CI has no nvcc, so the results are checked in; see README.md). Needs nvcc and
# nvlink (CUDA 12.8 or newer: the cubins are ELF ABI version 8); runs without a GPU.
# Usage: bash tests/data/cubin/build.sh [units names recursion copies]  (all four by default)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# A fixed build directory, so that the source paths in the line tables do not name the checkout.
work=/tmp/pyhpctk-cubin-units
rm -rf "$work" && mkdir -p "$work" && cp "$here"/units/*.cu "$work"/ && cd "$work"
arch=sm_75
groups=${*:-units names recursion copies}
want() { [[ " $groups " == *" $1 "* ]]; }
# Four units of relocatable device code, c and d in a library of kernels, device-linked into
# one cubin: cross-unit calls, inlining in every unit, two copies of the double-division helper
# (units c and d), the sqrt helper.
if want units; then
    for unit in a b c d; do
        nvcc -arch=$arch -rdc=true -lineinfo -c $unit.cu -o $unit.o
    done
    nvcc -lib c.o d.o -o libunits.a
    nvcc -arch=$arch -dlink -cubin a.o b.o -L. -lunits -o "$here/units_lineinfo_$arch.cubin"
fi
# Template names and NVCC's -G debug information (DW_AT_name next to DW_AT_MIPS_linkage_name).
if want names; then
    nvcc -arch=$arch -rdc=true -G -cubin names.cu -o names.o.cubin
    nvlink -arch=$arch names.o.cubin -o "$here/names_G_$arch.cubin"
fi
# Recursive device code (tests/test_pyprof_gpu_recursion.py): direct recursion, a mutually
# recursive pair entered at both members, one entered at one member only; sm_75 and sm_90.
if want recursion; then
    for recursion_arch in sm_75 sm_90; do
        nvcc -arch=$recursion_arch -lineinfo -cubin recursion.cu \
            -o "$here/recursion_lineinfo_$recursion_arch.cubin"
    done
fi
# Four copies of each of two math helpers under one section and symbol name (issue #36, item
# 10): copies.cu compiled once per unit, device-linked. nvdisasm numbers the duplicates'
# section and symbol names with one counter, so its section names and map lines disagree.
if want copies; then
    for unit in 0 1 2 3; do
        nvcc -arch=$arch -rdc=true -DUNIT=$unit -c copies.cu -o copies$unit.o
    done
    nvcc -arch=$arch -dlink -cubin copies0.o copies1.o copies2.o copies3.o \
        -o "$here/copies_$arch.cubin"
fi
nvcc --version | tail -2
ls -l "$here"/*.cubin
