"""The layer-family registry (converter/families/): one entry per family, holding its weight
rules, its matmul products, its pairing kind, its epsilon and its what-ifs."""

import numpy as np
import paddle
import pytest
import torch


def test_every_family_names_real_classes_on_both_sides():
    from converter.families import REGISTRY
    for torch_type, family in REGISTRY.items():
        # HF transformers' own classes (hf- families) are checked where transformers is installed
        # (tests/real_models/test_real_models.py)
        assert hasattr(torch.nn, torch_type) or family.name.startswith("hf-"), (family.name, torch_type)
        for paddle_type in family.paddle_types:
            assert hasattr(paddle.nn, paddle_type), (family.name, paddle_type)


def test_a_torch_type_is_registered_once():
    from converter.families import Family, register
    with pytest.raises(ValueError, match="registered twice"):
        register(Family("another-linear", ("Linear",), ("Linear",)))


def test_pairing_kind_comes_from_the_family():
    from converter.families import kind_of
    assert kind_of("ReLU6") == kind_of("Hardswish") == kind_of("Silu") == "activation"
    assert kind_of("Dropout2d") == kind_of("Dropout") == "dropout"
    assert kind_of("MyBlock") == "myblock"  # no family: its own kind


class _TorchBilinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bilinear = torch.nn.Bilinear(6, 5, 4)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))  # no family covers this module

    def forward(self, a, b):
        return torch.nn.functional.linear(self.bilinear(a, b), torch.diag(self.scale))


class _PaddleBilinear(paddle.nn.Layer):
    def __init__(self, scale_bug=False):
        super().__init__()
        self.bilinear = paddle.nn.Bilinear(6, 5, 4)
        self.scale = self.create_parameter([4])
        self.scale_bug = scale_bug

    def forward(self, a, b):
        y = self.bilinear(a, b) * self.scale
        return y * 1.001 if self.scale_bug else y


def _verify(bug=False):
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal((3, 6)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32))

    def torch_model():
        torch.manual_seed(0)
        return _TorchBilinear()
    return verify(spec_from_functions(torch_model, lambda: _PaddleBilinear(bug), lambda: inputs), Options(device="cpu"),
                  bisect=True)


def test_bilinear_and_an_uncovered_module_are_verified():
    report = _verify()
    assert report.verdict == "pass", [(r.torch, r.ratio, r.note) for r in report.layers]
    rows = {r.torch: r for r in report.layers}
    assert rows["bilinear"].ratio is not None and rows[""].ratio is not None
    bug = _verify(bug=True)
    assert bug.verdict == "fail" and bug.first_bad.torch == ""


def test_bilinear_products_match_float64():
    from converter.compare.capture import Call
    from converter.compare.replay import matmul_stats
    m = torch.nn.Bilinear(6, 5, 4)
    a, b = torch.randn(3, 6), torch.randn(3, 5)
    stats = matmul_stats(m, Call("", "Bilinear", 0, args=(a, b)), square_dtype=torch.float32)
    want = torch.einsum("ni,oij,nj->no", a.double() ** 2, m.weight.detach().double() ** 2, b.double() ** 2)
    assert stats.k == 30 and np.allclose(stats.sum_sq, want.numpy(), rtol=1e-5)
