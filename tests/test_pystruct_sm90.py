"""pystruct on a cubin built by CUDA 13 for the H200 (sm_90, ELF ABI version 8 e_flags).

The cubin is the ground-truth kernel captured on the H200 (tests/data/gpu/pc_gt_h200.json, source
in tests/data/gpu/record_pc.py): ``gt_kernel`` calls ``top`` once, ``shared_fn`` from two sites,
``rec`` and ``ping``; ``top`` calls ``mid``, ``mid`` calls ``leaf``, ``rec`` calls itself,
``ping`` and ``pong`` call each other (all ``__noinline__``): ten ``CALL.REL.NOINC`` in
``nvdisasm``'s listing, one per edge of record_pc's ground-truth table.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from pyhpctk.formats.hpcstruct_model import CALL, PROCEDURE
from pyhpctk.structure.driver import StructOptions, analyze_target
from pyhpctk.structure.elfimage import open_image

DATA = Path(__file__).resolve().parent / "data" / "gpu"
FIXTURE = DATA / "pc_gt_h200.json"


def calls_per_thread(depth: int, turns: int, reps: int) -> dict[str, int]:
    """record_pc.py's ground-truth call edges (it is a script, loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("record_pc", DATA / "record_pc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    edges: dict[str, int] = module.calls_per_thread(depth, turns, reps)
    return edges


def _cubin(tmp_path: Path) -> Path:
    record = json.loads(FIXTURE.read_text())["cubins"][0]
    path = tmp_path / f"{record['md5']}.gpubin"
    path.write_bytes(base64.b64decode(record["base64"]))
    return path


def test_the_sm_version_is_read_from_abi_8_flags(tmp_path: Path) -> None:
    assert open_image(str(_cubin(tmp_path))).cuda_arch == 90


def test_gpucfg_finds_every_device_call_of_an_sm90_cubin(tmp_path: Path) -> None:
    structure = analyze_target(_cubin(tmp_path), StructOptions(gpucfg=True))
    module = structure.modules[0]
    entries = {
        scope.name: scope.ranges[0][0]
        for scope in module.walk()
        if scope.tag == PROCEDURE and scope.ranges
    }
    calls = [scope for scope in module.walk() if scope.tag == CALL]
    targets = sorted(scope.call_target for scope in calls if scope.call_target is not None)
    callees = [edge.split("->")[1].split("@")[0] for edge in calls_per_thread(1, 1, 1)]
    expected = sorted(entries[f"$gt_kernel${name}"] for name in callees)
    assert len(expected) == 10
    assert targets == expected
    assert {scope.attrs.get("d") for scope in calls} == {"NVIDIA sm_90"}
