"""Why does cuptiSassMetricsGetDataProperties report no records? (issue #7 device diagnosis)

Answered on the H200 (2026-12-01): the variants that zero their output (``cupy.zeros``,
``cuMemsetD8``) between SetConfig and the kernel's first launch count nothing; with the zeroing
left out (``nomemset``, ``driver_cubin+nomemset``) CUPTI counts. The full rules (one kernel per
window, one flush, the activity kinds that stop it) are in docs/gpu.md and ``sassmetrics``;
``probe_from_python.py`` (``PFP_STEPS``, ``PFP_ACTIVITY``) tests them one step at a time.

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
TOTAL_S = 240

BASE: dict[str, Any] = {
    "sub": True,  # cupti-python subscriber (MODULE_LOADED) present, as in the recorder
    "setconfig": "after_ctx",  # after_ctx | before_ctx (profiler init + SetConfig first)
    "init": True,  # cuptiProfilerInitialize
    "enable": "before_load",  # before_load | after_load (module load = RawModule/get_function)
    "lazy": 1,
    "ctxarg": "ctx",  # ctx | null: what Enable/GetDataProperties/Flush/Disable get
    "ctx": "primary",  # primary (cupy) | created (cuCtxCreate_v2, as NVIDIA's sample)
    # | driver_primary (cuDevicePrimaryCtxRetain: with loader=driver, cupy is never imported)
    "sync": "cuCtx",  # cuCtx | cudaDevice
    "gran": 0,  # CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU=0, SM=1, SMSP=2
    "metrics": ["smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"],
    "flush": "each",  # each | once (after all launches)
    "loader": "cupy",  # cupy (RawModule, NVRTC) | driver (cuModuleLoadData of gt_sm90.cubin)
    "configs": "kept",  # kept (alive until UnsetConfig) | zeroed | freed, right after SetConfig
    "cupti_python": True,  # import cupti-python (else libcupti is found on disk)
    "memset": True,  # the output zeroed (cuMemsetD8 / cupy.zeros) between Enable and launch
    "cupti_mode": "local",  # local | global: how this file's ctypes loads libcupti
    "cupti_when": "after_cuinit",  # after_cuinit | before_cuinit: when libcupti is loaded
    "query": False,  # cuptiProfilerDeviceSupported(SASS_METRICS) before the chip name
    # steps done by sass_probe.cu's library (PROBE_LIB, default /tmp/libsass_probe.so) instead
    # of this file's ctypes: "setup" (init..Enable), "launch" (its own kernel), "collect";
    # with loader=driver: "cload" (it loads gt_sm90.cubin), "claunch" (it launches gt_kernel),
    # "rtinit" (its static CUDA runtime initialized before the module load)
    "cside": [],
    "env": {},
}
ONE = ["smsp__sass_inst_executed"]
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("base", {}),
    ("configs_zeroed", {"configs": "zeroed"}),
    ("configs_freed", {"configs": "freed"}),
    ("no_cupti_python", {"sub": False, "cupti_python": False}),
    ("query", {"query": True}),
    ("c_all", {"cside": ["setup", "launch", "collect"]}),
    ("c_setup", {"cside": ["setup"]}),
    ("c_launch", {"cside": ["launch"]}),
    ("c_collect", {"cside": ["collect"]}),
    ("c_setup+launch", {"cside": ["setup", "launch"]}),
    ("c_launch+collect", {"cside": ["launch", "collect"]}),
    ("c_setup+collect", {"cside": ["setup", "collect"]}),
    ("c_cubin", {"loader": "driver", "cside": ["cload", "claunch"]}),
    ("c_cubin_load", {"loader": "driver", "cside": ["cload"]}),
    ("c_cubin_launch", {"loader": "driver", "cside": ["claunch"]}),
    ("driver_cubin+rtinit", {"loader": "driver", "cside": ["rtinit"]}),
    ("global_cupti", {"cupti_mode": "global", "sub": False, "cupti_python": False}),
    (
        "global_cupti+driver_cubin",
        {"cupti_mode": "global", "sub": False, "cupti_python": False, "loader": "driver"},
    ),
    (
        "cupti_before_cuinit+driver_cubin",
        {"cupti_when": "before_cuinit", "sub": False, "cupti_python": False, "loader": "driver"},
    ),
    ("preload_cupti", {"env": {"LD_PRELOAD": "@cupti"}}),
    ("preload_cupti+driver_cubin", {"env": {"LD_PRELOAD": "@cupti"}, "loader": "driver"}),
    (
        "preload_toolkit_cupti",
        {"env": {"LD_PRELOAD": "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13"}},
    ),
    ("driver_cubin+nomemset", {"loader": "driver", "memset": False}),
    ("nomemset", {"memset": False}),
    ("preload_cuda+driver_cubin", {"env": {"LD_PRELOAD": "libcuda.so.1"}, "loader": "driver"}),
    (
        "preload_both+driver_cubin",
        {"env": {"LD_PRELOAD": "libcuda.so.1 @cupti"}, "loader": "driver"},
    ),
    ("c_setup+c_cubin", {"loader": "driver", "cside": ["setup", "cload", "claunch"]}),
    ("one_metric+driver_cubin", {"loader": "driver", "metrics": ONE}),
    ("one_metric+c_cubin", {"loader": "driver", "metrics": ONE, "cside": ["cload", "claunch"]}),
    (
        "nocupy+c_cubin",
        {
            **{"ctx": "driver_primary", "loader": "driver", "sub": False},
            **{"cupti_python": False, "cside": ["cload", "claunch"]},
        },
    ),
    (
        "nocupy+c_setup+c_cubin",
        {
            **{"ctx": "driver_primary", "loader": "driver", "sub": False},
            **{"cupti_python": False, "cside": ["setup", "cload", "claunch"]},
        },
    ),
    (
        "nocupy+driver_cubin",
        {"ctx": "driver_primary", "loader": "driver", "sub": False, "cupti_python": False},
    ),
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


def _cupti_on_disk() -> list[str]:
    """libcupti files on disk, the pip wheels' (cupti-python's choice) first."""
    candidates: list[str] = []
    for entry in sys.path:
        candidates += sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "libcupti.so*")))
    return candidates + sorted(glob.glob("/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*"))


def _find_libcupti(cupti_python: bool = True, mode: str = "local") -> tuple[ctypes.CDLL, str]:
    """The libcupti this process loaded (cupti-python's), else the first one found on disk."""
    if cupti_python:
        try:
            from cupti import cupti

            cupti.get_timestamp()  # makes cupti-python load its libcupti
        except Exception as error:
            print(f"cupti-python: {type(error).__name__}: {error}", file=sys.stderr)
    from pyhpctk.measure.gpu.cupti.lib import loaded_library

    path = loaded_library("libcupti")
    candidates = ([path] if path else []) + _cupti_on_disk() + ["libcupti.so.13", "libcupti.so"]
    flags = ctypes.RTLD_GLOBAL if mode == "global" else ctypes.RTLD_LOCAL
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate, mode=flags), candidate
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
    early = None
    if opts["cupti_when"] == "before_cuinit":
        early = _find_libcupti(opts["cupti_python"], opts["cupti_mode"])
        log.append("libcupti loaded before cuInit")
    st = int(cuda.cuInit(0))
    log.append(f"cuInit={st}")
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    if st != 0 or count.value == 0:
        raise Stop(f"no GPU (cuInit={st}, devices={count.value})")
    import numpy as np

    sys.path.insert(0, str(HERE.parents[2] / "src"))
    from pyhpctk.measure.gpu.cupti import sassmetrics as sm

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
    lib, path = early or _find_libcupti(opts["cupti_python"], opts["cupti_mode"])
    result["lib"] = path
    keep: list[object] = []  # what must outlive SetConfig (opts["configs"] == "kept")

    def call(name: str, fn_name: str, params: ctypes.Structure) -> int:
        status = int(getattr(lib, fn_name)(ctypes.byref(params)))
        log.append(f"{name}={status}")
        return status

    metric_ids: dict[int, str] = {}
    probe: Any = None
    if opts["cside"]:
        try:
            probe = ctypes.CDLL(os.environ.get("PROBE_LIB", "/tmp/libsass_probe.so"))
        except OSError as error:
            raise Stop(f"no probe library ({error})") from None
        probe.probe_collect.restype = ctypes.c_longlong
        probe.probe_load_cubin.restype = ctypes.c_void_p
        probe.probe_load_cubin.argtypes = [ctypes.c_char_p]
        probe.probe_launch_function.argtypes = [ctypes.c_void_p, ctypes.c_int]

    class _Supported(ctypes.Structure):  # CUpti_Profiler_DeviceSupported_Params
        _fields_ = [("structSize", ctypes.c_size_t), ("pPriv", ctypes.c_void_p)] + [
            (name, ctypes.c_int)
            for name in [
                "cuDevice",
                "isSupported",
                "architecture",
                "sli",
                "vGpu",
                "cc",
                "cmp",
                "wsl",
                "api",
            ]
        ]

    def configure() -> None:
        if "setup" in opts["cside"]:
            log.append(f"probe_setup={probe.probe_setup(int(opts['lazy']), 1)}")
            return
        if opts["init"]:
            init = sm._sized(sm._Initialize, "CUpti_Profiler_Initialize_Params")
            call("init", "cuptiProfilerInitialize", init)
        if opts["query"]:
            supported = _Supported(structSize=_Supported.api.offset + 4, api=2)  # SASS_METRICS
            call("supported", "cuptiProfilerDeviceSupported", supported)
            log.append(f"isSupported={supported.isSupported}")
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
        log.append("ids=" + "/".join(str(c.metricId) for c in configs))
        if opts["configs"] == "kept":
            keep.append(configs)
        elif opts["configs"] == "zeroed":
            ctypes.memset(configs, 0, ctypes.sizeof(configs))

    def configure_then_free() -> None:
        configure()
        if opts["configs"] == "freed":  # reuse the freed array's memory (same size class)
            size = ctypes.sizeof(sm._Config) * len(opts["metrics"])
            keep.append([ctypes.create_string_buffer(b"\xff" * size, size) for _ in range(256)])

    if opts["setconfig"] == "before_ctx":
        configure_then_free()
    context = ctypes.c_void_p(0)
    if opts["ctx"] == "driver_primary":
        cupy: Any = None
        st = int(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0))
        st2 = int(cuda.cuCtxSetCurrent(context))
        log.append(f"cuDevicePrimaryCtxRetain={st} cuCtxSetCurrent={st2}")
    else:
        import cupy

        result["cupy"] = cupy.__version__
    if opts["ctx"] == "created":
        st = int(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, 0))
        log.append(f"cuCtxCreate={st}")
        if st != 0:
            raise Stop("cuCtxCreate_v2 failed")
    elif opts["ctx"] == "primary":
        cupy.cuda.Device(0).use()
        cupy.cuda.runtime.free(0)
        cuda.cuCtxGetCurrent(ctypes.byref(context))
    ctx = int(context.value or 0)
    if not ctx:
        raise Stop("no current context")
    if opts["setconfig"] == "after_ctx":
        configure_then_free()
    ctxarg = ctx if opts["ctxarg"] == "ctx" else None

    def enable() -> None:
        if "setup" in opts["cside"]:
            return
        params = sm._sized(sm._Enable, "CUpti_SassMetricsEnable_Params")
        params.ctx = ctxarg
        params.enableLazyPatching = int(opts["lazy"])
        call("enable", "cuptiSassMetricsEnable", params)

    # the module and a launcher
    launch: Any
    read_out: Any
    if "launch" in opts["cside"]:

        def load() -> None:
            nonlocal launch, read_out

            def launch() -> None:
                log.append(f"probe_launch={probe.probe_launch(1000)}")

            def read_out() -> float:
                return 0.0

    elif opts["loader"] == "cupy":

        def load() -> None:
            nonlocal launch, read_out
            sys.path.insert(0, str(HERE))
            from record_pc import KERNEL, SOURCE  # type: ignore[import-not-found]

            kernel = cupy.RawModule(code=SOURCE, options=("-lineinfo",)).get_function(KERNEL)
            make = cupy.zeros if opts["memset"] else cupy.empty
            out = make(BLOCKS * THREADS, dtype=cupy.float32)
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
            if "rtinit" in opts["cside"]:
                log.append(f"probe_runtime_init={probe.probe_runtime_init()}")
            image = CUBIN.read_bytes()
            module, function = ctypes.c_void_p(0), ctypes.c_void_p(0)
            if "cload" in opts["cside"]:
                function = ctypes.c_void_p(probe.probe_load_cubin(str(CUBIN).encode()))
                st = st2 = 0 if function.value else 1
                log.append(f"probe_load_cubin={function.value is not None}")
            else:
                st = int(cuda.cuModuleLoadData(ctypes.byref(module), image))
                log.append(f"cuModuleLoadData={st}")
                st2 = int(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"gt_kernel"))
                log.append(f"cuModuleGetFunction={st2}")
            if st or st2:
                raise Stop("module load failed")
            dptr = ctypes.c_uint64(0)
            size = BLOCKS * THREADS * 4
            cuda.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(size))
            if opts["memset"]:
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
                if "claunch" in opts["cside"]:
                    log.append(
                        f"probe_launch_function={probe.probe_launch_function(function, ITERS)}"
                    )
                    return
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
        if "collect" in opts["cside"]:
            count = int(probe.probe_collect())
            result["gdp"].append(f"{count}xC")
            flushed += max(count, 0)
            return
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
        for key, value in opts["env"].items():  # "@cupti": the libcupti cupti-python loads
            if "@cupti" in value:
                env[key] = value.replace("@cupti", (_cupti_on_disk() or ["libcupti.so.13"])[0])
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
