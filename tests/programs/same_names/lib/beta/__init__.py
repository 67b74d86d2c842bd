"""A package whose class has an __init__ (the test copies it into a site-packages directory).

Not a copy of alpha: CPython code objects that differ only in their file compare equal.
"""

import time


class Model:
    def __init__(self, seconds: float) -> None:
        total = 0
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            for i in range(2000):
                total += i * i % 5
        self.total = total
