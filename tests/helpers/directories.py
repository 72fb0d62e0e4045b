"""Directory pairs for `verify-port HF_DIR PADDLE_DIR` as a user makes them: an HF model saved with
save_pretrained and converted by convert-weights; a copy of the converted directory holding other
weights; the memory available where the pair's run fits streamed and not in memory. torch is
imported by the builder that uses it."""

import json

from helpers.cli import run_convert


def converted_pair(root, build, config, *convert_args):
    """(HF_DIR, OUT_DIR): build(config), made with torch seeded with 0, saved with save_pretrained in
    root/hf, and convert-weights' directory of it in root/out (the conversion must succeed)."""
    import torch
    torch.manual_seed(0)
    build(config).eval().save_pretrained(root / "hf")
    r = run_convert(root / "hf", root / "out", "--quiet", *convert_args)
    assert r.code == 0, r
    return root / "hf", root / "out"


def directory_with_weights(out_dir, copy, weights: dict):
    """A copy of the converted directory out_dir made at `copy`: its config.json, and a
    model_state.pdparams holding weights (name -> array)."""
    from converter.io.base import TensorInfo
    from converter.io.pdparams import write_pdparams
    copy.mkdir()
    (copy / "config.json").write_bytes((out_dir / "config.json").read_bytes())
    with open(copy / "model_state.pdparams", "wb") as f:
        write_pdparams(f, [TensorInfo(k, str(v.dtype), v.shape) for k, v in weights.items()],
                       lambda info: weights[info.name])
    return copy


def least_memory_streamed(hf_dir, paddle_dir) -> int:
    """The least memory available (bytes) where the pair's run fits streamed; it does not fit in
    memory there."""
    from converter.hf import pair
    configs = [json.loads((d / "config.json").read_text()) for d in (hf_dir, paddle_dir)]
    planned = lambda figure: pair.directory_memory(str(hf_dir), str(paddle_dir), *configs, figure)[0]
    low, high = 1, 1 << 40
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if planned(mid).streamed.peak <= mid else (mid, high)
    assert planned(high).in_memory_peak > high
    return high
