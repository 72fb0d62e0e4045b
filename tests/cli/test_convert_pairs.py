"""Real model pairs: convert a torch checkpoint with rules inferred from the spec, load it
into the paddle model, and compare forwards."""

import json

import numpy as np
import pytest
import torch

from helpers.cli import run_convert, spec_path
from helpers.models import assert_fp32_close, forward_both, load_output_into
from converter.spec import load_spec


@pytest.mark.parametrize("name", ["transformer_encoder", "lstm", "gru", "cnn", "square_linear"])
@pytest.mark.parametrize("suffix", [".pdparams", ".safetensors"])
@pytest.mark.slow
def test_pair_converts_and_matches(tmp, name, suffix):
    spec = load_spec(spec_path(name))
    tm = spec.torch_model()
    ckpt = tmp / "model.pt"
    torch.save(tm.state_dict(), ckpt)
    out = tmp / ("model" + suffix)
    r = run_convert(ckpt, out, "--spec", spec_path(name))
    assert r.code == 0, r
    assert "check passed" in r.stderr
    assert "no missing or unexpected keys" in r.stderr
    yt, yp = forward_both(spec, tm, load_output_into(spec.paddle_model(), out))
    assert_fp32_close(yt, yp)


@pytest.mark.slow


def test_square_query_proj_is_transposed_and_conv1d_is_not(tmp):
    spec = load_spec(spec_path("square_linear"))
    tm = spec.torch_model()
    torch.save(tm.state_dict(), tmp / "m.pt")
    assert run_convert(tmp / "m.pt", tmp / "m.pdparams", "--spec", spec_path("square_linear")).code == 0
    from converter.io.pdparams import load_pdparams
    out = load_pdparams(str(tmp / "m.pdparams"))
    assert np.array_equal(out["query_proj.weight"], tm.query_proj.weight.detach().numpy().T)
    assert np.array_equal(out["c_attn.weight"], tm.c_attn.weight.detach().numpy())


def test_emitted_mapping_round_trips(tmp):
    spec = load_spec(spec_path("transformer_encoder"))
    torch.save(spec.torch_model().state_dict(), tmp / "m.pt")
    r1 = run_convert(tmp / "m.pt", tmp / "a.pdparams", "--spec", spec_path("transformer_encoder"),
                     "--emit-mapping", tmp / "rules.json")
    assert r1.code == 0, r1
    rules = json.loads((tmp / "rules.json").read_text())
    kinds = {r["kind"] for r in rules["rules"]}
    assert {"split", "transpose", "rename"} <= kinds
    r2 = run_convert(tmp / "m.pt", tmp / "b.pdparams", "--mapping", tmp / "rules.json")
    assert r2.code == 0, r2
    assert (tmp / "a.pdparams").read_bytes() == (tmp / "b.pdparams").read_bytes()


def test_lstm_alias_keys_are_written(tmp):
    spec = load_spec(spec_path("lstm"))
    torch.save(spec.torch_model().state_dict(), tmp / "m.pt")
    assert run_convert(tmp / "m.pt", tmp / "m.pdparams", "--spec", spec_path("lstm")).code == 0
    from converter.io.pdparams import load_pdparams
    out = load_pdparams(str(tmp / "m.pdparams"))
    assert np.array_equal(out["weight_ih_l0"], out["0.cell_fw.weight_ih"])
    assert np.array_equal(out["weight_hh_l1_reverse"], out["1.cell_bw.weight_hh"])
