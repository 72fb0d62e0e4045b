"""A rotary table that differs, named with the rotary parameters that make it: torch's rotary
embedding is HF 5's form (its config's rope_parameters, the table built by the rope type's
function: the class's own default, or its modeling file's ROPE_INIT_FUNCTIONS), and it is rebuilt
from the paddle model's value of each rotary field that differs, and with YaRN's factor read from
max_position_embeddings / original_max_position_embeddings. The diagnosis names the field and
both values; a table that is off by something else gets no rotary diagnosis."""

import copy
import types

import numpy as np
import paddle
import torch

from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

B, T, D = 2, 12, 8


def _inverse_frequencies(base: float) -> np.ndarray:
    return base ** (-np.arange(0, D, 2, dtype=np.float64) / D)


def _interpolated(rope: dict) -> tuple[np.ndarray, float]:
    """A YaRN-like table: the lower half of the frequencies divided by the factor, the cos and sin
    scaled by 1 + 0.1 ln(factor)."""
    inv_freq = _inverse_frequencies(rope["rope_theta"])
    factor = rope["factor"]
    inv_freq[D // 4:] /= factor
    return inv_freq, (0.1 * np.log(factor) + 1.0 if factor > 1 else 1.0)


def _yarn(config, device=None):
    inv_freq, scaling = _interpolated(config.rope_parameters)
    return torch.tensor(inv_freq, dtype=torch.float32, device=device), scaling


ROPE_INIT_FUNCTIONS = {"yarn": _yarn}  # found, as in HF's modeling files, beside the class


class RotaryEmbedding(torch.nn.Module):
    """HF 5's form: the table from config.rope_parameters, cos and sin for one row of positions."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        rope_type = config.rope_parameters["rope_type"]
        init = self.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
        inv_freq, self.attention_scaling = init(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @staticmethod
    def compute_default_rope_parameters(config, device=None):
        return torch.tensor(_inverse_frequencies(config.rope_parameters["rope_theta"]), dtype=torch.float32,
                            device=device), 1.0

    def forward(self, x):
        positions = torch.arange(x.shape[1], dtype=self.inv_freq.dtype)[None, :, None]
        freqs = positions @ self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


class TorchNet(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(self, x):
        cos, sin = self.rotary_emb(x)
        h = self.proj(x)
        return h * cos + torch.flip(h, dims=[-1]) * sin


class PaddleRotary(paddle.nn.Layer):
    """The paddle table from its own config; YaRN's factor from max_position_embeddings /
    original_max_position_embeddings where `factor_from_lengths`, a base `base_times` the config's."""

    def __init__(self, config, factor_from_lengths=False, base_times=1.0):
        super().__init__()
        self.config = config
        rope = dict(config.rope_parameters, rope_theta=config.rope_parameters["rope_theta"] * base_times)
        if rope["rope_type"] == "yarn":
            if factor_from_lengths:
                rope["factor"] = config.max_position_embeddings / rope["original_max_position_embeddings"]
            inv_freq, self.scaling = _interpolated(rope)
        else:
            inv_freq, self.scaling = _inverse_frequencies(rope["rope_theta"]), 1.0
        self.inv_freq = paddle.to_tensor(inv_freq.astype("float32"))

    def forward(self, x):
        positions = paddle.arange(x.shape[1], dtype="float32").reshape([1, -1, 1])
        freqs = paddle.matmul(positions, self.inv_freq.reshape([1, 1, -1]))
        emb = paddle.concat([freqs, freqs], axis=-1)
        return emb.cos() * self.scaling, emb.sin() * self.scaling


class PaddleNet(paddle.nn.Layer):
    def __init__(self, config, **rotary):
        super().__init__()
        self.proj = paddle.nn.Linear(D, D)
        self.rotary_emb = PaddleRotary(config, **rotary)

    def forward(self, x):
        cos, sin = self.rotary_emb(x)
        h = self.proj(x)
        return h * cos + paddle.flip(h, axis=[-1]) * sin


RULES = {"name": "rotary", "unmatched": "keep", "rules": [{"kind": "transpose", "match": r"proj\.weight"}]}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096}


def _config(rope: dict, max_position_embeddings: int = 4096):
    return types.SimpleNamespace(rope_parameters=dict(rope), max_position_embeddings=max_position_embeddings)


def _verify(torch_config, paddle_config, **rotary):
    def build_torch():
        torch.manual_seed(0)
        return TorchNet(copy.deepcopy(torch_config)).eval()
    inputs = lambda: (np.random.default_rng(0).standard_normal((B, T, D)).astype("float32"),)
    spec = spec_from_functions(build_torch, lambda: PaddleNet(copy.deepcopy(paddle_config), **rotary), inputs,
                               mapping=RULES)
    report = verify(spec, Options(device="cpu"), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "rotary_emb", report.first_bad
    return [d for d in report.diagnosis if d.kind == "rotary"]


def test_a_rotary_base_that_differs_in_the_paddle_config_is_named_with_both_values():
    found = _verify(_config({"rope_type": "default", "rope_theta": 10000.0}),
                    _config({"rope_type": "default", "rope_theta": 500000.0}))
    assert len(found) == 1, found
    assert "rope_parameters['rope_theta'] 500000.0" in found[0].cause and "10000.0" in found[0].cause, found[0]


def test_a_yarn_factor_that_differs_in_the_paddle_config_is_named_with_both_values():
    found = _verify(_config(YARN), _config(dict(YARN, factor=8.0)))
    assert len(found) == 1, found
    assert "rope_parameters['factor'] 8.0" in found[0].cause and "40.0" in found[0].cause, found[0]


def test_a_yarn_factor_read_from_the_lengths_is_named_with_the_lengths_and_the_factor():
    found = _verify(_config(YARN), _config(YARN), factor_from_lengths=True)
    assert len(found) == 1, found
    assert "(4096 / 4096 = 1) instead of rope_parameters['factor'] (40)" in found[0].cause, found[0]


def test_a_table_off_by_something_no_rotary_field_says_gets_no_rotary_diagnosis():
    assert _verify(_config(YARN), _config(YARN), base_times=1.5) == []


class TablesPerType(torch.nn.Module):
    """HF 5's form with one table per layer type (Gemma 3): rope_parameters keyed by layer type, each
    table in `<type>_inv_freq`, the type passed with each call."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        for layer_type in config.rope_parameters:
            inv_freq, scaling = self.compute_default_rope_parameters(config, layer_type=layer_type)
            self.register_buffer(f"{layer_type}_inv_freq", inv_freq, persistent=False)
            setattr(self, f"{layer_type}_attention_scaling", scaling)

    @staticmethod
    def compute_default_rope_parameters(config, device=None, layer_type=None):
        return torch.tensor(_inverse_frequencies(config.rope_parameters[layer_type]["rope_theta"]),
                            dtype=torch.float32, device=device), 1.0

    def forward(self, x, layer_type):
        inv_freq = getattr(self, f"{layer_type}_inv_freq")
        freqs = torch.arange(x.shape[1], dtype=inv_freq.dtype)[None, :, None] @ inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = getattr(self, f"{layer_type}_attention_scaling")
        return emb.cos() * scaling, emb.sin() * scaling


class TorchNetPerType(torch.nn.Module):
    """The first layer type's table applied (HF's Gemma 3 asks for each type's table in turn)."""

    def __init__(self, config):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.rotary_emb = TablesPerType(config)

    def forward(self, x):
        cos, sin = self.rotary_emb(x, next(iter(self.rotary_emb.config.rope_parameters)))
        h = self.proj(x)
        return h * cos + torch.flip(h, dims=[-1]) * sin


def _verify_per_type(rope: dict, paddle_rope: dict, **rotary):
    def build_torch():
        torch.manual_seed(0)
        return TorchNetPerType(_config(rope)).eval()
    inputs = lambda: (np.random.default_rng(0).standard_normal((B, T, D)).astype("float32"),)
    spec = spec_from_functions(build_torch, lambda: PaddleNet(_config(paddle_rope), **rotary), inputs, mapping=RULES)
    report = verify(spec, Options(device="cpu"), bisect=True)
    assert report.verdict == "fail" and report.first_bad.torch == "rotary_emb", report.first_bad
    return [d for d in report.diagnosis if d.kind == "rotary"]


PER_TYPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}


def test_a_layer_types_table_built_with_another_types_parameters_is_named_with_both():
    """Paddle builds one table from the full-attention base (its flat rope_theta) for the sliding layers too."""
    found = _verify_per_type(PER_TYPE, dict(PER_TYPE, rope_type="default", rope_theta=1000000.0))
    assert len(found) == 1, found
    assert "sliding_attention rotary table is built with the full_attention layers' rope parameters: rope_theta " \
           "1000000.0 instead of 10000.0" in found[0].cause, found[0]
    assert "holds rope_theta 1000000.0 as its rope_parameters for every layer type" in found[0].cause, found[0]


def test_a_layer_types_table_built_with_the_paddle_configs_own_value_is_named_with_it():
    found = _verify_per_type(PER_TYPE, {"rope_type": "default", "rope_theta": 50000.0})
    assert len(found) == 1, found
    assert "sliding_attention rotary table is torch's built with the paddle model's rope_parameters['rope_theta'] " \
           "50000.0; torch's config has 10000.0" in found[0].cause, found[0]


def test_a_layer_types_table_off_by_something_no_parameter_says_gets_no_rotary_diagnosis():
    assert _verify_per_type(PER_TYPE, {"rope_type": "default", "rope_theta": 10000.0}, base_times=1.5) == []
