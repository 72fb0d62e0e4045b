"""Benchmark verify-port on CPU, with ratios measured in the same run.

1. Speed: full-capture verification of a BERT-base-sized port (12 layers, hidden 768,
   12 heads, FFN 3072) against the time of the two plain forward passes (torch + paddle).
   Target: at most 3x.
2. Memory: peak memory held above the loaded models while verifying (hidden 256, long
   sequences, so that activations dominate), with the binary search at 12 and 48 layers and
   with full capture at 12 and 24. Target: the binary search's does not grow with depth.
   RSS is sampled every 5 ms on a thread.

    python scripts/bench_verify.py
    python scripts/bench_verify.py caches   # what each table in compare/identity.py saves
"""

import os
import sys
import threading
import time
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from converter.lazy import import_paddle  # noqa: E402

import_paddle()  # first, quietly: the example imports paddle at its top

from converter.examples import bert_port as B  # noqa: E402
from converter.spec import spec_from_functions  # noqa: E402
from converter.verify.strategies import choose  # noqa: E402
from converter.compare.session import Options, PortSession  # noqa: E402

MB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    def __enter__(self):
        self.base = rss()
        self.peak = self.base
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, rss())
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss())

    @property
    def held(self):
        return self.peak - self.base


def clean_spec():
    return spec_from_functions(B.torch_model, B.paddle_model_fixed, B.inputs, label="bert")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def speed(repeat=5):
    """Plain forwards and full-capture verification, run alternately `repeat` times, so that
    drift on a noisy machine hits both alike: best against best, and the median of the
    per-round ratios."""
    B.resize(hidden=768, layers=12, heads=12, ffn=3072, seq=128, batch=2)
    session = PortSession(clean_spec(), Options(device="cpu", strategy="full"))
    session.run_torch(), session.run_paddle()  # warm up
    rounds = []
    for _ in range(repeat):
        t_torch, _ = _timed(session.run_torch)
        t_paddle, _ = _timed(session.run_paddle)
        t_verify, found = _timed(lambda: choose("full", None).run(session))
        results = found.results
        rounds.append((t_torch, t_paddle, t_verify))
    t_torch, t_paddle, t_verify = (min(r[i] for r in rounds) for i in range(3))
    ratios = sorted(r[2] / (r[0] + r[1]) for r in rounds)
    over = sum(r.within_budget is False for r in results)
    print(f"speed (BERT-base size, {len(results)} layers compared, {over} over budget; best of {repeat}, run "
          f"alternately): torch forward {t_torch:.3f} s, paddle forward {t_paddle:.3f} s; full-capture "
          f"verification {t_verify:.2f} s: ratio {t_verify / (t_torch + t_paddle):.2f} x the two plain forwards, "
          f"median of per-round ratios {ratios[len(ratios) // 2]:.2f} (target <= 3)")


CACHES = ("converted", "known")  # compare/identity.py: the named tables


def caches(repeat=3):
    """What each table that only saves work saves: full-capture verification of the BERT-base-sized
    port with all of them on, and with each one turned off, in rounds that rotate the order. CPU
    time of this process (all its threads), which another process on the machine disturbs far
    less than wall time; the median of each configuration against the median with every table
    (over 1.05: it saves more than 5%). Then the memory full capture holds at 12 layers (as in
    the memory benchmark), with every table and without each, in fresh processes."""
    import statistics

    from converter.compare import identity
    B.resize(hidden=768, layers=12, heads=12, ffn=3072, seq=128, batch=2)
    session = PortSession(clean_spec(), Options(device="cpu", strategy="full"))
    session.run_torch(), session.run_paddle()  # warm up
    configs = (None,) + CACHES
    times = {c: [] for c in configs}
    for r in range(repeat):
        for off in configs[r % len(configs):] + configs[:r % len(configs)]:
            identity.TURNED_OFF.clear()
            if off:
                identity.TURNED_OFF.add(off)
            t0 = time.process_time()
            choose("full", None).run(session)
            times[off].append(time.process_time() - t0)
    identity.TURNED_OFF.clear()
    base = statistics.median(times[None])
    print(f"full-capture verification, CPU time, median of {repeat}: {base:.2f} s with every table")
    for name in CACHES:
        t = statistics.median(times[name])
        print(f"  without '{name}': {t:.2f} s, {t / base:.3f} x" + ("  (saves under 5%)" if t / base < 1.05 else ""))
    held = {off: _held_in_fresh_process("full", 12, off) for off in (None,) + CACHES}
    print(f"memory held by full capture at 12 layers: {held[None] / MB:.0f} MiB with every table")
    for name in CACHES:
        r = held[name] / held[None]
        print(f"  without '{name}': {held[name] / MB:.0f} MiB, {r:.3f} x" + ("  (saves under 5%)" if r < 1.05 else ""))


def _held_in_fresh_process(name, layers, off=None) -> int:
    import subprocess
    out = subprocess.run([sys.executable, __file__, "memory-one", name, str(layers)] + ([off] if off else []),
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[-2])


def memory_one(name, layers, off=None):
    """Run in a fresh process: the allocator keeps what an earlier run freed. `off`: a table of
    compare/identity.py to turn off."""
    if off:
        from converter.compare import identity
        identity.TURNED_OFF.add(off)
    B.resize(hidden=256, layers=layers, heads=4, ffn=1024, seq=512, batch=4)
    session = PortSession(clean_spec(), Options(device="cpu"))
    session.run_torch(), session.run_paddle()  # allocator warm-up for a plain forward
    strategy = choose(name, None)
    with PeakRss() as peak:
        found = strategy.run(session)
    print(peak.held, found.passes)


# full capture holds every layer's activations (and their references), so it grows with depth
# by design: it is measured at 12 and 24 layers (48 would need about 20 GB); the binary search
# at 12 and 48
DEPTHS = {"full": (12, 24), "binary": (12, 48)}


def memory():
    import subprocess
    for name, (low, high) in DEPTHS.items():
        rows = {}
        for layers in (low, high):
            out = subprocess.run([sys.executable, __file__, "memory-one", name, str(layers)], capture_output=True,
                                 text=True, check=True).stdout.split()
            rows[layers] = (int(out[-2]), int(out[-1]))
        (m_low, p_low), (m_high, p_high) = rows[low], rows[high]
        print(f"memory ({name:6s}): held above the models {m_low / MB:.0f} MiB at {low} layers ({p_low} paired passes), "
              f"{m_high / MB:.0f} MiB at {high} layers ({p_high} passes): {high}/{low} ratio {m_high / max(m_low, 1):.2f}"
              + ("  (target: does not grow, about 1)" if name == "binary" else ""))


if __name__ == "__main__":
    if sys.argv[1:2] == ["memory-one"]:
        memory_one(sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
    elif sys.argv[1:2] == ["caches"]:
        caches(int(sys.argv[2]) if sys.argv[2:3] else 3)
    else:
        speed()
        memory()
