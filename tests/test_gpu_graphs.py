"""CUDA graphs: each replayed kernel lands under the line that captured its node (issue #18).

The tree: replay line → ``GPUGraph`` placeholder → the capture's call path → ``GPUKernl``. The
recordings replayed here are ``graphs_h200.json`` (recorded on the H200 by
``tests/data/gpu/record_graphs.py --replays 6``: a torch.cuda.CUDAGraph and a CuPy graph)
and ``graphs_synthetic.json`` (hand-made by ``make_graph_fixture.py``, the same format).
Expected counts come from the recording with numpy: each activity's graph node, through the
clone map, to the recorded site that made it, and its correlation id to the launch's site.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from pyhpctk.measure.cct import ThreadCCT, placeholder_ip
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu import shutdown
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

DATA = Path(__file__).parent / "data" / "gpu"
FIXTURES = [DATA / "graphs_h200.json", DATA / "graphs_synthetic.json"]


def _site(issue: Callable[[], None]) -> None:
    issue()


# One function per recorded site (a recorded site s is replayed through SITES[s % 16]).
SITES = [
    type(_site)(_site.__code__.replace(co_name=f"site_{i}", co_qualname=f"site_{i}"), globals())
    for i in range(16)
]


def _expected(recording: rec.Recording) -> Counter[tuple[int, int]]:
    """Kernels per (launch site, capture site) from the recording; capture -1: not a node."""
    ops = recording.operations
    nodes = ops[ops["kind"] == act.GRAPH_NODE]
    made_at = dict(zip(nodes["correlation"].tolist(), nodes["site"].tolist(), strict=True))
    others = ops[ops["kind"] != act.GRAPH_NODE]
    launched_at = dict(zip(others["correlation"].tolist(), others["site"].tolist(), strict=True))
    kernels = recording.activities[recording.activities["kind"] == act.KERNEL]
    out: Counter[tuple[int, int]] = Counter()
    for correlation, node in zip(
        kernels["correlation"].tolist(), kernels["graph_node"].tolist(), strict=True
    ):
        if correlation not in launched_at:
            continue
        original = recording.clones.get(node, node)
        capture = made_at.get(original, -1) if node else -1
        out[(launched_at[correlation] % 16, -1 if capture < 0 else capture % 16)] += 1
    return out


def _observed(session: Session, ccts: list[ThreadCCT]) -> Counter[tuple[int, int]]:
    """Kernels per (site function above GPUGraph, site function below it) in the CCTs."""
    fid_of = session.functions.fid
    fid_site = {fid_of(f.__code__): i for i, f in enumerate(SITES) if fid_of(f.__code__)}
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    graph_ip = placeholder_ip(act.PLACEHOLDER_OF_KIND[act.GRAPH])
    out: Counter[tuple[int, int]] = Counter()
    for cct in ccts:
        store = cct.kinds.get(kind.name)
        for node in store.slot_of if store is not None else ():
            count = store.get(node, gm.GKER_COUNT) if store is not None else 0
            if not count:
                continue
            below, above, walk, seen_graph = -1, -1, node, False
            while walk >= 0:
                if cct.lm[walk] == 0 and cct.ip[walk] == graph_ip:
                    seen_graph = True
                site = fid_site.get(cct.ip[walk] >> 32) if cct.lm[walk] == 1 else None
                if site is not None:
                    if seen_graph and above < 0:
                        above = site
                    elif not seen_graph and below < 0:
                        below = site
                walk = cct.parent[walk]
            key = (above, below) if seen_graph else (below, -1)
            out[key] += int(count)
    return out


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_replayed_graph_kernels_land_under_their_capture_lines(
    tmp_path: Path, fixture: Path, gpu_hook: str
) -> None:
    recording = rec.load(fixture)
    expected = _expected(recording)
    assert any(capture >= 0 for _, capture in expected), "the recording has graph kernels"
    session = Session(MeasureOptions(str(tmp_path), trace=True, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    backend = SimulatedBackend(recording, hook=gpu_hook)
    monitor = GpuMonitor(
        session, session.add_metric_kind(gm.gpu_metric_kind()), recording.device, backend=backend
    )
    backend.start(monitor)
    ccts: list[ThreadCCT] = []
    errors: list[BaseException] = []

    def body(thread: int) -> None:
        try:
            ccts.append(session.register_thread(threading.current_thread()).cct)
            backend.replay_thread(thread, SITES)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=body, args=(t,)) for t in recording.threads()]
    for thread in threads:
        thread.start()
    backend.deliver_recorded()
    for thread in threads:
        thread.join()
    stats = shutdown(monitor, report=False)
    assert not errors, errors
    assert stats.unmatched == 0
    assert stats.graph_activities == sum(n for (_, c), n in expected.items() if c >= 0)
    assert _observed(session, ccts) == expected
    session.finish()  # the trees are written: every file verifies
    from pyhpctk.formats import hpcrun

    for path in tmp_path.glob("*.hpcrun"):
        assert hpcrun.verify(hpcrun.read(path)) == [], path


def test_the_h200_recording_holds_what_its_program_captured() -> None:
    """record_graphs.py captures 4 torch kernels and 2 CuPy kernels, each from a line of its own,
    and replays each graph 6 times: 6 capture sites with 6 replayed kernels each."""
    expected = _expected(rec.load(DATA / "graphs_h200.json"))
    by_capture: Counter[int] = Counter()
    for (_, capture), count in expected.items():
        if capture >= 0:
            by_capture[capture] += count
    assert sorted(by_capture.values()) == [6] * 6
