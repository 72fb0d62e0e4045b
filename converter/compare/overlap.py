"""Torch work beside the paddle passes.

On CPU paddle computes on one core by default, and numpy and both frameworks release the
GIL while they compute, so torch work that needs no paddle result (its capture, S2, the
float64 references) runs on a worker thread meanwhile, on the other cores. OpenMP keeps
the thread count per thread, so the worker sets its own: one core fewer than torch's usual
while the main thread works, all of them once it only waits (at the worker's next
`between()`). Torch work on the main thread meanwhile takes the core left (`on_cores_left`).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor

from .port import Session


class TorchWorker:
    """The worker thread, and the one seam for the speed machinery: with the session's
    `serial` option, work submitted runs at once on the calling thread, with the thread count
    the worker would use, so that the numbers are the same."""

    def __init__(self, session: Session):
        import torch
        self.threads = torch.get_num_threads()
        self.share = max(self.threads - 1, 1) if session.device == "cpu" else self.threads
        self.serial = session.options.serial
        self._main_done = False
        self._widened = False
        self._pool = None

    def __enter__(self):
        if self.serial:
            return self
        import torch
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

        def start():  # both are kept per thread: the thread count by OpenMP, the device by CUDA
            torch.set_num_threads(self.share)
            if device is not None:
                torch.cuda.set_device(device)
        self._pool = ThreadPoolExecutor(max_workers=1, initializer=start)
        return self

    def __exit__(self, *exc):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return False

    def submit(self, func, *args) -> Future:
        if not self.serial:
            return self._pool.submit(func, *args)
        import torch
        done: Future = Future()
        before = torch.get_num_threads()
        torch.set_num_threads(self.share)
        try:
            done.set_result(func(*args))
        except BaseException as exc:  # handed over as the pool would: at result()
            done.set_exception(exc)
        finally:
            torch.set_num_threads(before)
        return done

    @contextlib.contextmanager
    def on_cores_left(self):
        """On the main thread: torch work here takes only the cores the worker leaves free (serial
        too: the same thread counts give the same sums)."""
        import torch
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads - self.share or before)  # none left (a GPU run, one core): as it was
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def main_done(self) -> None:
        """From the main thread: it has nothing left to do but wait."""
        self._main_done = True

    def widen_when_alone(self) -> None:
        """From the worker, between units of work: take every core once the main thread waits."""
        if self._main_done and not self._widened and self.share != self.threads and not self.serial:
            import torch
            torch.set_num_threads(self.threads)
            self._widened = True
