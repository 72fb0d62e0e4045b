"""Overlap work on two cores: a worker thread computes the next items while the caller
consumes the current one. numpy copies and file I/O release the GIL."""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor


def ahead(func, items, depth: int = 1):
    """Yield func(item) for each item, in order, computing up to `depth` items ahead."""
    items = iter(items)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = deque()
        for item in items:
            pending.append(pool.submit(func, item))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


class Behind:
    """Run `func(*args)` calls on a worker thread, in order, at most `depth` behind the caller;
    `close()` waits for the rest and returns their results."""

    def __init__(self, func, depth: int = 1):
        self.func = func
        self.depth = depth
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending = deque()
        self.results = []

    def submit(self, *args):
        self.pending.append(self.pool.submit(self.func, *args))
        while len(self.pending) > self.depth:
            self.results.append(self.pending.popleft().result())

    def close(self):
        try:
            while self.pending:
                self.results.append(self.pending.popleft().result())
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return self.results
