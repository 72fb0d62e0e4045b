"""Real GPU arithmetic against the budgets the verifier gives for it (torch only; needs CUDA).

The verifier never runs TF32 or bf16 on a CPU: it derives what those formats may cost from the
arithmetic model in converter/compare/budget.py, and emulates them by rounding the inputs and
weights of matmul layers. This script checks both against real tensor-core arithmetic:

* forward: for matmul layers with real-model shapes (DeBERTa-v2-xlarge's 1536x1536 query_proj,
  its 1536x6144 intermediate and back, a 3x3 convolution), the worst-element ratio of the real
  TF32 / bf16 error to the budget a TF32 / bf16 side gets (must be <= 1), the ratio of the
  same error to the budget of an fp32 side (> 1: the format is visible, not hidden in the
  noise), the rms of emulated over real error (the emulation's fidelity, near 1), and GPU fp32
  against CPU fp32 under the fp32 budget (another kernel's summation order, <= 1);
* training: an MLP trained N steps with AdamW in float64, fp32, real TF32 and emulated TF32;
  the largest |loss(real TF32) - loss(fp32)| over the loss band the --train check derives
  from the emulated run (must be <= 1).

    python scripts/gpu_budget_check.py [--steps 20]

Prints one table; exits 1 when a check fails, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import copy
import sys
from types import SimpleNamespace

import numpy as np


def _flags(tf32: bool) -> None:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def _forward_cases():
    import torch
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    yield "Linear 1536->1536 (query_proj)", torch.nn.Linear(1536, 1536), rand(8, 128, 1536)
    yield "Linear 1536->6144", torch.nn.Linear(1536, 6144), rand(8, 128, 1536)
    yield "Linear 6144->1536", torch.nn.Linear(6144, 1536), rand(8, 128, 6144)
    yield "Conv2d 256->256 3x3", torch.nn.Conv2d(256, 256, 3, padding=1), rand(8, 256, 28, 28)


def _stats(module, x):
    """(S2, K) of the layer in float64, as the verifier's family entry computes them."""
    import torch

    from converter.families import lookup
    from converter.compare.budget import MatmulStats
    m64 = copy.deepcopy(module).double()
    with torch.no_grad():
        s2, k = lookup(module).products(m64, (x.double(),), m64.weight.double() ** 2, lambda t: t * t)
    return MatmulStats(s2.cpu().numpy(), float(k))


def _run(module, x, fmt: str | None = None, emulate: str | None = None):
    import torch

    from converter.compare.precision import round_torch
    m = copy.deepcopy(module)
    with torch.no_grad():
        if emulate:
            m.weight.copy_(round_torch(m.weight, emulate))
            x = round_torch(x, emulate)
        if fmt == "bf16":
            return m.bfloat16()(x.bfloat16()).float().cpu().numpy()
        return m(x).cpu().numpy()


def forward_rows(device: str) -> list[tuple]:
    import torch

    from converter.compare.budget import make_budget
    rows = []
    for name, module, x in _forward_cases():
        stats = _stats(module, x)
        y64 = _run(copy.deepcopy(module).double(), x.double()).astype(np.float64)
        y32_cpu = _run(module, x)
        m, xd = module.to(device), x.to(device)
        _flags(False)
        y32 = _run(m, xd)
        emulated = {f: _run(m, xd, emulate=f) for f in ("tf32", "bf16")}
        _flags(True)
        real = {"tf32": _run(m, xd), "bf16": _run(m, xd, fmt="bf16")}
        _flags(False)
        fp32_budget = make_budget({"torch": "fp32", "paddle": "fp32"}, y32, y64, stats)
        for fmt in ("tf32", "bf16"):
            diff = np.abs(real[fmt] - y32)
            ratio, _ = make_budget({"torch": "fp32", "paddle": fmt}, y32, y64, stats).ratio(diff)
            as_fp32, _ = fp32_budget.ratio(diff)
            fidelity = _rms(emulated[fmt] - y64) / _rms(real[fmt] - y64)
            rows.append((name, fmt, ratio, as_fp32, fidelity))
        cpu_ratio, _ = fp32_budget.ratio(np.abs(y32 - y32_cpu))
        rows.append((name, "fp32 gpu vs cpu", cpu_ratio, cpu_ratio, float("nan")))
        del m, xd
        torch.cuda.empty_cache()
    return rows


def _rms(a) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(a, dtype=np.float64)))))


def _train(device: str, dtype, steps: int, tf32: bool = False, emulate: str | None = None) -> list[float]:
    import torch

    from converter.compare.precision import emulate_torch_training, remove
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048),
                                torch.nn.GELU(), torch.nn.Linear(2048, 10))
    model = model.to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(256, 1024, generator=g), torch.randint(0, 10, (256,), generator=g)) for _ in range(steps)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    handles = emulate_torch_training(model, emulate)  # as --train emulates a format: straight through
    _flags(tf32)
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x.to(device=device, dtype=dtype)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    _flags(False)
    remove(handles)
    return losses


def train_row(device: str, steps: int) -> tuple:
    import torch

    from converter.train.steps import loss_band
    t64 = SimpleNamespace(losses=_train(device, torch.float64, steps))
    t32 = SimpleNamespace(losses=_train(device, torch.float32, steps))
    emulated = SimpleNamespace(losses=_train(device, torch.float32, steps, emulate="tf32"))
    real = _train(device, torch.float32, steps, tf32=True)
    band = loss_band(t32, t64, emulated)
    ratios = [abs(r - a) / b for r, a, b in zip(real, t32.losses, band)]
    drift_real = max(abs(r - b) for r, b in zip(real, t64.losses))
    drift_emulated = max(abs(r - b) for r, b in zip(emulated.losses, t64.losses))
    return max(ratios), int(np.argmax(ratios)), drift_emulated / drift_real if drift_real else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    failed = False
    print(f"{'layer':32} {'format':16} {'ratio':>7} {'as fp32':>8} {'emul/real':>10}")
    for name, fmt, ratio, as_fp32, fidelity in forward_rows("cuda"):
        visible = as_fp32 > 1 if fmt in ("tf32", "bf16") else True
        ok = ratio <= 1 and visible
        failed |= not ok
        print(f"{name:32} {fmt:16} {ratio:7.3f} {as_fp32:8.3f} {fidelity:10.3f}  {'ok' if ok else 'FAIL'}")
    worst, at, fidelity = train_row("cuda", args.steps)
    ok = worst <= 1
    failed |= not ok
    print(f"MLP AdamW {args.steps} steps: |loss(real TF32) - loss(fp32)| / band: max {worst:.3f} at step {at}; "
          f"drift from float64, emulated over real TF32: {fidelity:.3f}  {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
