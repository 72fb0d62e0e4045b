"""Overlap work on two cores: a worker thread computes the next items while the caller
consumes the current one, or checks the items the caller has finished with. numpy copies
and file I/O release the GIL.

How far a worker may run ahead or lag behind is counted in bytes, not items: a checkpoint
interleaves 4-byte biases with 100 MB matrices, and a count of items would make the caller
wait on every matrix.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

SLACK = 64 << 20  # bytes a worker may hold beyond the item in hand


def prefetch(func, items, size, slack: int = SLACK):
    """Yield func(item) for each item, in order, computing ahead while the items not yet
    yielded come to at most `slack` bytes (`size(item)` each; always at least one)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = deque()  # (future, bytes)
        held = 0
        for item in items:
            while pending and held + size(item) > slack:
                future, nbytes = pending.popleft()
                held -= nbytes
                yield future.result()
            pending.append((pool.submit(func, item), size(item)))
            held += size(item)
        while pending:
            yield pending.popleft()[0].result()


class BoundedWorkers:
    """Run `func(*args)` calls on `workers` threads, started in order, while the calls not yet
    finished come to at most `slack` bytes (`submit(nbytes, *args)`); `close()` waits for the
    rest and returns every result, in the order submitted."""

    def __init__(self, func, slack: int = SLACK, workers: int = 1):
        self.func = func
        self.slack = slack
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.pending = deque()  # (future, bytes)
        self.held = 0
        self.results = []

    def submit(self, nbytes: int, *args):
        while self.pending and self.held + nbytes > self.slack:
            self._finish_oldest()
        self.pending.append((self.pool.submit(self.func, *args), nbytes))
        self.held += nbytes

    def _finish_oldest(self):
        future, nbytes = self.pending.popleft()
        self.held -= nbytes
        self.results.append(future.result())

    def close(self):
        try:
            while self.pending:
                self._finish_oldest()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return self.results
