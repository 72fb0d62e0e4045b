"""Forwards of a torch/paddle pair, and loading a converted file into a paddle model."""
import numpy as np


def forward_both(spec, torch_model=None, paddle_model=None):
    """Outputs of both models on the spec's inputs, first tensor of tuple outputs."""
    import paddle
    import torch
    tm = torch_model or spec.torch_model()
    pm = paddle_model or spec.paddle_model()
    tm.eval()
    pm.eval()
    x = spec.inputs()
    with torch.no_grad():
        yt = tm(*[torch.from_numpy(a) for a in x])
    yp = pm(*[paddle.to_tensor(a) for a in x])
    first = lambda y: y[0] if isinstance(y, (tuple, list)) else y
    return first(yt).numpy(), first(yp).numpy()


def assert_fp32_close(a, b):
    """fp32 noise after a few layers: well under 1e-5 of the output's scale."""
    assert a.shape == b.shape
    scale = float(np.abs(a).max()) + 1e-30
    err = float(np.abs(a - b).max())
    assert err <= 2e-6 * scale + 1e-7, f"max abs diff {err:.3e} against output scale {scale:.3e}"


def load_output_into(paddle_model, path):
    """Load a converted file the way a user would: paddle.load for .pdparams, safetensors' own
    numpy loader for .safetensors."""
    import paddle
    if str(path).endswith(".pdparams"):
        state = paddle.load(str(path))
    else:
        from safetensors.numpy import load_file
        state = load_file(str(path))
    missing, unexpected = paddle_model.set_state_dict(state)
    assert not missing and not unexpected, (missing, unexpected)
    return paddle_model
