"""Every row's budget and ratio, to the last digit (repr), for a few verify-port pairs: forward
(fp32, TF32 and bf16 emulated, full and binary strategies, paddle's own error inside a layer, a
bf16 Llama's drift) and training. A change that should leave the budgets as they are leaves this
file's digest as it is:

    python scripts/budget_digest.py OUT [CASE ...] && md5sum OUT
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in ("tests", "tests/specs", "tests/unit/verify", "scripts"):
    sys.path.insert(0, os.path.join(ROOT, p))

import numpy as np  # noqa: E402

from converter.api import PortSpec, VerifyOptions, verify_port  # noqa: E402
from converter.spec import spec_from_functions  # noqa: E402

S = os.path.join(ROOT, "tests", "specs")
BERT = os.path.join(ROOT, "converter", "examples", "bert_port.py")


def inside(mode):
    import test_verify_paddle_own_inside as m
    inputs = lambda: (np.random.default_rng(0).standard_normal((2, m.T, m.D)).astype("float32"),)
    return spec_from_functions(m.torch_model, lambda: m.PaddleNet(mode), inputs)


def drift():
    from helpers.wide_llama import L, bf16_valued
    L.resize(hidden=1024, layers=2, ffn=1024, heads=8, seq=32)
    return spec_from_functions(bf16_valued, L.paddle_model, L.inputs)


CASES = [
    ("seed fp32", lambda: PortSpec.from_file(os.path.join(S, "seed_report.py")), dict()),
    ("seed paddle=tf32", lambda: PortSpec.from_file(os.path.join(S, "seed_report.py")), dict(emulate={"paddle": "tf32"})),
    ("seed torch=bf16", lambda: PortSpec.from_file(os.path.join(S, "seed_report.py")), dict(emulate={"torch": "bf16"})),
    ("bert full", lambda: PortSpec.from_file(BERT), dict(bisect=True, strategy="full")),
    ("bert binary", lambda: PortSpec.from_file(BERT), dict(bisect=True, strategy="binary")),
    ("transformer_encoder", lambda: PortSpec.from_file(os.path.join(S, "transformer_encoder.py")), dict()),
    ("transformer_encoder tf32", lambda: PortSpec.from_file(os.path.join(S, "transformer_encoder.py")),
     dict(emulate={"paddle": "tf32"})),
    ("cnn", lambda: PortSpec.from_file(os.path.join(S, "cnn.py")), dict()),
    ("lstm", lambda: PortSpec.from_file(os.path.join(S, "lstm.py")), dict(strategy="binary")),
    ("inside shifted", lambda: inside("shifted"), dict(strategy="full")),
    ("inside unscaled", lambda: inside("unscaled"), dict(strategy="full", bisect=True)),
    ("llama drift", drift, dict(strategy="full")),
    ("train_mlp", lambda: PortSpec.from_file(os.path.join(S, "train_mlp.py")), dict(train=True, steps=3)),
]


def show(name, report, out):
    out.write(f"== {name}: {report.verdict}\n")
    fw = report.forward
    for r in fw.layers:
        out.write(f"  {r.torch!r} ~ {r.paddle!r}: budget={r.budget!r} ratio={r.ratio!r} local={r.local_max_abs!r}\n")
    o = fw.outputs
    if o is not None:
        out.write(f"  <outputs>: budget={o.budget!r} ratio={o.ratio!r} max_abs={o.max_abs!r} note={o.note!r}\n")
    if report.train is not None:
        for r in report.train.rows:
            out.write(f"  train {r.phase} {r.step} {r.torch}: budget={r.budget!r} ratio={r.ratio!r}\n")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/budget_digest.py OUT [CASE ...] (cases: " + ", ".join(c[0] for c in CASES) + ")")
    only = sys.argv[2:]
    with open(sys.argv[1], "w") as out:
        for name, spec, opts in CASES:
            if only and name not in only:
                continue
            report = verify_port(spec(), VerifyOptions(device="cpu", **opts))
            show(name, report, out)
            out.flush()


if __name__ == "__main__":
    main()
