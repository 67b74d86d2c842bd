"""What pyrun says about the GPU measurement at exit: only what went missing or needs reading.

Stdlib only; the counters come from the monitor (``GpuStats``) and its fine-grained part.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.instructions import FineAttribution
    from pyhpctk.measure.gpu.operations import GpuStats


def report_problems(stats: GpuStats, errors: list[str], fine: FineAttribution) -> None:
    """Lines on stderr for unmatched or dropped activities, PC samples and counts' coverage
    (the monitor's counters, its errors and its fine-grained part)."""
    if stats.unmatched or stats.dropped or stats.trace_overflow or stats.outside or errors:
        sys.stderr.write(stats.report() + "\n")
    pc = fine.pc_stats
    if fine.pc_kind is None:
        return
    if pc["unmatched"] or pc["dropped"]:
        sys.stderr.write(
            f"pyrun: gpu: PC samples: {pc['attributed']} attributed, {pc['unmatched']} with no"
            f" kernel launch or gpubin to go to, {pc['dropped']} dropped by the hardware\n"
        )
    if pc.get("inst_launches", 0) > 1:
        contexts = pc.get("inst_contexts", 0)
        weight = "launches' GPU time" if pc.get("inst_split_by_time") else "numbers of launches"
        where = (  # CUPTI gives one total per instruction for all the counted launches
            f"split among {contexts} calling contexts in proportion to their {weight}"
            " (an estimate; each instruction's total is exact)"
            if contexts > 1
            else "under the one calling context they came from"
        )
        sys.stderr.write(  # CUPTI's counting window (sassmetrics): say what the counts cover
            f"pyrun: gpu: instruction counts: CUPTI counted"
            f" {', '.join(fine.inst_functions) or 'no function'}"
            f" ({pc.get('instructions', 0)} warp instructions) while"
            f" {pc['inst_launches']} kernel launches ran; the counts are the totals of the"
            f" counted kernel's launches, {where} (docs/gpu.md)\n"
        )
    if pc.get("inst_unmatched", 0):
        sys.stderr.write(
            f"pyrun: gpu: instruction counts: {pc.get('inst_attributed', 0)} warp instructions"
            f" attributed, {pc['inst_unmatched']} with no kernel launch or gpubin to go to\n"
        )
