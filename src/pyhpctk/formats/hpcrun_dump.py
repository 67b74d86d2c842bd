"""An ``.hpcrun`` profile as text (``pyhpctk dump``): every field, the CCT as an indented tree
with each node's values, Python logical frames named from their ``logical/python.*`` metadata.

The text is the first debugging tool and the source of golden files (style.md item 4); damaged
content is shown rather than refused (what :func:`~pyhpctk.formats.hpcrun_check.fatal_problems`
found is listed first).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import numpy as np

from pyhpctk.formats.hpcrun_check import decoded_values, fatal_problems
from pyhpctk.formats.hpcrun_constants import (
    CCT_FLAG_UNWOUND,
    CCT_ID_RETAINED,
    GPU_CONTEXT_LM_ID,
    GPU_RANGE_LM_ID,
    GPU_ROOT_LM_ID,
    ID_INTERPRETATION_NAMES,
    KIND_NODE,
    LM_FLAG_ANALYZE,
    METRIC_SHOW_NAMES,
    METRIC_TYPE_NAMES,
    METRIC_VALFMT_NAMES,
    METRIC_VALTY_NAMES,
    PLACEHOLDER_LM_ID,
    PLACEHOLDER_NAMES,
    VALFMT_INT,
    id_interpretation,
    id_kind,
    placeholder_text,
)
from pyhpctk.formats.hpcrun_model import HpcrunProfile, LoadModule, MetricDescriptor
from pyhpctk.formats.logical import LogicalMetadata, LogicalStanza
from pyhpctk.formats.logical import read as read_logical


def _show(text: str) -> str:
    return text if text.isprintable() else repr(text)


def _flags_text(m: MetricDescriptor) -> str:
    f = m.flags
    parts = [
        f"type={METRIC_TYPE_NAMES.get(f[0], str(f[0]))}",
        f"valTy={METRIC_VALTY_NAMES.get(f[1], str(f[1]))}",
        f"valFmt={METRIC_VALFMT_NAMES.get(f[2], str(f[2]))}",
        f"move2proc={f[3]}",
        f"partner={m.partner}",
        f"show={METRIC_SHOW_NAMES.get(f[6], str(f[6]))}",
        f"showPercent={f[7]}",
    ]
    if f[8:] != bytes(8):
        parts.append(f"unused={f[8:].hex()}")
    return " ".join(parts)


def _is_logical(module: LoadModule | None) -> bool:
    return module is not None and module.path.startswith("logical/")


def _node_text(
    node: np.void,
    modules: Mapping[int, LoadModule],
    logical: Mapping[int, Mapping[int, LogicalStanza]],
) -> str:
    lm, ip = int(node["lm_id"]), int(node["lm_ip"])
    if lm == PLACEHOLDER_LM_ID:
        code = placeholder_text(ip)
        pretty = PLACEHOLDER_NAMES.get(code, "<unknown placeholder>")
        text = f"placeholder {code!r} {pretty}"
    elif lm in (GPU_ROOT_LM_ID, GPU_RANGE_LM_ID, GPU_CONTEXT_LM_ID):
        kind = {GPU_ROOT_LM_ID: "gpu root", GPU_RANGE_LM_ID: "gpu range"}.get(lm, "gpu context")
        text = f"{kind} {ip}"
    elif lm in logical or _is_logical(modules.get(lm)):
        fid, line = ip >> 32, ip & 0xFFFFFFFF
        stanza = logical[lm].get(fid) if lm in logical else None
        if stanza is None:
            text = f"logical lm {lm} fid {fid} line {line}"
        else:
            where = f" ({_show(stanza.filename)}:{stanza.lineno})" if stanza.filename else ""
            name = _show(stanza.funcname) if stanza.funcname else "<module>"
            text = f"python {name}{where} line {line}"
    else:
        module = modules.get(lm)
        base = os.path.basename(module.path) if module is not None else "?"
        text = f"lm {lm} [{_show(base)}] +{ip:#x}"
    if not int(node["flags"]) & CCT_FLAG_UNWOUND:
        text += " (not unwound)"
    return text


def _dump_cct(
    profile: HpcrunProfile,
    out: TextIO,
    logical: Mapping[int, LogicalMetadata],
) -> None:
    cct = profile.cct
    out.write(f"[cct] {len(cct)} nodes (* = retained for a trace)\n")
    modules = {m.id: m for m in profile.load_modules}
    stanzas = {lm_id: metadata.by_fid() for lm_id, metadata in logical.items()}
    children: dict[int, list[int]] = {}
    position = {int(node_id): i for i, node_id in enumerate(cct["id"])}
    roots = []
    for i, parent in enumerate(cct["parent_id"].tolist()):
        if parent in position and parent != cct["id"][i]:
            children.setdefault(position[parent], []).append(i)
        else:
            roots.append(i)
    stack = [(i, 0) for i in reversed(roots)]
    shown = np.zeros(len(cct), dtype=bool)
    while stack:
        i, depth = stack.pop()
        shown[i] = True
        node = cct[i]
        node_id = int(node["id"])
        mark = "*" if node_id & CCT_ID_RETAINED else " "
        out.write(f"  {'  ' * depth}{node_id}{mark} {_node_text(node, modules, stanzas)}\n")
        stack.extend((child, depth + 1) for child in reversed(children.get(i, [])))
    for i in np.flatnonzero(~shown).tolist():  # only in a CCT with a cycle
        node = cct[i]
        text = _node_text(node, modules, stanzas)
        out.write(f"  (unreachable) {int(node['id'])} parent {int(node['parent_id'])} {text}\n")


def dump(
    profile: HpcrunProfile,
    out: TextIO,
    *,
    logical: Mapping[int, LogicalMetadata] | None = None,
) -> None:
    """Write ``profile`` as readable text, complete enough to diff two files.

    ``logical`` maps load-module ids of logical (Python) modules to their metadata
    (see :func:`logical_modules`), so Python frames are shown by function, file and line.
    """
    logical = logical or {}
    out.write(f"hpcrun profile, format {profile.version}\n")
    out.write(f"[header] {len(profile.nvpairs)} nv-pairs\n")
    for key, value in profile.nvpairs:
        out.write(f"  {_show(key)} = {_show(value)}\n")
    out.write(f"[load map] {len(profile.load_modules)} modules\n")
    for module in profile.load_modules:
        flags = f"{module.flags:#x}" + (" analyze" if module.flags & LM_FLAG_ANALYZE else "")
        out.write(f"  {module.id:5d} flags={flags} {_show(module.path)}\n")
    _dump_cct(profile, out, logical)
    out.write(f"[metric table] {len(profile.metrics)} metrics\n")
    for i, m in enumerate(profile.metrics):
        out.write(f"  #{i} {_show(m.name)}: {_show(m.description)}\n")
        out.write(f"      {_flags_text(m)} period={m.period}\n")
        extra = [
            f"formula={_show(m.formula)}" if m.formula else "",
            f"format={_show(m.format)}" if m.format else "",
            f"is_frequency={m.is_frequency}" if m.is_frequency else "",
            f"is_multiplexed={m.is_multiplexed}" if m.is_multiplexed else "",
            f"threshold_mean={m.threshold_mean!r}" if m.threshold_mean else "",
            f"num_samples={m.num_samples}" if m.num_samples else "",
        ]
        if any(extra):
            out.write(f"      {' '.join(e for e in extra if e)}\n")
    out.write(f"[id-tuple dictionary] {len(profile.id_names)} kinds\n")
    for kind, name in profile.id_names:
        out.write(f"  {kind} {_show(name)}\n")
    kind_names = dict(profile.id_names)
    out.write(f"[id tuple] {len(profile.id_tuple)} elements\n")
    for element in profile.id_tuple:
        kind = int(element["kind"])
        name = kind_names.get(id_kind(kind), f"kind {id_kind(kind)}")
        interpretation = ID_INTERPRETATION_NAMES[id_interpretation(kind)]
        physical = int(element["physical"])
        # formats.md §1.8: a NODE's physical index is the host id, shown in hex as in file names
        shown = f"{physical:#x}" if id_kind(kind) == KIND_NODE else str(physical)
        out.write(
            f"  {name}({interpretation}) physical={shown} logical={int(element['logical'])}\n"
        )
    _dump_values(profile, out)


def _dump_values(profile: HpcrunProfile, out: TextIO) -> None:
    n_nodes = len(profile.node_starts)
    out.write(f"[values] {len(profile.values)} values on {n_nodes} nodes\n")
    fatal = fatal_problems(profile)
    if fatal:
        # Only a profile read with strict=False gets here: show what hpcprof could not use.
        out.writelines(f"  # problem: {section}: {problem}\n" for section, problem in fatal)
        for raw in profile.values:
            out.write(f"  raw bits={int(raw['value_bits']):#018x} metric={int(raw['metric'])}\n")
        return
    node_ids, metric, decoded = decoded_values(profile)
    previous = -1
    for node_id, m, value in zip(node_ids.tolist(), metric.tolist(), decoded.tolist(), strict=True):
        if node_id != previous:
            out.write(f"  node {node_id}\n")
            previous = node_id
        desc = profile.metrics[m]
        shown = str(int(value)) if desc.value_format == VALFMT_INT else repr(value)
        scaled = f" x{desc.period} = {value * desc.period!r}" if desc.period != 1 else ""
        out.write(f"    #{m} {_show(desc.name)} = {shown}{scaled}\n")


def logical_modules(
    profile: HpcrunProfile, measurement_dir: str | os.PathLike[str]
) -> dict[int, LogicalMetadata]:
    """Read the logical metadata files (``logical/python.XXXXXXXX``) the load map names.

    Paths are relative to the measurement directory (formats.md §1.10); a missing file is
    skipped, an unreadable one raises FormatError.
    """
    found: dict[int, LogicalMetadata] = {}
    for module in profile.load_modules:
        path = Path(module.path)
        if not path.is_absolute():
            path = Path(measurement_dir) / path
        if _is_logical(module) and path.is_file():
            found[module.id] = read_logical(path)
    return found


def dumps(profile: HpcrunProfile) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(profile, text)
    return text.getvalue()
