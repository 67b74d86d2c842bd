"""Measurement that begins after a thread already runs: that thread must be measured too.

Usage: late_start.py OUTPUT_DIR (uses pyhpctk.measure.launch.runtime directly, without pyrun).
"""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chain import func_hi

from pyhpctk.measure.launch import runtime

worker = threading.Thread(target=func_hi, args=(0.4,), name="early-worker")
worker.start()
session = runtime.start(sys.argv[1])
worker.join()
runtime.stop()
