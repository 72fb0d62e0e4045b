"""Benchmark convert-weights on a checkpoint with BERT-large shapes (24 layers, hidden 1024,
about 1.34 GB fp32), stored as safetensors and as a torch .bin.

Every figure is measured in this run, on this machine, and printed as a ratio against a
baseline from the same run (these machines are noisy): each case runs its baseline and the
conversion alternately, `--repeat` times, and prints every round, the medians, and the median
of the per-round ratios:
  * safetensors -> .pdparams, .bin -> .pdparams, sharded safetensors (2 shards and their index)
    -> .pdparams, and an HF directory (config.json, model.safetensors) -> a PaddleNLP directory:
    time / `cp` (`cp -r` for the directories) of the same source (target: safetensors <= 1.3),
    and max RSS against 2 x the largest tensor + 300 MB (target <= 1);
  * .bin -> .pdparams also against torch.load + transpose + paddle.save, run once (target >= 5).
Max RSS is what /usr/bin/time -v reports.

    python scripts/bench_convert.py [--workdir DIR] [--keep] [--repeat N] [--cases st,bin,sharded,hfdir,floor]

The `floor` case (not run by default) times the least a conversion that changes bytes costs:
the safetensors file's bytes read through a map and written, nothing else, against `cp`.

With --llama-sharded it runs, instead, an HF model directory with Llama shapes (hidden 4096,
intermediate 11008, vocab 32000, 15 layers: 6.6 GB of bf16 in 2 GB safetensors shards with an
index, which needs about 20 GB of disk) converted into a sharded PaddleNLP directory, against
`cp -r` of the same directory, with the same targets (time <= 4 x cp; max RSS <= 2 x the
largest tensor + 300 MB).
"""

import argparse
import json
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
    sharded = os.path.join(workdir, "bert-large-sharded")
    os.makedirs(sharded)
    names, weight_map = list(state), {}
    for i, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, os.path.join(sharded, file))
        weight_map.update({k: file for k in part})
    index = os.path.join(sharded, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * 4 for t in state.values())}, "weight_map": weight_map}, f)
    hfdir = os.path.join(workdir, "bert-large-hf")
    os.makedirs(hfdir)
    save_file({k[len("bert."):]: t for k, t in state.items()}, os.path.join(hfdir, "model.safetensors"))
    with open(os.path.join(hfdir, "config.json"), "w") as f:
        json.dump({"architectures": ["BertModel"], "model_type": "bert", "hidden_size": HIDDEN,
                   "num_hidden_layers": LAYERS, "num_attention_heads": 16, "intermediate_size": FFN,
                   "vocab_size": VOCAB, "max_position_embeddings": POS, "type_vocab_size": 2,
                   "layer_norm_eps": 1e-12, "hidden_act": "gelu"}, f)
    return st, bn, largest, sharded, index, hfdir


def convert_command():
    """This Python's convert-weights console script (a version manager's shim found first in PATH
    would add its own start-up to every timed run; `cp` has none)."""
    script = os.path.join(os.path.dirname(sys.executable), "convert-weights")
    found = script if os.path.exists(script) else shutil.which("convert-weights")
    return found or sys.exit("convert-weights is not installed (pip install -e .)")


def compile_package():
    """Byte-compile the converter package, as a regular `pip install` does. An editable install
    run with PYTHONDONTWRITEBYTECODE set (as on this machine) would otherwise compile every module
    from source on every timed run, about 0.04 s that no installed copy pays."""
    import compileall
    import converter
    compileall.compile_dir(os.path.dirname(converter.__file__), quiet=1)


def timed(cmd, env=None):
    """(wall seconds, max RSS bytes, CPU seconds: user + system) of a command run under /usr/bin/time -v."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) * 1024
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", p.stderr).group(1)) for kind in ("User", "System"))
    return wall, rss, cpu


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


# The least any conversion that changes bytes can cost on this machine: every byte of the source
# read through a memory map and pwritten in 16 MiB pieces, with no transpose, no pickle, no
# check and no fsync. A plan that transposes most tensors must pass that much through the
# process; where this alone is over the safetensors target, so is any conversion.
FLOOR = """
import os, sys
import numpy as np
source = np.memmap(sys.argv[1], dtype=np.uint8, mode="r")
out = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for at in range(0, len(source), 16 << 20):
    os.pwrite(out, memoryview(source[at:at + (16 << 20)]), at)
os.close(out)
"""


def fresh(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def best_of(n, fn, *remove):
    """Fastest wall time, largest max RSS and median CPU time of n runs, each into a fresh output file."""
    runs = []
    for _ in range(n):
        for path in remove:
            fresh(path)
        runs.append(fn())
    return min(r[0] for r in runs), max(r[1] for r in runs), median(r[2] for r in runs)


def median(values):
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def paired(n, first, second, remove):
    """Runs `first` (the baseline) and `second` alternately n times, so that drift on a noisy
    machine hits both alike; (baseline runs, conversion runs), each a list of (seconds, max RSS)."""
    a, b = [], []
    for _ in range(n):
        for run, into in ((first, a), (second, b)):
            for path in remove:
                fresh(path)
            into.append(run())
    for path in remove:
        fresh(path)
    return a, b


def report(label, baseline, a, b, largest, target):
    """One case's rounds, medians and ratios, and its max RSS against 2 x largest + 300 MiB."""
    rounds = ", ".join(f"{y[0]:.2f}/{x[0]:.2f}" for x, y in zip(a, b))
    ratios = [y[0] / x[0] for x, y in zip(a, b)]
    t_base, t_conv = median(r[0] for r in a), median(r[0] for r in b)
    cpu_base, cpu_conv = median(r[2] for r in a), median(r[2] for r in b)
    rss, rss_target = max(r[1] for r in b), 2 * largest + 300 * MB
    print(f"{label}: median {t_conv:.2f} s, {baseline} median {t_base:.2f} s (rounds conversion/{baseline}: {rounds}): "
          f"ratio of medians {t_conv / t_base:.2f}, median of paired ratios {median(ratios):.2f} (target <= {target}); "
          f"CPU (user + system) median {cpu_conv:.2f} s, {baseline} {cpu_base:.2f} s; "
          f"max RSS {rss / MB:.0f} MiB vs 2 x largest + 300 MiB = {rss_target / MB:.0f} MiB: "
          f"ratio {rss / rss_target:.2f} (target <= 1)", flush=True)


LLAMA = dict(hidden=4096, ffn=11008, vocab=32000, layers=15, heads=32)
SHARD = 2 * 10**9


def llama_shapes():
    h, f = LLAMA["hidden"], LLAMA["ffn"]
    yield "model.embed_tokens.weight", (LLAMA["vocab"], h)
    for i in range(LLAMA["layers"]):
        p = f"model.layers.{i}."
        for x in "qkvo":
            yield f"{p}self_attn.{x}_proj.weight", (h, h)
        yield p + "mlp.gate_proj.weight", (f, h)
        yield p + "mlp.up_proj.weight", (f, h)
        yield p + "mlp.down_proj.weight", (h, f)
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (LLAMA["vocab"], h)


def write_bf16_safetensors(path, shapes, rng):
    """A safetensors file of random finite bf16 tensors, written one tensor at a time."""
    import json
    import struct
    header, offset = {}, 0
    for name, shape in shapes:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, shape in shapes:  # exponent bit 7 cleared: |x| < 2, never inf or nan
            f.write((rng.integers(0, 1 << 16, size=shape, dtype=np.uint16) & 0xBFFF).tobytes())


def make_llama_directory(workdir):
    """An HF Llama directory as save_pretrained writes a sharded one; (path, bytes, largest tensor)."""
    import json
    rng = np.random.default_rng(0)
    directory = os.path.join(workdir, "llama-hf")
    os.makedirs(directory, exist_ok=True)
    shards, size = [[]], 0
    for name, shape in llama_shapes():
        nbytes = 2 * int(np.prod(shape))
        if shards[-1] and size + nbytes > SHARD:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map = {}
    for i, shapes in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_bf16_safetensors(os.path.join(directory, file), shapes, rng)
        weight_map.update({name: file for name, _ in shapes})
    total = sum(2 * int(np.prod(s)) for _, s in llama_shapes())
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": LLAMA["hidden"],
              "intermediate_size": LLAMA["ffn"], "num_hidden_layers": LLAMA["layers"],
              "num_attention_heads": LLAMA["heads"], "num_key_value_heads": LLAMA["heads"], "vocab_size": LLAMA["vocab"],
              "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    largest = max(2 * int(np.prod(s)) for _, s in llama_shapes())
    return directory, total, largest, len(shards)


def bench_llama_sharded(workdir, repeat, conv):
    source, total, largest, count = make_llama_directory(workdir)
    copy, out = os.path.join(workdir, "llama-copy"), os.path.join(workdir, "llama-paddle")

    def clean():
        for d in (copy, out):
            shutil.rmtree(d, ignore_errors=True)
    print(f"checkpoint: HF Llama directory, {total / 1e9:.2f} GB bf16 in {count} safetensors shards; "
          f"largest tensor {largest / MB:.0f} MiB")
    a, b = [], []
    for _ in range(repeat):
        for run, into in ((lambda: timed(["cp", "-r", source, copy]), a),
                          (lambda: timed([conv, source, out, "--quiet"]), b)):
            clean()
            into.append(run())
    shards = sorted(f for f in os.listdir(out) if f.endswith(".pdparams"))
    clean()
    ratios = sorted(y[0] / x[0] for x, y in zip(a, b))
    cp_time, t_conv, rss = min(r[0] for r in a), min(r[0] for r in b), max(r[1] for r in b)
    rss_target = 2 * largest + 300 * MB
    print(f"sharded bf16 Llama directory -> sharded pdparams directory ({len(shards)} shards + index): "
          f"{t_conv:.2f} s, cp -r {cp_time:.2f} s (best of {repeat}, run alternately): ratio {t_conv / cp_time:.2f}, "
          f"median of paired ratios {median(ratios):.2f} (target <= 4); max RSS {rss / MB:.0f} MiB vs "
          f"2 x largest + 300 MiB = {rss_target / MB:.0f} MiB: ratio {rss / rss_target:.2f} (target <= 1)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default="st,bin,sharded,hfdir",
                    help="comma-separated: st, bin, sharded, hfdir, floor (bytes through the process alone)")
    ap.add_argument("--no-naive", action="store_true", help="skip the torch.load + paddle.save baseline")
    ap.add_argument("--llama-sharded", action="store_true",
                    help="run the sharded >= 6 GB bf16 Llama directory case instead (about 20 GB of disk)")
    args = ap.parse_args()
    compile_package()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-convert-")
    os.makedirs(workdir, exist_ok=True)
    if args.llama_sharded:
        conv = convert_command()
        try:
            bench_llama_sharded(workdir, args.repeat, conv)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        return
    cases = args.cases.split(",")
    try:
        st, bn, largest, sharded, index, hfdir = make_checkpoints(workdir)
        out, out_dir = os.path.join(workdir, "out.pdparams"), os.path.join(workdir, "out-dir")
        copy = os.path.join(workdir, "copy")
        conv = convert_command()
        print(f"checkpoint: {os.path.getsize(st) / MB:.0f} MiB safetensors, {os.path.getsize(bn) / MB:.0f} MiB .bin; "
              f"largest tensor {largest / MB:.0f} MiB; load average before: {os.getloadavg()[0]:.1f}", flush=True)
        runs = {"st": ("safetensors -> pdparams", "cp", ["cp", st, copy], [st, out, "--mapping", "bert"], 1.3),
                "bin": (".bin -> pdparams", "cp", ["cp", bn, copy], [bn, out, "--mapping", "bert"], "-"),
                "sharded": ("sharded safetensors (2 shards + index) -> pdparams", "cp -r", ["cp", "-r", sharded, copy],
                            [index, out, "--mapping", "bert"], "-"),
                "hfdir": ("HF directory (config.json + model.safetensors) -> PaddleNLP directory", "cp -r",
                          ["cp", "-r", hfdir, copy], [hfdir, out_dir], "-"),
                "floor": ("floor: the safetensors file's bytes through a map and pwrite, nothing else", "cp",
                          ["cp", st, copy], None, "-")}
        for case in cases:
            label, baseline, cp_cmd, conv_args, target = runs[case]
            command = [sys.executable, "-c", FLOOR, st, out] if conv_args is None else [conv, *conv_args, "--quiet"]
            a, b = paired(args.repeat, lambda c=cp_cmd: timed(c), lambda c=command: timed(c), (copy, out, out_dir))
            report(label, baseline, a, b, largest, target)
        if "bin" in cases and not args.no_naive:
            t_base, rss_base, cpu_base = timed([sys.executable, "-c", BASELINE, bn, os.path.join(workdir, "base.pdparams")])
            fresh(os.path.join(workdir, "base.pdparams"))
            t_bin, _, cpu_bin = best_of(args.repeat, lambda: timed([conv, bn, out, "--mapping", "bert", "--quiet"]), out)
            fresh(out)
            print(f".bin -> pdparams: best {t_bin:.2f} s of {args.repeat}; torch.load + transpose + paddle.save "
                  f"{t_base:.2f} s (max RSS {rss_base / MB:.0f} MiB): speed-up {t_base / t_bin:.1f}x (target >= 5); "
                  f"CPU (user + system) {cpu_bin:.2f} s (median) against {cpu_base:.2f} s: {cpu_base / cpu_bin:.1f}x")
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
