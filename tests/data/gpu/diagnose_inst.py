"""Why does cuptiSassMetricsGetDataProperties report no records? (issue #7 device diagnosis)

Run on the device, from the repository root::

    PYTHONPATH=/tmp/site:$PWD/src python3 tests/data/gpu/diagnose_inst.py [--only NAME,...]

Each variant runs in its own subprocess (25 s timeout; CUPTI's per-device configuration and
the CUDA context die with it) and prints one line::

    NAME ok|ERR  gdp=[warm-up, launch 1, launch 2, (at end)] as records x instances
         flushed=records sums={metric: sum of values}  out=kernel result  | call=status ...

``gdp`` entries are ``RxI`` (``-S`` when the call returned status S). The baseline is what
``record_pc.py --inst`` does: cupti-python subscriber present, context (cupy's primary
context) created first, then cuptiProfilerInitialize, chip name, GetProperties, SetConfig,
Enable(ctx, lazy), then the module load (cupy.RawModule of the recorder's SOURCE), a warm-up
launch, launches, cuCtxSynchronize and a flush after each. Every other variant changes one
or two things. On a machine without a GPU (or without cupy) each line says why it stopped.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CUBIN = HERE / "gt_sm90.cubin"  # nvcc -cubin -arch=sm_90 of record_pc.SOURCE
BLOCKS, THREADS = 264, 128
ITERS, DEPTH, TURNS, REPS = 64, 5, 3, 1
LAUNCHES = 2
PER_VARIANT_S = 25
TOTAL_S = 170

BASE: dict[str, Any] = {
    "sub": True,  # cupti-python subscriber (MODULE_LOADED) present, as in the recorder
    "setconfig": "after_ctx",  # after_ctx | before_ctx (profiler init + SetConfig first)
    "init": True,  # cuptiProfilerInitialize
    "enable": "before_load",  # before_load | after_load (module load = RawModule/get_function)
    "lazy": 1,
    "ctxarg": "ctx",  # ctx | null: what Enable/GetDataProperties/Flush/Disable get
    "ctx": "primary",  # primary (cupy) | created (cuCtxCreate_v2, as NVIDIA's sample)
    "sync": "cuCtx",  # cuCtx | cudaDevice
    "gran": 0,  # CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU=0, SM=1, SMSP=2
    "metrics": ["smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"],
    "flush": "each",  # each | once (after all launches)
    "loader": "cupy",  # cupy (RawModule, NVRTC) | driver (cuModuleLoadData of gt_sm90.cubin)
    "env": {},
}
ONE = ["smsp__sass_inst_executed"]
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("base", {}),
    ("lazy0", {"lazy": 0}),
    ("after_load", {"enable": "after_load"}),
    ("after_load+lazy0", {"enable": "after_load", "lazy": 0}),
    ("nosub", {"sub": False}),
    ("nosub+after_load", {"sub": False, "enable": "after_load"}),
    ("ctx_null", {"ctxarg": "null"}),
    ("cudaDevSync", {"sync": "cudaDevice"}),
    ("gran_sm", {"gran": 1}),
    ("gran_smsp", {"gran": 2}),
    ("one_metric", {"metrics": ONE}),
    ("flush_once", {"flush": "once"}),
    ("setconfig_before_ctx", {"setconfig": "before_ctx"}),
    ("no_profiler_init", {"init": False}),
    ("eager_loading", {"env": {"CUDA_MODULE_LOADING": "EAGER"}}),
    ("driver_cubin", {"loader": "driver"}),
    ("driver_cubin+nosub", {"loader": "driver", "sub": False}),
    (
        "sample_like",  # NVIDIA's sass_metrics sample: init before a created ctx, 1 metric
        {
            "loader": "driver",
            "sub": False,
            "ctx": "created",
            "setconfig": "before_ctx",
            "metrics": ONE,
        },
    ),
    (
        "all_alt",
        {
            "sub": False,
            "enable": "after_load",
            "lazy": 0,
            "sync": "cudaDevice",
            "env": {"CUDA_MODULE_LOADING": "EAGER"},
        },
    ),
]


# -- the child: one configuration --------------------------------------------------------------


class Stop(Exception):
    """The variant cannot go on (reason in the message)."""


def _find_libcupti() -> tuple[ctypes.CDLL, str]:
    """The libcupti this process loaded (cupti-python's), else the first one found on disk."""
    try:
        from cupti import cupti

        getattr(cupti, "get_version", lambda: None)()  # makes cupti-python load its libcupti
    except Exception as error:
        print(f"cupti-python: {type(error).__name__}: {error}", file=sys.stderr)
    from pyhpctk.measure.gpu.cupti_backend import _loaded_library

    path = _loaded_library("libcupti")
    candidates = [path] if path else []
    for entry in sys.path:
        candidates += sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "libcupti.so*")))
    candidates += sorted(glob.glob("/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*"))
    candidates += ["libcupti.so.13", "libcupti.so"]
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError:
            continue
    raise Stop("no libcupti")


def child(opts: dict[str, Any]) -> dict[str, Any]:
    log: list[str] = []
    result: dict[str, Any] = {"log": log, "gdp": []}

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise Stop(f"no GPU ({error})") from None
    st = int(cuda.cuInit(0))
    log.append(f"cuInit={st}")
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    if st != 0 or count.value == 0:
        raise Stop(f"no GPU (cuInit={st}, devices={count.value})")
    import numpy as np

    sys.path.insert(0, str(HERE.parents[2] / "src"))
    from pyhpctk.measure.gpu import sassmetrics as sm

    cubins: list[int] = []
    subscriber = None
    if opts["sub"]:
        from cupti import cupti

        def on_callback(userdata: object, domain: int, cbid: int, data: object) -> None:
            if domain == int(cupti.CallbackDomain.RESOURCE) and cbid == int(
                cupti.CallbackIdResource.MODULE_LOADED
            ):
                descriptor = int(data.resource_descriptor)  # type: ignore[attr-defined]
                cubins.append(ctypes.c_uint64.from_address(descriptor + 8).value)

        subscriber = cupti.subscribe(on_callback, None)
        cupti.enable_callback(
            1, subscriber, cupti.CallbackDomain.RESOURCE, cupti.CallbackIdResource.MODULE_LOADED
        )
    lib, path = _find_libcupti()
    result["lib"] = path

    def call(name: str, fn_name: str, params: ctypes.Structure) -> int:
        status = int(getattr(lib, fn_name)(ctypes.byref(params)))
        log.append(f"{name}={status}")
        return status

    metric_ids: dict[int, str] = {}

    def configure() -> None:
        if opts["init"]:
            init = sm._sized(sm._Initialize, "CUpti_Profiler_Initialize_Params")
            call("init", "cuptiProfilerInitialize", init)
        chip = sm._sized(sm._ChipName, "CUpti_Device_GetChipName_Params")
        chip.deviceIndex = 0
        if call("chip", "cuptiDeviceGetChipName", chip) != 0:
            raise Stop("cuptiDeviceGetChipName failed")
        name = chip.pChipName or b""
        result["chip"] = name.decode()
        configs = (sm._Config * len(opts["metrics"]))()
        for slot, metric in zip(configs, opts["metrics"], strict=True):
            props = sm._sized(sm._Properties, "CUpti_SassMetrics_GetProperties_Params")
            props.pChipName = name
            props.pMetricName = metric.encode()
            if call(f"prop[{metric[11:15]}]", "cuptiSassMetricsGetProperties", props) != 0:
                raise Stop(f"GetProperties({metric}) failed")
            slot.metricId = int(props.metric.metricId)
            slot.outputGranularity = int(opts["gran"])
            metric_ids[int(props.metric.metricId)] = metric
        config = sm._sized(sm._SetConfig, "CUpti_SassMetricsSetConfig_Params")
        config.numOfMetricConfig = len(opts["metrics"])
        config.pConfigs = configs
        config.deviceIndex = 0
        call("setconfig", "cuptiSassMetricsSetConfig", config)

    if opts["setconfig"] == "before_ctx":
        configure()
    import cupy

    result["cupy"] = cupy.__version__
    context = ctypes.c_void_p(0)
    if opts["ctx"] == "created":
        st = int(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, 0))
        log.append(f"cuCtxCreate={st}")
        if st != 0:
            raise Stop("cuCtxCreate_v2 failed")
    else:
        cupy.cuda.Device(0).use()
        cupy.cuda.runtime.free(0)
        cuda.cuCtxGetCurrent(ctypes.byref(context))
    ctx = int(context.value or 0)
    if not ctx:
        raise Stop("no current context")
    if opts["setconfig"] == "after_ctx":
        configure()
    ctxarg = ctx if opts["ctxarg"] == "ctx" else None

    def enable() -> None:
        params = sm._sized(sm._Enable, "CUpti_SassMetricsEnable_Params")
        params.ctx = ctxarg
        params.enableLazyPatching = int(opts["lazy"])
        call("enable", "cuptiSassMetricsEnable", params)

    # the module and a launcher
    launch: Any
    read_out: Any
    if opts["loader"] == "cupy":

        def load() -> None:
            nonlocal launch, read_out
            sys.path.insert(0, str(HERE))
            from record_pc import KERNEL, SOURCE  # type: ignore[import-not-found]

            kernel = cupy.RawModule(code=SOURCE, options=("-lineinfo",)).get_function(KERNEL)
            out = cupy.zeros(BLOCKS * THREADS, dtype=cupy.float32)
            args = (out, *(np.int32(v) for v in (ITERS, DEPTH, TURNS, REPS)))

            def launch() -> None:
                kernel((BLOCKS,), (THREADS,), args)

            def read_out() -> float:
                return float(out[0].get())

    else:

        def load() -> None:
            nonlocal launch, read_out
            if not CUBIN.exists():
                raise Stop(f"{CUBIN} missing")
            image = CUBIN.read_bytes()
            module, function = ctypes.c_void_p(0), ctypes.c_void_p(0)
            st = int(cuda.cuModuleLoadData(ctypes.byref(module), image))
            log.append(f"cuModuleLoadData={st}")
            st2 = int(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"gt_kernel"))
            log.append(f"cuModuleGetFunction={st2}")
            if st or st2:
                raise Stop("module load failed")
            dptr = ctypes.c_uint64(0)
            size = BLOCKS * THREADS * 4
            cuda.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(size))
            cuda.cuMemsetD8_v2(dptr, ctypes.c_ubyte(0), ctypes.c_size_t(size))
            ints = [ctypes.c_int(v) for v in (ITERS, DEPTH, TURNS, REPS)]
            keep = [dptr, *ints]
            params = (ctypes.c_void_p * 5)(*(ctypes.addressof(v) for v in keep))
            cuda.cuLaunchKernel.argtypes = [
                ctypes.c_void_p,
                *([ctypes.c_uint] * 6),
                ctypes.c_uint,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
            ]

            def launch() -> None:
                st = int(
                    cuda.cuLaunchKernel(
                        function, BLOCKS, 1, 1, THREADS, 1, 1, 0, None, params, None
                    )
                )
                if st:
                    log.append(f"cuLaunchKernel={st}")
                _ = keep

            def read_out() -> float:
                value = ctypes.c_float(0.0)
                cuda.cuMemcpyDtoH_v2(ctypes.byref(value), dptr, ctypes.c_size_t(4))
                return float(value.value)

    def synchronize() -> None:
        if opts["sync"] == "cuCtx":
            st = int(cuda.cuCtxSynchronize())
            if st:
                log.append(f"cuCtxSynchronize={st}")
        else:
            cupy.cuda.runtime.deviceSynchronize()

    sums: dict[str, int] = {}
    flushed = 0

    def properties_and_flush(do_flush: bool) -> None:
        nonlocal flushed
        props = sm._sized(sm._DataProperties, "CUpti_SassMetricsGetDataProperties_Params")
        props.ctx = ctxarg
        st = int(lib.cuptiSassMetricsGetDataProperties(ctypes.byref(props)))
        records, instances = int(props.numOfPatchedInstructionRecords), int(props.numOfInstances)
        result["gdp"].append(f"{records}x{instances}" if st == 0 else f"-{st}")
        if st or not do_flush or not records or not instances:
            return
        data = np.zeros(records, sm.SASS_DATA)
        values = np.zeros((records, instances), sm.INSTANCE_VALUE)
        data["size"] = sm.SASS_DATA.itemsize
        data["instance_values"] = values.ctypes.data + np.arange(
            records, dtype=np.uint64
        ) * np.uint64(values.strides[0])
        flush = sm._sized(sm._FlushData, "CUpti_SassMetricsFlushData_Params")
        flush.ctx = ctxarg
        flush.numOfPatchedInstructionRecords = records
        flush.numOfInstances = instances
        flush.pMetricsData = data.ctypes.data
        if call("flush", "cuptiSassMetricsFlushData", flush) != 0:
            return
        flushed += records
        for metric_id, metric in metric_ids.items():
            mask = values["metric_id"] == metric_id
            key = metric[11:].replace("_executed", "")
            sums[key] = sums.get(key, 0) + int(values["value"][mask].sum())
        if "fn" not in result and data["function_name"][0]:
            result["fn"] = ctypes.string_at(int(data["function_name"][0])).decode()

    if opts["enable"] == "before_load":
        enable()
        load()
    else:
        load()
        enable()
    launch()  # warm-up (patches the kernel with lazy patching)
    synchronize()
    properties_and_flush(opts["flush"] == "each")
    for _ in range(LAUNCHES):
        launch()
        synchronize()
        properties_and_flush(opts["flush"] == "each")
    properties_and_flush(True)  # "at end": everything not flushed yet
    result["out"] = round(read_out(), 3)
    disable = sm._sized(sm._Disable, "CUpti_SassMetricsDisable_Params")
    disable.ctx = ctxarg
    call("disable", "cuptiSassMetricsDisable", disable)
    result["dropped"] = int(disable.numOfDroppedRecords)
    unset = sm._sized(sm._UnsetConfig, "CUpti_SassMetricsUnsetConfig_Params")
    unset.deviceIndex = 0
    call("unset", "cuptiSassMetricsUnsetConfig", unset)
    result["flushed"] = flushed
    result["sums"] = sums
    result["modules"] = len(cubins) if subscriber is not None else "-"
    return result


def run_child(opts: dict[str, Any]) -> None:
    try:
        result = child(opts)
        result["ok"] = True
    except Stop as stop:
        result = {"ok": False, "error": str(stop)}
    except Exception as error:  # everything else: say what and where
        import traceback

        where = traceback.extract_tb(error.__traceback__)[-1]
        result = {"ok": False, "error": f"{type(error).__name__}: {error} (line {where.lineno})"}
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent: every variant, one line each -------------------------------------------------


def summary(name: str, result: dict[str, Any]) -> str:
    if "log" not in result:
        return f"{name:22} ERR  {result.get('error', '?')}"
    head = "ok " if result.get("ok") else "ERR"
    parts = [
        f"gdp=[{','.join(result['gdp'])}]",
        f"flushed={result.get('flushed', '-')}",
        f"sums={result.get('sums', '-')}",
        f"out={result.get('out', '-')}",
        f"dropped={result.get('dropped', '-')}",
        f"mods={result.get('modules', '-')}",
    ]
    if not result.get("ok"):
        parts.append(f"error={result.get('error')}")
    return f"{name:22} {head} {' '.join(parts)} | {' '.join(result['log'])}"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--child":
        run_child(json.loads(argv[1]))
        return 0
    only = set(argv[1].split(",")) if len(argv) >= 2 and argv[0] == "--only" else None
    start = time.monotonic()
    first = True
    for name, change in VARIANTS:
        if only is not None and name not in only:
            continue
        if time.monotonic() - start > TOTAL_S - PER_VARIANT_S:
            print(f"{name:22} SKIP (time)")
            continue
        opts = {**BASE, **change}
        env = {**os.environ, **opts["env"], "PYTHONUNBUFFERED": "1"}
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(opts)],
                capture_output=True,
                text=True,
                timeout=PER_VARIANT_S,
                env=env,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if lines:
                result = json.loads(lines[-1][len("RESULT ") :])
            else:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
                result = {"ok": False, "error": f"rc={proc.returncode} {' / '.join(tail)}"}
            stderr = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        except subprocess.TimeoutExpired:
            result, stderr = {"ok": False, "error": f"timeout {PER_VARIANT_S}s"}, []
        if first and "log" in result:
            print(
                f"# lib={result.get('lib')} chip={result.get('chip')} cupy={result.get('cupy')}"
                f" fn={result.get('fn')} CUDA_MODULE_LOADING="
                f"{os.environ.get('CUDA_MODULE_LOADING', '(unset)')}"
            )
            first = False
        line = summary(name, result) + f" [{time.monotonic() - t0:.1f}s]"
        print(line, flush=True)
        if stderr and not result.get("ok"):
            print(f"    stderr: {' / '.join(stderr[-2:])[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
