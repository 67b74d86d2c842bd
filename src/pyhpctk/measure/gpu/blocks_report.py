"""What pyrun says at exit about the kernels it counted (issue #34, items 3 and 5).

One line for the whole, then one per counted kernel: its counted launches, its registers per
thread before and after instrumenting, and the theoretical occupancy each gives at the block
size and shared memory of its last launch. Registers come from ``ptxas -v`` on the original
and the instrumented PTX (the ``nvidia-cuda-nvcc`` wheel's, or one on ``PATH``), for the
PTX's own ``.target``; the launch record's count (the driver's, on a GPU) is said beside it
when it differs. Nothing here may stop the program's exit: a failure is one line.
"""

from __future__ import annotations

import sys

from pyhpctk.errors import PyhpctkError
from pyhpctk.instrument.ptx import assemble, find_ptxas, parse
from pyhpctk.measure.gpu import activity as act

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.blocks import BlockCounting, CountedModule, KernelStats


def registers(module: CountedModule) -> tuple[dict[str, int], dict[str, int], str]:
    """(registers before, after, the arch) of ``module``'s kernels, from ptxas -v."""
    instrumented = module.instrumented
    arch = parse(instrumented.source).target.split(",")[0].strip() or "sm_80"
    before = assemble(instrumented.source, arch).registers
    after = assemble(instrumented.ptx, arch).registers
    return before, after, arch


def occupancy_percent(stats: KernelStats, registers: int, limits: act.DeviceLimits) -> float:
    """Theoretical occupancy (%) of the kernel's last launch with ``registers`` per thread."""
    threads, static, dynamic = stats.config
    row = act.empty_activities(1)
    row["block_threads"] = max(threads, 1)
    row["registers"] = registers
    row["static_smem"] = static
    row["dynamic_smem"] = dynamic
    active, most = act.occupancy(row, limits)
    return 100.0 * float(active[0]) / max(float(most[0]), 1.0)


def kernel_line(
    name: str, stats: KernelStats, found: tuple[dict[str, int], dict[str, int], str] | None,
    limits: act.DeviceLimits,
) -> str:  # fmt: skip
    line = f"pyrun: gpu: blocks:   {name}: {stats.launches} launches"
    if found is None or name not in found[0] or name not in found[1]:
        return line
    before, after, arch = found[0][name], found[1][name], found[2]
    line += f"; registers {before} -> {after} (ptxas -arch={arch})"
    if stats.registers and stats.registers != after:
        line += f", {stats.registers} at launch"
    if stats.config[0]:
        was = occupancy_percent(stats, before, limits)
        now = occupancy_percent(stats, stats.registers or after, limits)
        line += f"; occupancy {was:.0f}% -> {now:.0f}% at {stats.config[0]} threads a block"
    return line


def report_blocks(blocks: BlockCounting, limits: act.DeviceLimits) -> None:
    """Lines on stderr: what was counted, and each kernel's registers and occupancy."""
    stats = blocks.stats
    counted = {k: s for k, s in blocks.per_kernel.items() if s.launches}
    mode = next((s.module.instrumented for s in counted.values() if s.module), None)
    shown = next(iter(mode.plans.values())).mode.value if mode and mode.plans else "edges"
    lines = [
        f"pyrun: gpu: blocks: {stats['attributed']} launches of {len(counted)} instrumented "
        f"kernels counted ({shown} mode), under the lines that launched them"
    ]
    if stats["unmatched"] or stats["refused"] or stats["unknown_kernel"]:
        lines.append(
            f"pyrun: gpu: blocks: {stats['unmatched']} launches' counts found no kernel "
            f"activity, {stats['refused']} were no flow, {stats['unknown_kernel']} named no "
            "instrumented kernel"
        )
    lines += blocks.errors
    lines += [f"pyrun: gpu: blocks: {why}" for what, why in blocks.skipped if not what]
    lines += [f"pyrun: gpu: blocks: not counted: {name}: {why}" for name, why in blocks.uncounted()]
    tool = find_ptxas()
    found_by_module: dict[int, tuple[dict[str, int], dict[str, int], str] | None] = {}
    for name, kernel in sorted(counted.items()):
        module = kernel.module
        if module is None:
            continue
        if id(module) not in found_by_module:
            try:
                found_by_module[id(module)] = registers(module) if tool else None
            except (PyhpctkError, OSError) as error:
                lines.append(f"pyrun: gpu: blocks: registers of {name}: {error}")
                found_by_module[id(module)] = None
        lines.append(kernel_line(name, kernel, found_by_module[id(module)], limits))
    if tool is None and counted:
        lines.append(
            "pyrun: gpu: blocks: registers before and after instrumenting need ptxas "
            "(pip install nvidia-cuda-nvcc, or put ptxas on PATH)"
        )
    sys.stderr.write("".join(line + "\n" for line in lines))
