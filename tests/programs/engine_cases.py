"""Programs whose truth is known, for pyrun's sampling engine (tests/test_pyrun_engine.py).

Usage: engine_cases.py CASE OUT_JSON SECONDS. Each case runs about SECONDS of CPU time (sized by
measuring, so fast and slow machines run the same shares) and writes what it measured itself
(per-line and per-thread CPU times, line numbers) to OUT_JSON.
"""

import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

CASE, OUT, SECONDS = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(__file__) as _source:
    SOURCE = _source.read().splitlines()
result: dict[str, object] = {}


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def tiny() -> int:
    return 1


# 300 lines of straight-line arithmetic, then a trivial call: a sampler that waits for the
# GIL sees the thread only at its next call and gives everything to tiny().
_lines = ["def straight(n):", "    a = 1", "    for _ in range(n):"]
_lines += [f"        a = (a * {i % 7 + 3} + {i}) % 1000003" for i in range(300)]
_lines += ["        tiny()", "    return a"]
exec(compile("\n".join(_lines), __file__ + ".straight", "exec"))


def case_straight() -> None:
    end = time.thread_time() + SECONDS
    while time.thread_time() < end:
        straight(200)  # type: ignore[name-defined]  # noqa: F821


def c_calls(data: list[int], array: object, times: dict[str, float]) -> None:
    import numpy as np

    t0 = time.thread_time()
    sorted(data)  # LINE sorted
    t1 = time.thread_time()
    np.sort(array)  # LINE numpy
    t2 = time.thread_time()
    spin(20_000)  # LINE spin
    t3 = time.thread_time()
    times["sorted"] += t1 - t0
    times["numpy"] += t2 - t1
    times["spin"] += t3 - t2


def case_ccalls() -> None:
    import numpy as np

    data = list(range(300_000, 0, -1))
    data[::7] = range(len(data[::7]))
    array = np.random.default_rng(0).standard_normal(400_000)
    times = {"sorted": 0.0, "numpy": 0.0, "spin": 0.0}
    end = time.thread_time() + SECONDS
    while time.thread_time() < end:
        c_calls(data, array, times)
    result["times"] = times
    source = SOURCE
    result["lines"] = {
        name: next(i + 1 for i, text in enumerate(source) if text.endswith(f"# LINE {name}"))
        for name in times
    }


def numbers(count: int, work: int):  # type: ignore[no-untyped-def]
    for i in range(count):
        spin(work)
        yield i


def case_generators() -> None:
    times = {"generator": 0.0, "consumer": 0.0, "coroutine_a": 0.0, "coroutine_b": 0.0}
    generator_part(times)
    coroutine_part(times)
    result["times"] = times


def generator_part(times: dict[str, float]) -> None:
    end = time.thread_time() + SECONDS / 2
    while time.thread_time() < end:
        items = numbers(50, 3000)
        while True:
            t0 = time.thread_time()
            try:
                next(items)
            except StopIteration:
                break
            t1 = time.thread_time()
            spin(1000)
            times["generator"] += t1 - t0
            times["consumer"] += time.thread_time() - t1


def coroutine_part(times: dict[str, float]) -> None:
    async def light_task(stop: float) -> None:
        while time.thread_time() < stop:
            t0 = time.thread_time()
            spin(1000)
            times["coroutine_a"] += time.thread_time() - t0
            await asyncio.sleep(0)

    async def heavy_task(stop: float) -> None:
        while time.thread_time() < stop:
            t0 = time.thread_time()
            spin(3000)
            times["coroutine_b"] += time.thread_time() - t0
            await asyncio.sleep(0)

    async def both() -> None:
        stop = time.thread_time() + SECONDS / 2
        await asyncio.gather(light_task(stop), heavy_task(stop))

    asyncio.run(both())


def recurse(depth: int, n: int) -> int:
    if depth == 0:
        return straight(n)  # type: ignore[name-defined]  # noqa: F821
    return recurse(depth - 1, n)


def case_recursion() -> None:
    end = time.thread_time() + SECONDS
    while time.thread_time() < end:
        recurse(600, 500)
    result["depth"] = 600


class ExitClock:
    """Reads its thread's CPU clock when the thread's state is cleared: after pyrun's last
    sample of the thread (a thread-local object dies with the thread)."""

    def __init__(self, name: str, clocks: dict[str, float]) -> None:
        self.name, self.clocks = name, clocks

    def __del__(self) -> None:
        self.clocks[self.name] = time.thread_time()


def case_threads() -> None:
    clocks: dict[str, float] = {}
    at_exit: dict[str, float] = {}
    local = threading.local()

    def run(name: str, work: int, stop: threading.Event) -> None:
        local.probe = ExitClock(name, at_exit)
        while not stop.is_set():
            spin(work)
        clocks[name] = time.thread_time()  # the thread's own clock at the end of its work

    def light(stop: threading.Event) -> None:
        run("light", 1000, stop)

    def heavy(stop: threading.Event) -> None:
        run("heavy", 3000, stop)

    stop = threading.Event()
    threads = [
        threading.Thread(target=light, args=(stop,)),
        threading.Thread(target=heavy, args=(stop,)),
    ]
    for thread in threads:
        thread.start()
    # The GIL splits the time by turns, and each turn runs whole spin() calls of the thread's
    # size: 1:3. Let them run until both have used SECONDS together.
    start = time.process_time()
    while time.process_time() - start < SECONDS:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join()
    time.sleep(0.05)  # the threads' states are cleared after join() returns
    result["clocks"] = clocks
    result["exit_clocks"] = at_exit


def case_blas() -> None:
    import numpy as np

    a = np.random.default_rng(1).standard_normal((600, 600))
    end = time.process_time() + SECONDS
    while time.process_time() < end:
        a = a @ a
        a /= np.abs(a).max()
    result["threads"] = len(os.listdir("/proc/self/task"))
    # OpenBLAS's idle workers spin for a while (up to ~0.1 s) before they sleep: CPU time of
    # the process, and measured, so it must be in the process's clock read below (seen: 3 %
    # more attributed than that clock under `make test`'s load when read at once)
    time.sleep(0.3)


def case_gil() -> None:
    stop = threading.Event()
    walls: dict[str, float] = {}

    def holder() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            spin(2000)
        walls["holder"] = time.monotonic() - t0

    def waiter() -> None:
        t0 = time.monotonic()
        calls = 0
        while not stop.is_set():
            time.sleep(0.0001)  # LINE waiter
            calls += 1
        walls["waiter"] = time.monotonic() - t0
        walls["waiter_sleeping"] = calls * 0.0001

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for thread in threads:
        thread.start()
    time.sleep(SECONDS)
    stop.set()
    for thread in threads:
        thread.join()
    result["walls"] = walls
    source = SOURCE
    result["line"] = next(i + 1 for i, text in enumerate(source) if text.endswith("# LINE waiter"))


def case_eintr() -> None:
    """Blocking calls under 1 kHz of realtime signals: each waits its full time or succeeds."""
    checks: dict[str, bool] = {}
    t0 = time.monotonic()
    time.sleep(0.2)
    checks["sleep"] = time.monotonic() - t0 >= 0.2
    t0 = time.monotonic()
    select.select([], [], [], 0.2)
    checks["select"] = time.monotonic() - t0 >= 0.2
    left, right = socket.socketpair()
    left.settimeout(0.2)
    t0 = time.monotonic()
    try:
        left.recv(1)
        checks["socket"] = False
    except TimeoutError:
        checks["socket"] = time.monotonic() - t0 >= 0.2
    event = threading.Event()
    t0 = time.monotonic()
    checks["event"] = not event.wait(0.2) and time.monotonic() - t0 >= 0.2
    done = subprocess.run(["sleep", "0.2"], check=False)
    checks["subprocess"] = done.returncode == 0
    reader, writer = os.pipe()
    timer = threading.Timer(0.2, os.write, (writer, b"x"))
    timer.start()
    checks["pipe"] = os.read(reader, 1) == b"x"
    timer.join()
    lock = threading.Lock()
    lock.acquire()
    t0 = time.monotonic()
    checks["lock"] = not lock.acquire(timeout=0.2) and time.monotonic() - t0 >= 0.2
    result["checks"] = checks
    left.close()
    right.close()


def case_dying() -> None:
    """Code objects that die right after they ran (exec of fresh source, as eval-heavy code,
    namedtuple and dataclass creation do): each must still be named in the profile."""
    exec_cpu: dict[str, float] = {}
    end = time.thread_time() + SECONDS
    index = 0
    while time.thread_time() < end:
        name = f"fresh_{index % 4}"  # work 1:2:3:4, each in code compiled afresh
        source = f"def {name}():\n    return spin({1000 * (index % 4 + 1)})\n{name}()\n"
        code = compile(source, f"<fresh-{index}>", "exec")
        t0 = time.thread_time()
        exec(code, {"spin": spin})
        exec_cpu[name] = exec_cpu.get(name, 0.0) + time.thread_time() - t0
        del code
        index += 1
    result["exec_cpu"] = exec_cpu
    result["codes"] = index


CASES = {
    "straight": case_straight,
    "ccalls": case_ccalls,
    "generators": case_generators,
    "recursion": case_recursion,
    "threads": case_threads,
    "blas": case_blas,
    "gil": case_gil,
    "eintr": case_eintr,
    "dying": case_dying,
}
CASES[CASE]()
result["process_cpu"] = time.process_time()


def _own_threads_cpu() -> float:
    """CPU seconds of pyrun's own threads (named pyrun-*: the drain, the engine's monitor),
    which sample nothing of the program and are not measured."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as stream:
                stat = stream.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("pyrun-"):
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def _sampling_began_cpu() -> float:
    """The process's CPU time when pyrun's sampling engine began (0 without it): what the
    interpreter's start and pyrun's bootstrap used before is not the program's, and no thread's
    CPU before it is measured."""
    try:
        from pyhpctk.measure import hooks
    except ImportError:
        return 0.0
    session = hooks.current_session()
    engine = None if session is None else session.engine
    return 0.0 if engine is None else float(engine.started_process_cpu)


result["pyrun_threads_cpu"] = _own_threads_cpu()
result["sampling_began_cpu"] = _sampling_began_cpu()
with open(OUT, "w") as out:
    json.dump(result, out)
