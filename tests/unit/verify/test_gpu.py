"""Checks that need a CUDA GPU; skipped where torch sees none (this project's CI machines).

Real TF32 on tensor cores against the TF32 budget: a 1536x1536 Linear (the seed report's
query_proj) run with TF32 on must stay within the budget the model gives for a TF32 side,
and exceed the fp32 one; the recorded precision must say TF32."""

import copy

import numpy as np
import pytest
import torch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_real_tf32_stays_within_the_tf32_budget_and_exceeds_fp32():
    from converter.compare.budget import MatmulStats, make_budget
    from converter.compare.precision import torch_precision
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("TF32 needs compute capability 8.0")
    torch.manual_seed(0)
    layer = torch.nn.Linear(1536, 1536).cuda()
    x = torch.randn(4, 32, 1536, device="cuda")
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert torch_precision("cuda").format == "tf32"
        with torch.no_grad():
            y_tf32 = layer(x).cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.no_grad():
            y32 = layer(x).cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    with torch.no_grad():
        y64 = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double()).cpu().numpy()
        s2 = torch.nn.functional.linear(x.double() ** 2, layer.weight.double() ** 2).cpu().numpy()
    stats = MatmulStats(s2, 1536)
    diff = np.abs(y_tf32 - y32)
    tf32_ratio, _ = make_budget({"torch": "fp32", "paddle": "tf32"}, y32, y64, stats).ratio(diff)
    fp32_ratio, _ = make_budget({"torch": "fp32", "paddle": "fp32"}, y32, y64, stats).ratio(diff)
    print(f"\nreal TF32 against fp32: max {diff.max():.3g}, TF32 budget ratio {tf32_ratio:.3g}, fp32 ratio {fp32_ratio:.3g}")
    assert tf32_ratio <= 1.0 < fp32_ratio


@cuda
def test_real_bf16_convolution_stays_within_the_bf16_budget():
    """cuDNN's bf16 convolution returns bf16: the budget of a bf16 side counts that rounding
    of the result (without it the ratio was 1.08 on an H200)."""
    from converter.families import lookup
    from converter.compare.budget import MatmulStats, make_budget
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda()
    x = torch.randn(8, 256, 28, 28, device="cuda")
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False  # its default is on: fp32 convolutions in TF32
        with torch.no_grad():
            y32 = conv(x).cpu().numpy()
    finally:
        torch.backends.cudnn.allow_tf32 = before
    with torch.no_grad():
        y_bf16 = copy.deepcopy(conv).bfloat16()(x.bfloat16()).float().cpu().numpy()
        c64 = copy.deepcopy(conv).double()
        y64 = c64(x.double()).cpu().numpy()
        s2, k = lookup(conv).products(c64, (x.double(),), c64.weight ** 2, lambda t: t * t)
    diff = np.abs(y_bf16 - y32)
    stats = MatmulStats(s2.cpu().numpy(), float(k))
    ratio, _ = make_budget({"torch": "fp32", "paddle": "bf16"}, y32, y64, stats).ratio(diff)
    fp32_ratio, _ = make_budget({"torch": "fp32", "paddle": "fp32"}, y32, y64, stats).ratio(diff)
    print(f"\nreal bf16 convolution: bf16 budget ratio {ratio:.3g}, fp32 ratio {fp32_ratio:.3g}")
    assert ratio <= 1.0 < fp32_ratio
