"""pystruct on a cubin built by CUDA 13 for the H200 (sm_90, ELF ABI version 8 e_flags).

The cubin is the ground-truth kernel captured on the H200 (tests/data/gpu/pc_gt_h200.json):
``gt_kernel`` calls ``top`` once and ``shared_fn`` from two sites, ``top`` calls ``mid``, ``mid``
calls ``leaf`` (all ``__noinline__``); ``nvdisasm`` shows the five ``CALL.REL.NOINC``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from pyhpctk.formats.hpcstruct_model import CALL, PROCEDURE
from pyhpctk.structure.driver import StructOptions, analyze_target
from pyhpctk.structure.elfimage import open_image

FIXTURE = Path(__file__).resolve().parent / "data" / "gpu" / "pc_gt_h200.json"


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
    expected = sorted(
        entries[name]
        for name in (
            "$gt_kernel$top",
            "$gt_kernel$shared_fn",
            "$gt_kernel$shared_fn",
            "$gt_kernel$mid",
            "$gt_kernel$leaf",
        )
    )
    assert targets == expected
    assert {scope.attrs.get("d") for scope in calls} == {"NVIDIA sm_90"}
