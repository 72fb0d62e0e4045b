"""One emulation for the forward check and training: the training form rounds the same products as
the forward check (an attention's q.k^T too, not only Linear and Conv layers) and passes gradients
straight through, d(round(a) b)/da := round(b), on both frameworks."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.precision import (emulate_paddle, emulate_paddle_training, emulate_torch,
                                         emulate_torch_training, remove, round_array, round_torch)

FORMATS = ("tf32", "bf16", "fp16")


def _torch_pair(fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(6, 9, generator=g), torch.randn(9, 5, generator=g)
    return a, b, round_torch(a, fmt), round_torch(b, fmt)


class _Product(torch.nn.Module):
    """A product at the function level: `a @ b`, F.linear or torch.matmul."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, a, b):
        if self.how == "linear":
            return torch.nn.functional.linear(a, b.T)
        if self.how == "matmul":
            return torch.matmul(a, b)
        return a @ b


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("how", ["@", "linear", "matmul"])
def test_a_torch_gradient_through_an_emulated_product_is_the_products_gradient_on_rounded_inputs(fmt, how):
    a, b, ar, br = _torch_pair(fmt)
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    model = _Product(how)
    a, b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    handles = emulate_torch_training(model, fmt)
    try:
        out = model(a, b)
    finally:
        remove(handles)
    out.backward(g)
    ar, br = ar.requires_grad_(True), br.requires_grad_(True)
    plain = ar @ br
    plain.backward(g)
    assert not torch.equal(ar, a.detach())  # the format rounds these inputs
    assert torch.equal(out.detach(), plain.detach())
    assert torch.equal(a.grad, ar.grad) and torch.equal(b.grad, br.grad)
    assert not torch.equal(a.grad, g @ b.detach().T)  # not the gradient on the unrounded inputs


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_torch_convolution_passes_its_gradient_straight_through(fmt):
    gen = torch.Generator().manual_seed(2)
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 6, 6, generator=gen, requires_grad=True)
    stored = conv.weight.detach().clone()
    handles = emulate_torch_training(conv, fmt)
    try:
        conv(x).sum().backward()
    finally:
        remove(handles)
    xr = round_torch(x.detach(), fmt).requires_grad_(True)
    wr = round_torch(conv.weight.detach(), fmt).requires_grad_(True)
    torch.nn.functional.conv2d(xr, wr, conv.bias.detach()).sum().backward()
    assert torch.equal(x.grad, xr.grad) and torch.equal(conv.weight.grad, wr.grad)
    assert torch.equal(conv.weight.detach(), stored)  # the stored weight is not rounded, as on a GPU
    assert not torch.equal(wr.detach(), stored)


class _Attention(torch.nn.Module):
    """Scores q.k^T computed in the forward itself, no layer around the product."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.k = torch.nn.Linear(8, 8)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        return torch.softmax(scores, -1) @ x


@pytest.mark.parametrize("fmt", FORMATS)
def test_training_rounds_the_products_the_forward_check_rounds(fmt):
    """The forward of a model under the training emulation is bit for bit its forward under the
    forward check's (q.k^T and the product with the values rounded too), and differs from fp32."""
    torch.manual_seed(0)
    model, x = _Attention(), torch.randn(2, 5, 8)
    outs = {}
    for name, emulate in (("forward", emulate_torch), ("training", emulate_torch_training)):
        handles = emulate(model, fmt)
        try:
            outs[name] = model(x).detach()
        finally:
            remove(handles)
    assert torch.equal(outs["forward"], outs["training"])
    assert not torch.equal(outs["training"], model(x).detach())
    assert not model._forward_pre_hooks and not model._forward_hooks  # removed


def test_a_product_inside_one_torch_call_is_rounded_too():
    """nn.MultiheadAttention runs its products inside one functional call: they are rounded as the
    forward check rounds them."""
    torch.manual_seed(0)
    mha, x = torch.nn.MultiheadAttention(8, 2, batch_first=True), torch.randn(2, 3, 8)
    outs = []
    for emulate in (emulate_torch, emulate_torch_training):
        handles = emulate(mha, "bf16")
        try:
            outs.append(mha(x, x, x)[0].detach())
        finally:
            remove(handles)
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], mha(x, x, x)[0].detach())


def test_fp32_emulates_nothing():
    model = torch.nn.Linear(3, 3)
    assert emulate_torch_training(model, "fp32") == [] and emulate_torch_training(model, None) == []
    assert emulate_paddle_training("fp32") == [] and emulate_paddle_training(None) == []


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("how", ["matmul", "linear", "@"])
def test_a_paddle_gradient_through_an_emulated_product_is_the_products_gradient_on_rounded_inputs(fmt, how):
    rng = np.random.default_rng(3)
    a_np, b_np = rng.standard_normal((6, 9)).astype(np.float32), rng.standard_normal((9, 5)).astype(np.float32)
    g_np = rng.standard_normal((6, 5)).astype(np.float32)
    product = {"matmul": paddle.matmul, "linear": paddle.nn.functional.linear, "@": lambda x, y: x @ y}[how]
    a, b = paddle.to_tensor(a_np, stop_gradient=False), paddle.to_tensor(b_np, stop_gradient=False)
    handles = emulate_paddle_training(fmt)
    try:
        out = product(a, b)
    finally:
        remove(handles)
    out.backward(paddle.to_tensor(g_np))
    ar = paddle.to_tensor(round_array(a_np, fmt), stop_gradient=False)
    br = paddle.to_tensor(round_array(b_np, fmt), stop_gradient=False)
    plain = paddle.matmul(ar, br)
    plain.backward(paddle.to_tensor(g_np))
    assert not np.array_equal(ar.numpy(), a_np)
    np.testing.assert_array_equal(out.numpy(), plain.numpy())
    np.testing.assert_array_equal(a.grad.numpy(), ar.grad.numpy())
    np.testing.assert_array_equal(b.grad.numpy(), br.grad.numpy())
    assert not np.array_equal(a.grad.numpy(), g_np @ b_np.T)


def test_paddle_training_emulation_is_undone():
    original = paddle._C_ops.matmul
    handles = emulate_paddle_training("bf16")
    assert paddle._C_ops.matmul is not original
    remove(handles)
    remove(handles)  # once only
    assert paddle._C_ops.matmul is original
    restore = emulate_paddle("tf32")
    restore()
    assert paddle._C_ops.matmul is original
