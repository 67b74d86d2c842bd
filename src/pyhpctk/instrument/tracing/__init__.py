"""The host's side of per-warp traces (issue #34 item 4): buffers, decoding, the launcher and
recordings.

:mod:`pyhpctk.instrument.ptx.traces` writes the probes; here is what runs around a traced
launch on the host: ``buffers`` (the control block's words, the exact strategy's table from its
counting pass, the chunk pool), ``launcher`` (one traced launch in either strategy, the exact
one's memory saved and restored between its passes), ``memory`` (the device memory it uses, and
the memory a launch's arguments let it write), ``decode`` (raw buffers into events per warp, and
their times) and ``recording`` (raw buffers kept for replay without a GPU).
"""
