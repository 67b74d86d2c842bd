"""SPSC channels: FIFO order, overflow accounting, and one producer racing one consumer."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk.measure.gpu.channels import SEGMENT, SegmentedChannel, SpscChannel

CHANNELS = (SpscChannel, SegmentedChannel)

# A program of channel operations: ("push", n) pushes n numbered items, ("drain", 0) drains.
PROGRAMS = st.lists(
    st.tuples(st.sampled_from(["push", "drain"]), st.integers(0, 2 * SEGMENT + 3)), max_size=30
)


@settings(max_examples=60, deadline=None)
@given(program=PROGRAMS, capacity=st.sampled_from([0, 1, 7, SEGMENT, 3 * SEGMENT]))
def test_both_channels_behave_like_a_bounded_fifo(
    program: list[tuple[str, int]], capacity: int
) -> None:
    for channel_type in CHANNELS:
        channel = channel_type("test", capacity)
        model: list[int] = []
        refused = 0
        received: list[object] = []
        expected: list[int] = []
        counter = 0
        for action, amount in program:
            if action == "push":
                for _ in range(amount):
                    accepted = channel.push(counter)
                    room = not capacity or len(model) < capacity
                    assert accepted == room
                    if room:
                        model.append(counter)
                    else:
                        refused += 1
                    counter += 1
                assert len(channel) == len(model)
            else:
                received += channel.drain()
                expected += model
                model = []
        assert received == expected
        assert channel.overflowed == refused


def test_drain_hands_each_item_to_the_handler_in_order() -> None:
    for channel_type in CHANNELS:
        channel = channel_type()
        for item in range(5):
            channel.push(item)
        seen: list[object] = []
        assert channel.drain(seen.append) == [0, 1, 2, 3, 4]
        assert seen == [0, 1, 2, 3, 4]
        assert channel.drain() == []


@settings(max_examples=10, deadline=None)
@given(items=st.integers(1, 5 * SEGMENT), switch=st.sampled_from([1e-6, 1e-5, 1e-4]))
def test_a_producer_thread_and_a_consumer_thread_never_lose_or_reorder(
    items: int, switch: float
) -> None:
    import sys

    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch)  # force thread switches inside push and drain
    try:
        for channel_type in CHANNELS:
            channel = channel_type()
            received: list[object] = []
            done = threading.Event()

            def produce(
                channel: SpscChannel | SegmentedChannel = channel, done: threading.Event = done
            ) -> None:
                for item in range(items):
                    channel.push(item)
                done.set()

            producer = threading.Thread(target=produce)
            producer.start()
            while not done.is_set():
                received += channel.drain()
            producer.join()
            received += channel.drain()
            assert received == list(range(items))
    finally:
        sys.setswitchinterval(previous)
