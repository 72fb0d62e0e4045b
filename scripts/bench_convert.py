"""Benchmark convert-weights on a checkpoint with BERT-large shapes (24 layers, hidden 1024,
about 1.34 GB fp32), stored as safetensors and as a torch .bin.

Every figure is measured in this run, on this machine, and printed as a ratio against a
baseline from the same run (these machines are noisy):
  * safetensors -> .pdparams: time / `cp` of the same file (target <= 4), and max RSS
    against 2 x the largest tensor + 300 MB (target <= 1);
  * .bin -> .pdparams: time of torch.load + transpose + paddle.save / ours (target >= 5),
    and max RSS against the checkpoint's size + 300 MB (target < 1).
Max RSS is what /usr/bin/time -v reports.

    python scripts/bench_convert.py [--workdir DIR] [--keep]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

MB = 1 << 20
LAYERS, HIDDEN, FFN, VOCAB, POS = 24, 1024, 4096, 30522, 512


def bert_large_shapes():
    yield "bert.embeddings.word_embeddings.weight", (VOCAB, HIDDEN)
    yield "bert.embeddings.position_embeddings.weight", (POS, HIDDEN)
    yield "bert.embeddings.token_type_embeddings.weight", (2, HIDDEN)
    yield "bert.embeddings.LayerNorm.weight", (HIDDEN,)
    yield "bert.embeddings.LayerNorm.bias", (HIDDEN,)
    for i in range(LAYERS):
        p = f"bert.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            yield p + name + ".weight", (HIDDEN, HIDDEN)
            yield p + name + ".bias", (HIDDEN,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            yield p + name + ".weight", (HIDDEN,)
            yield p + name + ".bias", (HIDDEN,)
        yield p + "intermediate.dense.weight", (FFN, HIDDEN)
        yield p + "intermediate.dense.bias", (FFN,)
        yield p + "output.dense.weight", (HIDDEN, FFN)
        yield p + "output.dense.bias", (HIDDEN,)
    yield "bert.pooler.dense.weight", (HIDDEN, HIDDEN)
    yield "bert.pooler.dense.bias", (HIDDEN,)


def make_checkpoints(workdir):
    import torch
    from safetensors.torch import save_file
    rng = np.random.default_rng(0)
    state = {name: torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)) for name, shape in bert_large_shapes()}
    st, bn = os.path.join(workdir, "bert-large.safetensors"), os.path.join(workdir, "bert-large.bin")
    save_file(state, st)
    torch.save(state, bn)
    largest = max(t.numel() * 4 for t in state.values())
    return st, bn, largest


def timed(cmd, env=None):
    """(wall seconds, max RSS bytes) of a command run under /usr/bin/time -v."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) * 1024
    return wall, rss


BASELINE = """
import sys, warnings
warnings.simplefilter("ignore")
import torch, paddle
state = torch.load(sys.argv[1], weights_only=True)
out = {}
for k, v in state.items():
    a = v.numpy()
    out[k] = a.T.copy() if a.ndim == 2 and "embeddings" not in k else a
paddle.save(out, sys.argv[2])
"""


def fresh(path):
    if os.path.exists(path):
        os.remove(path)


def best_of(n, fn, *remove):
    """Fastest wall time and largest max RSS of n runs, each into a fresh output file."""
    runs = []
    for _ in range(n):
        for path in remove:
            fresh(path)
        runs.append(fn())
    return min(r[0] for r in runs), max(r[1] for r in runs)


def paired(n, first, second, remove):
    """Runs `first` and `second` alternately n times (so that drift on a noisy machine hits
    both alike): each one's fastest time and largest max RSS, and the median of the per-pair
    time ratios second/first."""
    a, b = [], []
    for _ in range(n):
        for run, into in ((first, a), (second, b)):
            for path in remove:
                fresh(path)
            into.append(run())
    ratios = sorted(y[0] / x[0] for x, y in zip(a, b))
    return (min(r[0] for r in a), max(r[1] for r in a)), (min(r[0] for r in b), max(r[1] for r in b)), \
        ratios[len(ratios) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-convert-")
    os.makedirs(workdir, exist_ok=True)
    try:
        st, bn, largest = make_checkpoints(workdir)
        size = os.path.getsize(st)
        out = os.path.join(workdir, "out.pdparams")
        conv = shutil.which("convert-weights") or sys.exit("convert-weights is not installed (pip install -e .)")
        print(f"checkpoint: {size / MB:.0f} MiB safetensors, {os.path.getsize(bn) / MB:.0f} MiB .bin; "
              f"largest tensor {largest / MB:.0f} MiB")

        copy = os.path.join(workdir, "copy")
        (cp_time, _), (t_st, rss_st), median = paired(
            args.repeat, lambda: timed(["cp", st, copy]),
            lambda: timed([conv, st, out, "--mapping", "bert", "--quiet"]), (copy, out))
        rss_target = 2 * largest + 300 * MB
        print(f"safetensors -> pdparams: {t_st:.2f} s, cp {cp_time:.2f} s (best of {args.repeat}, run alternately): "
              f"ratio {t_st / cp_time:.2f}, median of paired ratios {median:.2f} (target <= 4); "
              f"max RSS {rss_st / MB:.0f} MiB vs 2 x largest + 300 MiB = {rss_target / MB:.0f} MiB: "
              f"ratio {rss_st / rss_target:.2f} (target <= 1)")

        t_base, rss_base = timed([sys.executable, "-c", BASELINE, bn, os.path.join(workdir, "base.pdparams")])
        t_bin, rss_bin = best_of(args.repeat, lambda: timed([conv, bn, out, "--mapping", "bert", "--quiet"]), out)
        bin_target = os.path.getsize(bn) + 300 * MB
        print(f".bin -> pdparams: {t_bin:.2f} s; torch.load + transpose + paddle.save {t_base:.2f} s "
              f"(max RSS {rss_base / MB:.0f} MiB): speed-up {t_base / t_bin:.1f}x (target >= 5); "
              f"max RSS {rss_bin / MB:.0f} MiB vs checkpoint + 300 MiB = {bin_target / MB:.0f} MiB: "
              f"ratio {rss_bin / bin_target:.2f} (target < 1)")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
