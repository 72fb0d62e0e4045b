"""One pairing for one port: the per-layer backward pairs modules with layers as the forward check
does (compare/align.py over the conversion plan), layers without weights at other paths included."""

import paddle

from helpers.cli import spec_path
from helpers.train import train_check
from converter.compare.align import align
from converter.compare.capture import capture_paddle, capture_torch
from converter.compare.session import Options, PortSession
from converter.spec import PortSpec
from converter.train.backward import pair_layers
from converter.train.session import TrainSession
from converter.train.spec import TrainSpec

STEPS = 2


def _forward_and_backward_pairs(spec) -> tuple[dict, dict]:
    with PortSession(spec, Options(device="cpu")) as port:
        forward = align(capture_torch(port).calls, capture_paddle(port).calls, port.plan)
        with port.training():
            session = TrainSession(port, TrainSpec(spec))
            try:
                backward = pair_layers(session).modules
            finally:
                session.restore()
    return {p.torch: p.paddle for p in forward if p.part is None}, backward


def test_the_backward_pairs_a_transformer_as_the_forward_check_does():
    forward, backward = _forward_and_backward_pairs(PortSpec.from_file(spec_path("train_transformer")))
    assert forward == backward
    assert backward["layers.0.self_attn"] == "layers.0.self_attn" and backward["layers.1.dropout2"] == "layers.1.dropout2"


def _mlp_with_dropout_at(name: str):
    """train_mlp with paddle's dropout layer held at another attribute (a layer without weights
    at another path: paired by its kind, in execution order)."""
    spec = PortSpec.from_file(spec_path("train_mlp"))
    base = spec.module.PaddleMLP

    class Renamed(base):
        def __init__(self):
            super().__init__()
            setattr(self, name, self.drop)
            del self.drop

        def forward(self, x):
            h = paddle.nn.functional.gelu(self.norm(self.fc1(x)))
            return self.fc2(getattr(self, name)(h))

    spec.module.paddle_model = Renamed
    return spec


def test_a_layer_without_weights_at_another_path_is_paired_and_its_backward_compared():
    spec = _mlp_with_dropout_at("dropout")
    forward, backward = _forward_and_backward_pairs(spec)
    assert backward["drop"] == "dropout" and forward["drop"] == "dropout"
    report = train_check(_mlp_with_dropout_at("dropout"), steps=STEPS, device="cpu")
    rows = [r for r in report.rows if r.phase == "backward" and r.note.endswith("local backward of drop")]
    assert rows and all(r.paddle.startswith("dropout d input") and r.ratio is not None and r.ratio <= 1 for r in rows)
    assert report.verdict == "pass"
