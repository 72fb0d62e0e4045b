"""Benchmark verify-port on CPU, with ratios measured in the same run.

1. Speed: verification with the default strategy (auto: full capture at this size) of a
   BERT-base-sized port (12 layers, hidden 768, 12 heads, FFN 3072) against the time of the
   two plain forward passes (torch + paddle). Target: at most 3x.
2. Memory: peak memory held above the loaded models while verifying (hidden 256, long
   sequences, so that activations dominate), with the binary search at 12 and 48 layers and
   with full capture at 12 and 24. Target: the binary search's does not grow with depth.
   RSS is sampled every 5 ms on a thread.

    python scripts/bench_verify.py
    python scripts/bench_verify.py caches   # what each table in compare/identity.py saves
    python scripts/bench_verify.py --scale  # Llama-shaped pairs of growing size: time and peak RSS
    python scripts/bench_verify.py --stream [HIDDEN,LAYERS,FFN ...]  # weights streamed from a bf16 checkpoint
    "$(scripts/side_env.sh)" scripts/bench_verify.py --deberta [FOLDER [capped]]  # DeBERTa-v2-xlarge streamed
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
from converter.verify.full import FullCapture  # noqa: E402
from converter.verify.strategies import BinarySearch  # noqa: E402
from converter.compare.session import Options, PortSession  # noqa: E402
from converter.compare.memory import resident_bytes as rss  # noqa: E402

MB = 1 << 20


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
    """Plain forwards and verification as verify-port runs it by default (`auto`, which captures
    everything at this size; memory check included), run alternately `repeat` times, so that
    drift on a noisy machine hits both alike: best against best, and the median of the
    per-round ratios."""
    from converter.verify.run import run_on
    B.resize(hidden=768, layers=12, heads=12, ffn=3072, seq=128, batch=2)
    options = Options(device="cpu", strategy="auto")
    session = PortSession(clean_spec(), options)
    session.run_torch(), session.run_paddle()  # warm up
    rounds = []
    for _ in range(repeat):
        t_torch, _ = _timed(session.run_torch)
        t_paddle, _ = _timed(session.run_paddle)
        t_verify, report = _timed(lambda: run_on(session, options))
        results = report.layers
        rounds.append((t_torch, t_paddle, t_verify))
    t_torch, t_paddle, t_verify = (min(r[i] for r in rounds) for i in range(3))
    ratios = sorted(r[2] / (r[0] + r[1]) for r in rounds)
    over = sum(r.within_budget is False for r in results)
    print(f"speed (BERT-base size, {len(results)} layers compared, {over} over budget; best of {repeat}, run "
          f"alternately): torch forward {t_torch:.3f} s, paddle forward {t_paddle:.3f} s; verification "
          f"({report.strategy}, {report.passes} paired passes) {t_verify:.2f} s: ratio "
          f"{t_verify / (t_torch + t_paddle):.2f} x the two plain forwards, "
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
            FullCapture().run(session)
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
    strategy = FullCapture() if name == "full" else BinarySearch()  # no capture limit
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


# Llama-shaped sizes (hidden, layers, feed-forward): about 14, 103 and 343 M parameters
SCALES = ((512, 4, 1376), (1024, 8, 2752), (1536, 12, 4096))


def scale_one(strategy, hidden, layers, ffn):
    """Run in a fresh process, so that its peak RSS is this run's: set-up, two plain forwards (best of
    two) and the whole forward check with --bisect, on a Llama-shaped pair (scripts/llama_pair.py)."""
    import resource

    import llama_pair as L

    from converter.verify.run import run_on
    L.resize(hidden=hidden, layers=layers, ffn=ffn, heads=hidden // 64)
    spec = spec_from_functions(L.torch_model, L.paddle_model, L.inputs, label="llama")
    options = Options(device="cpu", strategy=strategy)
    t_setup, session = _timed(lambda: PortSession(spec, options))
    with session:
        session.run_torch(), session.run_paddle()  # warm up
        plain = min(_timed(session.run_torch)[0] + _timed(session.run_paddle)[0] for _ in range(2))
        t_verify, report = _timed(lambda: run_on(session, options, bisect=True))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(L.parameters(), t_setup, plain, t_verify, peak, report.verdict)


def scale(sizes=SCALES):
    """Llama-shaped pairs of growing size, each strategy in a fresh process: the forward check's time
    against two plain forwards, and the process's peak RSS against one model's fp32 weights."""
    import subprocess
    for hidden, layers, ffn in sizes:
        for strategy in ("full", "binary"):
            out = subprocess.run([sys.executable, __file__, "scale-one", strategy, str(hidden), str(layers), str(ffn)],
                                 capture_output=True, text=True, check=True).stdout.split()
            params, t_setup, plain, t_verify, peak, verdict = int(out[-6]), *map(float, out[-5:-1]), out[-1]
            weights = 4 * params
            print(f"scale ({strategy:6s}): Llama-shaped, hidden {hidden}, {layers} layers, {params / 1e6:.0f} M "
                  f"parameters ({weights / 2**30:.2f} GiB fp32): set-up {t_setup:.1f} s; verification {t_verify:.1f} s, "
                  f"{t_verify / plain:.1f} x the two plain forwards ({plain:.2f} s); peak RSS {peak / 2**30:.2f} GiB, "
                  f"{peak / weights:.1f} x the fp32 weights; {verdict}")


# Llama-shaped sizes for --stream: about 103 M parameters (also verified in memory, to compare), then larger
STREAM_SIZES = ((1024, 8, 2752), (2048, 16, 5504))


FORWARDS = {"run_torch": "torch", "run_paddle": "paddle", "run_torch64": "torch float64",
            "paddle64_outputs": "paddle float64"}  # the session's forwards, by what they run


def _count_forwards(session) -> dict:
    """The session's whole-model forwards counted and timed as they run, per kind: [forwards, ended
    early (a pass that records some modules ends once they have run), seconds on their threads]."""
    seen = {name: [0, 0, 0.0] for name in FORWARDS.values()}

    def counted(name, run):
        def forward(*args, **kwargs):
            t0 = time.perf_counter()
            done = False
            try:
                out = run(*args, **kwargs)
                done = True
                return out
            finally:
                figures = seen[name]
                figures[0] += 1
                figures[1] += not done
                figures[2] += time.perf_counter() - t0
        return forward
    for method, name in FORWARDS.items():
        setattr(session, method, counted(name, getattr(session, method)))
    return seen


def _streamed_check(spec, strategy, path, max_memory=None):
    """The forward check (--bisect) of `spec` with the weights at `path`, after two plain forwards
    (best of two, after one to warm up); prints the check's whole-model forwards per kind (how
    many, how many ended early, their seconds, in units of the plain forward of their side; the
    float64 ones in torch's or paddle's), then set-up and check times, the plain forwards, the
    process's peak RSS, the worst ratio, the paired passes, a digest of the rows, the verdict and
    the first layer over budget. `max_memory`: the run's --max-memory, in bytes."""
    import hashlib
    import json
    import resource

    from converter.verify.run import run_on
    options = Options(device="cpu", strategy=strategy, max_memory=max_memory)
    t_setup, session = _timed(lambda: PortSession(spec, options, weights=path))
    with session:
        session.run_torch(), session.run_paddle()  # warm up
        rounds = [(_timed(session.run_torch)[0], _timed(session.run_paddle)[0]) for _ in range(2)]
        t_torch, t_paddle = min(rounds, key=sum)
        plain = t_torch + t_paddle
        seen = _count_forwards(session)
        t_verify, report = _timed(lambda: run_on(session, options, bisect=True))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    digest = hashlib.sha256(repr([report.layers, report.outputs]).encode()).hexdigest()[:12]
    worst = max((r.ratio for r in report.layers if r.ratio is not None), default=0.0)
    unit = {"torch": t_torch, "torch float64": t_torch, "paddle": t_paddle, "paddle float64": t_paddle}
    named = report.first_bad.torch if report.first_bad is not None else "-"
    print(json.dumps({name: [n, early, round(t, 1), round(t / unit[name], 2)] for name, (n, early, t) in seen.items()}))
    print(t_setup, plain, t_verify, peak, worst, report.passes, digest, report.verdict, named or "<model>")


def _check_line(out: list[str]) -> dict:
    """_streamed_check's last line, read back."""
    t_setup, plain, t_verify, peak, worst = map(float, out[:5])
    return dict(t_setup=t_setup, plain=plain, t_verify=t_verify, peak=peak, worst=worst, passes=out[5], digest=out[6],
                verdict=out[7], named=out[8])


def stream_one(mode, hidden, layers, ffn, path):
    """Run in a fresh process: the forward check (strategy binary) of a Llama-shaped pair whose
    weights are the checkpoint at `path`: `stream`, the torch model on the meta device (both models'
    weights streamed block by block); `memory`, both built whole (_streamed_check's figures)."""
    import llama_pair as L
    L.resize(hidden=hidden, layers=layers, ffn=ffn, heads=hidden // 64)
    torch_model = L.meta_torch_model if mode == "stream" else L.torch_model
    _streamed_check(spec_from_functions(torch_model, L.paddle_model, L.inputs, label="llama"), "binary", path)


def deberta_one(strategy, bug, path, max_memory="-"):
    """Run in a fresh process, in the side environment: the forward check of DeBERTa-v2-xlarge's
    full shape, HF's model on the meta device against PaddleNLP's under LazyGuard, both streamed
    from the fp32 checkpoint at `path`; `bug`: "bug" plants deberta_xl_pair.BUG; `max_memory`:
    bytes, or "-" for none."""
    import deberta_xl_pair as D
    spec = spec_from_functions(D.meta_torch_model, lambda: D.paddle_model(bug == "bug"), D.inputs, label="deberta-xl")
    _streamed_check(spec, strategy, path, None if max_memory == "-" else int(max_memory))


def deberta(folder=None, uncapped=True):
    """DeBERTa-v2-xlarge's full shape verified streamed, under full and binary, clean and with a
    planted bug, without a memory cap and with --max-memory at the target, each in a fresh process
    (the side environment's python: HF transformers and PaddleNLP): time against two plain
    streamed forwards, peak RSS against one model's fp32 weights (target: at most 1.5 x plus
    2 GiB), the layer named. `uncapped`: False runs those with --max-memory alone."""
    import subprocess
    import tempfile

    import deberta_xl_pair as D
    folder = folder or tempfile.mkdtemp(prefix="bench_deberta_")
    path = os.path.join(folder, "deberta-v2-xlarge.safetensors")
    written = not os.path.exists(path)  # a checkpoint left in `folder` is used as it is, and left
    if written:
        t_write, size = _timed(lambda: D.write_checkpoint(path))
        print(f"checkpoint written in {t_write:.1f} s", flush=True)
    size = os.path.getsize(path)
    target = int(1.5 * size + 2 * 2**30)
    print(f"checkpoint: DeBERTa-v2-xlarge, {D.parameters() / 1e6:.0f} M parameters, fp32 {size / 2**30:.2f} GiB; "
          f"target peak RSS {target / 2**30:.2f} GiB", flush=True)
    try:
        for cap in ("-", str(target)) if uncapped else (str(target),):
            for strategy, bug in (("full", "clean"), ("full", "bug"), ("binary", "clean"), ("binary", "bug")):
                done = subprocess.run([sys.executable, __file__, "deberta-one", strategy, bug, path, cap],
                                      capture_output=True, text=True)
                said = f"  {'--max-memory' if cap != '-' else 'no cap':12s} {strategy:6s} {bug:5s}: "
                if done.returncode != 0:  # a run that does not fit under the cap stops with one line
                    print(said + done.stderr.strip().splitlines()[-1], flush=True)
                    continue
                got = _check_line(done.stdout.splitlines()[-1].split())
                expected = D.BUG if bug == "bug" else "-"
                print(f"{said}verification {got['t_verify']:.1f} s, "
                      f"{got['t_verify'] / got['plain']:.1f} x the two plain forwards ({got['plain']:.1f} s); peak RSS "
                      f"{got['peak'] / 2**30:.2f} GiB, {(got['peak'] - 2 * 2**30) / size:.2f} x the fp32 weights "
                      f"beyond 2 GiB; {got['verdict']}, named {got['named']} (expected {expected}); worst ratio "
                      f"{got['worst']:.3g}", flush=True)
    finally:
        if written:
            os.remove(path)


def stream(sizes=STREAM_SIZES, folder=None):
    """Each size: a bf16 checkpoint written tensor by tensor, then the forward check with both models'
    weights streamed from it (and, at the first size, in memory too: the same rows), in fresh
    processes: time against two plain streamed forwards, peak RSS against the checkpoint's size."""
    import json
    import subprocess
    import tempfile

    import llama_pair as L
    folder = folder or tempfile.mkdtemp(prefix="bench_stream_")
    for i, (hidden, layers, ffn) in enumerate(sizes):
        L.resize(hidden=hidden, layers=layers, ffn=ffn, heads=hidden // 64)
        path = os.path.join(folder, f"llama-{hidden}-{layers}.safetensors")
        t_write, size = _timed(lambda p=path: L.write_checkpoint(p))
        print(f"checkpoint: hidden {hidden}, {layers} layers, {L.parameters() / 1e6:.0f} M parameters, bf16 "
              f"{size / 2**30:.2f} GiB (fp32 {2 * size / 2**30:.2f} GiB), written in {t_write:.1f} s", flush=True)
        for mode in ("stream", "memory") if i == 0 else ("stream",):
            lines = subprocess.run([sys.executable, __file__, "stream-one", mode, str(hidden), str(layers), str(ffn),
                                    path], capture_output=True, text=True, check=True).stdout.splitlines()
            got = _check_line(lines[-1].split())
            forwards = json.loads(lines[-2])
            print(f"  {mode:6s}: set-up {got['t_setup']:.1f} s; verification {got['t_verify']:.1f} s, "
                  f"{got['t_verify'] / got['plain']:.1f} x the two plain forwards ({got['plain']:.2f} s); peak RSS "
                  f"{got['peak'] / 2**30:.2f} GiB, {got['peak'] / size:.2f} x the checkpoint; worst ratio "
                  f"{got['worst']:.3g}; {got['passes']} paired passes; rows {got['digest']}; {got['verdict']}", flush=True)
            print("          whole-model forwards (count, ended early, seconds, in plain forwards of their side): "
                  + "; ".join(f"{name} {n}, {early}, {t} s, {units}" for name, (n, early, t, units) in forwards.items()),
                  flush=True)
        os.remove(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["memory-one"]:
        memory_one(sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
    elif sys.argv[1:2] == ["scale-one"]:
        scale_one(sys.argv[2], *map(int, sys.argv[3:6]))
    elif sys.argv[1:2] == ["stream-one"]:
        stream_one(sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6])
    elif sys.argv[1:2] == ["deberta-one"]:
        deberta_one(*sys.argv[2:6])
    elif sys.argv[1:2] == ["--deberta"]:
        deberta(*sys.argv[2:3], uncapped=sys.argv[3:4] != ["capped"])
    elif sys.argv[1:2] == ["--stream"]:
        stream(tuple(tuple(map(int, a.split(","))) for a in sys.argv[2:]) or STREAM_SIZES)
    elif sys.argv[1:2] == ["--scale"]:
        scale()
    elif sys.argv[1:2] == ["caches"]:
        caches(int(sys.argv[2]) if sys.argv[2:3] else 3)
    else:
        speed()
        memory()
