"""A package whose class has an __init__ (the test copies it into a site-packages directory)."""

import time


class Model:
    def __init__(self, seconds: float) -> None:
        total = 0
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            for i in range(2000):
                total += i * i % 7
        self.total = total
