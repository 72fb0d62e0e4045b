"""Coverage-guided fuzzing of every reader with atheris (libFuzzer for Python), for a fixed time.

Each target takes the fuzzer's bytes as one input file and reads it the way convert-weights does,
touching every tensor's bytes. A reader may accept the input or refuse it with a UserError (exit 2
at the command line); any other exception, a crash, a hang past --timeout seconds or memory past
--rss-mb is a finding, and libFuzzer writes the input that caused it to --findings (by default
fuzz-findings/ in the system's temporary directory), named after the target.

    python scripts/fuzz_readers.py TARGET [--seconds 60] [--timeout 10] [--rss-mb 2048]
    python scripts/fuzz_readers.py all --seconds 30      # each target in turn, in its own process
    python scripts/fuzz_readers.py --make-corpus          # rewrite scripts/fuzz_corpus/ (needs torch, paddle)

Targets: torch_zip (the torch-free zip reader and its unpickler), safetensors, pdparams (the
.pdparams reader and its unpickler), index (a sharded index next to two shards), rules (a rule
file planned against a small checkpoint). The seed corpus for TARGET is scripts/fuzz_corpus/TARGET/;
new inputs the fuzzer finds go to a scratch copy, never into the repository.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "fuzz_corpus")
sys.path.insert(0, ROOT)

_SCRATCH: list[str] = []
CHILD = "FUZZ_READERS_SCRATCH"  # set in the child process that runs libFuzzer: its scratch folder


def scratch() -> str:
    """A temporary folder for this process's inputs, removed when it exits."""
    if not _SCRATCH:
        import atexit
        _SCRATCH.append(tempfile.mkdtemp(prefix="fuzz-readers-"))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


def _write(name: str, data: bytes) -> str:
    path = os.path.join(scratch(), name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _touch_all(source) -> int:
    """Read every tensor's bytes, as a conversion would."""
    import numpy as np
    total = 0
    for name in list(source.infos):
        total += int(np.ascontiguousarray(source.read(name)).view(np.uint8).sum(dtype=np.uint64))
    return total


def target_torch_zip(data: bytes) -> None:
    from converter.errors import UserError
    from converter.io.torch_io import unwrap_state
    from converter.io.torch_zip import NotPlain, TorchZipSource
    path = _write("m.bin", data)
    try:
        source = TorchZipSource(path, unwrap_state)
        _touch_all(source)
    except (UserError, NotPlain):
        pass


def target_safetensors(data: bytes) -> None:
    from converter.errors import UserError
    from converter.io.safetensors_io import SafetensorsSource
    path = _write("m.safetensors", data)
    try:
        with SafetensorsSource(path) as source:
            _touch_all(source)
    except UserError:
        pass


def target_pdparams(data: bytes) -> None:
    import numpy as np
    from converter.errors import UserError
    from converter.io.pdparams import load_pdparams
    path = _write("m.pdparams", data)
    try:
        for array in load_pdparams(path).values():
            assert array.dtype.kind in "fiub", array.dtype  # plain numbers only, never objects
            np.ascontiguousarray(array).view(np.uint8).sum()
    except UserError:
        pass


def _shards() -> str:
    directory = os.path.join(scratch(), "ckpt")
    if not os.path.isdir(directory):
        import numpy as np
        from safetensors.numpy import save_file
        os.makedirs(directory)
        save_file({"a": np.arange(3, dtype=np.float32), "b": np.ones(2, np.int64)}, os.path.join(directory, "s1.safetensors"))
        save_file({"c": np.zeros(2, np.float16)}, os.path.join(directory, "s2.safetensors"))
        save_file({"z": np.zeros(1, np.float32)}, os.path.join(scratch(), "outside.safetensors"))
    return directory


def target_index(data: bytes) -> None:
    from converter.errors import UserError
    from converter.io.open import open_source
    index = os.path.join(_shards(), "model.safetensors.index.json")
    with open(index, "wb") as f:
        f.write(data)
    try:
        with open_source(index) as source:
            _touch_all(source)
            for path in source.files:  # nothing outside the index's directory without the flag
                assert os.path.realpath(path).startswith(os.path.realpath(_shards())), path
    except UserError:
        pass


def target_rules(data: bytes) -> None:
    import json
    from converter.errors import UserError
    from converter.io.base import TensorInfo
    from converter.rules.plan import build_plan
    from converter.rules.ruleset import parse_ruleset
    infos = {name: TensorInfo(name, dtype, shape) for name, dtype, shape in (
        ("enc.layer.0.w", "float32", (2, 6)), ("enc.layer.1.w", "float32", (2, 6)), ("fc.b", "float16", (4,)),
        ("a" * 35, "int64", (1,)))}
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return
    try:
        build_plan(infos, parse_ruleset(body, "fuzz.json"))
    except UserError:
        pass


TARGETS = {name[len("target_"):]: func for name, func in globals().items() if name.startswith("target_")}


def make_corpus() -> None:
    """Small valid seeds for every target (a few KB in all)."""
    import json
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    seeds = {name: [] for name in TARGETS}
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16),
             "t": torch.arange(4, dtype=torch.int64).reshape(2, 2).t()}
    with tempfile.TemporaryDirectory() as d:
        torch.save(state, os.path.join(d, "m.pt"))
        seeds["torch_zip"].append(open(os.path.join(d, "m.pt"), "rb").read())
        save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "e": np.zeros((0, 2), np.int8)},
                  os.path.join(d, "m.safetensors"), metadata={"format": "pt"})
        seeds["safetensors"].append(open(os.path.join(d, "m.safetensors"), "rb").read())
        import paddle
        layer = paddle.nn.Linear(2, 2)
        for protocol in (2, 4):
            paddle.save(layer.state_dict(), os.path.join(d, "p.pdparams"), protocol=protocol)
            seeds["pdparams"].append(open(os.path.join(d, "p.pdparams"), "rb").read())
    seeds["index"].append(json.dumps({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors",
                                                                     "c": "s2.safetensors"}}).encode())
    seeds["rules"].append(json.dumps({"name": "seed", "rules": [
        {"kind": "rename", "match": r"enc\.layer\.(?P<i>\d+)\.w", "to": r"layers.\g<i>.weight"},
        {"kind": "transpose", "match": r"enc\.layer\.1\.w"}, {"kind": "cast", "key": "fc.b", "dtype": "float32"},
        {"kind": "rename", "key": "fc.b", "to": "fc.bias"}, {"kind": "drop", "match": "a+"}]}).encode())
    seeds["rules"].append(json.dumps({"name": "seed2", "rules": [
        {"kind": "merge", "match": [r"enc\.layer\.0\.w", r"enc\.layer\.1\.w"], "to": "both", "axis": 0},
        {"kind": "split", "key": "fc.b", "to": ["x", "y"], "axis": 0, "sizes": [1, 3]},
        {"kind": "reshape", "key": "enc.layer.0.w", "shape": [3, 4]}, {"kind": "drop", "key": "a" * 35}]}).encode())
    for name, items in seeds.items():
        directory = os.path.join(CORPUS, name)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        for i, data in enumerate(items):
            with open(os.path.join(directory, f"seed{i}"), "wb") as f:
                f.write(data)


FINDINGS = os.path.join(tempfile.gettempdir(), "fuzz-findings")


def fuzz(name: str, seconds: int, timeout: int, rss_mb: int, findings: str = FINDINGS) -> None:
    import atheris
    with atheris.instrument_imports():
        import converter.io.pdparams  # noqa: F401
        import converter.io.safetensors_io  # noqa: F401
        import converter.io.sharded  # noqa: F401
        import converter.io.torch_io  # noqa: F401
        import converter.io.torch_zip  # noqa: F401
        import converter.io.unpickle  # noqa: F401
        import converter.rules.plan  # noqa: F401
        import converter.rules.ruleset  # noqa: F401
    corpus = os.path.join(scratch(), "corpus")
    shutil.copytree(os.path.join(CORPUS, name), corpus)  # found inputs go to the scratch copy
    target = TARGETS[name]
    os.makedirs(findings, exist_ok=True)
    atheris.Setup([sys.argv[0], corpus, f"-max_total_time={seconds}", f"-timeout={timeout}",
                   f"-rss_limit_mb={rss_mb}", f"-artifact_prefix={os.path.join(findings, name)}-",
                   "-print_final_stats=1"], target)
    atheris.Fuzz()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", choices=sorted(TARGETS) + ["all"])
    parser.add_argument("--seconds", type=int, default=60, help="how long to fuzz each target")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-mb", type=int, default=2048, help="memory one run may hold")
    parser.add_argument("--findings", default=FINDINGS, help="where inputs that fail are written")
    parser.add_argument("--make-corpus", action="store_true", help="rewrite the seed corpus")
    args = parser.parse_args()
    if args.make_corpus:
        make_corpus()
        return 0
    if args.target is None:
        parser.error("give a target, or all")
    if os.environ.get(CHILD):  # the process libFuzzer runs in (and ends, bypassing Python's exit)
        _SCRATCH.append(os.environ[CHILD])
        fuzz(args.target, args.seconds, args.timeout, args.rss_mb, args.findings)
        return 0
    failed = []
    for name in sorted(TARGETS) if args.target == "all" else [args.target]:
        with tempfile.TemporaryDirectory(prefix="fuzz-readers-") as folder:  # removed whatever the child did
            code = subprocess.call([sys.executable, __file__, name, f"--seconds={args.seconds}",
                                    f"--timeout={args.timeout}", f"--rss-mb={args.rss_mb}",
                                    f"--findings={args.findings}"], env=dict(os.environ, **{CHILD: folder}))
        print(f"{name}: {'no finding' if code == 0 else f'FINDING (exit {code}), input in {args.findings}'}", flush=True)
        if code:
            failed.append(name)
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
