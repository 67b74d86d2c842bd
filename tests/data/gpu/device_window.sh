#!/bin/bash
# Issue #37, item 3 on the device: a training job of SECONDS (default 600) started paused under
# pyrun -e REALTIME -e gpu=nvidia, opened with `pyrun ctl PID start` at OPEN_AT s (default 240)
# for WINDOW s (default 30), closed with `pyrun ctl PID stop`; window_check.py then checks that
# the database has time and kernels only from the window. Logs to OUT/window.txt. A dry run
# without a GPU: EVENTS='-e REALTIME' (the job trains on the CPU; no kernels to count).
# Usage (repository root, after the wheels and the hook are installed, as device scripts do):
#   bash tests/data/gpu/device_window.sh OUT [SECONDS [OPEN_AT [WINDOW]]]
out=${1:?output directory}
seconds=${2:-600} open_at=${3:-240} window=${4:-30}
mkdir -p "$out"
log="$out/window.txt"
work=$(mktemp -d /tmp/window.XXXXXX)
here=tests/data/gpu
now() { python3 -c 'import time; print(time.time_ns())'; }
{
  per_step=$(python3 "$here/window_job.py" count | tail -1)
  echo "kernels per step (torch.profiler, without pyrun): $per_step"
  python3 -m pyhpctk.cli.pyrun --start-paused ${EVENTS:--e REALTIME -e gpu=nvidia} -o "$work/m" \
    python3 "$here/window_job.py" "$seconds" "$work/log.json" &
  pyrun_pid=$!
  sleep "$open_at"
  opened=$(now); python3 -m pyhpctk.cli.pyrun ctl "$pyrun_pid" start
  sleep "$window"
  python3 -m pyhpctk.cli.pyrun ctl "$pyrun_pid" stop; closed=$(now)
  wait "$pyrun_pid"; echo "pyrun rc=$?"
  python3 -m pyhpctk.cli.pyprof -o "$work/d" "$work/m" | tail -3; echo "pyprof rc=${PIPESTATUS[0]}"
  python3 "$here/window_check.py" "$work/d" "$work/log.json" "$opened" "$closed" "$per_step"
  echo "window_check rc=$?"
} > "$log" 2>&1
