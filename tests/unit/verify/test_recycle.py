"""Storage lent again to the next block's tensors of a streamed run (compare/recycle.py): a
dropped tensor's storage makes the next tensor of its size; storage still held anywhere (a view,
a numpy array, a parameter, its Python storage object, a paddle tensor through DLPack) is never
lent again; free storage over the cap goes back. The checkpoint's tensors made on it hold the
values loading gives (a streamed run making its blocks on it: tests/unit/verify/test_stream.py)."""

import gc

import numpy as np
import paddle
import pytest
import torch
from safetensors.torch import save_file

from converter.compare.recycle import Storages
from converter.compare.stream import Checkpoint, _paddle_tensor


def test_a_dropped_tensors_storage_makes_the_next_tensor_of_its_size():
    pool = Storages(cap=1 << 30)
    a = pool.empty((64, 32), torch.float32)
    where = a.data_ptr()
    del a
    b = pool.empty((32, 64), torch.float32)  # the same bytes in another shape
    assert b.data_ptr() == where and tuple(b.shape) == (32, 64) and b.is_contiguous()
    c = pool.empty((64, 32), torch.float64)  # twice the bytes: storage of its own
    assert c.data_ptr() != where


def _hold(tensor, holder: str):
    if holder == "view":
        return tensor.t()
    if holder == "numpy":
        return tensor.numpy()
    if holder == "parameter":
        return torch.nn.Parameter(tensor)
    if holder == "storage":  # the Python storage object the pool keeps too
        return tensor.untyped_storage()
    return paddle.utils.dlpack.from_dlpack(tensor)


def _values(held, holder: str) -> np.ndarray:
    if holder == "paddle":
        return held.numpy()
    if holder == "storage":
        return torch.empty(0).set_(held, 0, (64 * 32,)).numpy()
    return held.detach().numpy() if torch.is_tensor(held) else held


@pytest.mark.parametrize("holder", ["view", "numpy", "parameter", "storage", "paddle"])
def test_storage_still_held_anywhere_is_not_lent_again(holder):
    pool = Storages(cap=1 << 30)
    a = pool.empty((64, 32), torch.float32)
    a.fill_(3.0)
    where = a.data_ptr()
    held = _hold(a, holder)
    del a
    other = pool.empty((64, 32), torch.float32)
    other.fill_(-1.0)
    assert other.data_ptr() != where
    values = _values(held, holder)
    assert np.all(values == 3.0)  # the holder's values untouched
    del held, values
    gc.collect()
    assert pool.empty((64, 32), torch.float32).data_ptr() == where  # let go: lent again


def test_free_storage_over_the_cap_goes_back_at_the_next_ask():
    pool = Storages(cap=2 * 4096)
    made = [pool.empty((1024,), torch.float32) for _ in range(4)]
    del made
    assert pool.free_bytes() == 4 * 4096
    kept = pool.empty((1024,), torch.float32)
    assert pool.free_bytes() == 2 * 4096 and kept.numel() == 1024


class Stack(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 24, dtype=dtype) for _ in range(3)])


@pytest.mark.parametrize("stored, held", [(torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                                          (torch.float32, torch.bfloat16), (torch.float16, torch.float32)])
def test_the_checkpoints_tensors_hold_what_loading_gives_in_the_models_dtype_and_in_float64(tmp_path, stored, held):
    torch.manual_seed(0)
    values = {k: (torch.randn_like(v) * 3).to(stored) for k, v in Stack().state_dict().items()}
    path = str(tmp_path / "stack.safetensors")
    save_file(values, path)
    with torch.device("meta"):
        model = Stack(held)
    source = Checkpoint(path, model)
    try:
        for key, value in values.items():
            loaded = value.to(held)
            got = source.tensor(key)
            assert got.dtype == held and torch.equal(got, loaded), key
            wide = source.tensor(key, torch.float64)  # through the model's dtype where it rounds
            assert wide.dtype == torch.float64 and torch.equal(wide, loaded.double()), key
    finally:
        source.close()
    # the pool keeps a float64 block's bytes free: the largest block's floating tensors, 8 bytes each
    assert source.storages.cap == 8 * (16 * 24 + 24)


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_paddle_tensors_made_on_lent_storage_hold_the_arrays_values(dtype):
    with paddle.LazyGuard():
        layer = paddle.nn.Linear(24, 16)
    pool = Storages(cap=1 << 30)
    array = np.random.default_rng(0).standard_normal((16, 24)).astype("float32").T  # a transposed view
    made = _paddle_tensor(layer.weight, array, dtype, pool)
    assert isinstance(made, paddle.base.framework.EagerParamBase)
    assert str(made.dtype).endswith(dtype or "float32") and made.stop_gradient == layer.weight.stop_gradient
    assert np.array_equal(made.numpy(), array.astype(dtype or "float32"))
    where = made.data_ptr()
    assert pool.free_bytes() == 0  # paddle holds it
    del made
    gc.collect()
    assert pool.free_bytes() == 24 * 16 * (8 if dtype else 4)
    again = _paddle_tensor(layer.weight, array, dtype, pool)
    assert again.data_ptr() == where and np.array_equal(again.numpy(), array.astype(dtype or "float32"))


def test_bfloat16_storage_arrays_made_on_lent_storage_keep_their_bits():
    values = torch.randn(8, 4).to(torch.bfloat16)
    bits = values.view(torch.int16).numpy().view(np.uint16)  # a bf16 storage array: its uint16 bits
    with paddle.LazyGuard():
        lazy = paddle.create_parameter([8, 4], "bfloat16", default_initializer=paddle.nn.initializer.Constant(0.0))
    made = _paddle_tensor(lazy, bits, None, Storages(cap=1 << 20))
    assert str(made.dtype).endswith("bfloat16")
    assert np.array_equal(made.cast("float32").numpy(), values.float().numpy())
