"""torch's thread count as a thread started now gets it."""

import threading


def threads_of_a_new_thread() -> int:
    """torch.get_num_threads() on a thread started now: under OpenMP, the count last set on any thread
    other than the first, where it differs from the calling thread's own."""
    import torch
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]
