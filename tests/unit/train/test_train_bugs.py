"""Planted training bugs on real torch/paddle pairs: each is named by verify-port --train in the
right phase, at the right parameter or layer, with the right diagnosis."""

import numpy as np
import paddle
import pytest
import torch

from helpers.cli import spec_path
from converter.spec import PortSpec
from helpers.train import train_check

STEPS = 6
F = paddle.nn.functional


def _mlp(**overrides):
    spec = PortSpec.from_file(spec_path("train_mlp"))
    for name, value in overrides.items():
        setattr(spec.module, name, value)
    return spec


def _adamw(model, **kw):
    args = dict(learning_rate=3e-3, weight_decay=0.05, parameters=model.parameters())
    args.update(kw)
    return paddle.optimizer.AdamW(**args)


def _stop_fc1(spec):
    build = spec.module.paddle_model

    def paddle_model():
        model = build()
        model.fc1.weight.stop_gradient = True
        return model
    spec.module.paddle_model = paddle_model
    return spec


def _detached_hidden(spec):
    module = spec.module

    class Detached(module.PaddleMLP):
        def forward(self, x):
            h = F.gelu(self.norm(self.fc1(x))).detach()
            return self.fc2(self.drop(h))
    module.paddle_model = Detached
    return spec


class _HalfGradGelu(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensor()
        slope = 0.5 * (1 + paddle.erf(x / np.sqrt(2.0))) + x * paddle.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
        return 0.5 * dy * slope  # the planted bug: half the true gradient


class _StraightThroughGelu(paddle.autograd.PyLayer):
    """GELU whose backward passes the gradient on unchanged (straight through): no scale of the
    true gradient, so only the gradient graph says a custom backward runs here."""

    @staticmethod
    def forward(ctx, x):
        return F.gelu(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def _custom_backward(spec, pylayer=_HalfGradGelu):
    return _with_act(spec, lambda x: pylayer.apply(x), torch.nn.functional.gelu)  # apply looked up at the call


def _with_act(spec, paddle_act, torch_act):
    """The MLP of `spec` with its activation a layer of its own on each side, computing `paddle_act`
    and `torch_act`."""
    module = spec.module

    class Act(paddle.nn.Layer):
        def forward(self, x):
            return paddle_act(x)

    class TorchAct(torch.nn.Module):
        def forward(self, x):
            return torch_act(x)

    class TorchWithAct(module.TorchMLP):
        def __init__(self):
            super().__init__()
            self.act = TorchAct()

        def forward(self, x):
            return self.fc2(self.drop(self.act(self.norm(self.fc1(x)))))

    class PaddleWithAct(module.PaddleMLP):
        def __init__(self):
            super().__init__()
            self.act = Act()

        def forward(self, x):
            return self.fc2(self.drop(self.act(self.norm(self.fc1(x)))))

    def torch_model():
        torch.manual_seed(0)
        return TorchWithAct()
    module.torch_model, module.paddle_model = torch_model, PaddleWithAct
    return spec


class _QueryStopped(paddle.nn.MultiHeadAttention):
    """paddle's attention with the gradient stopped inside, on the query projection's output."""

    def _prepare_qkv(self, query, key, value, cache=None):
        q, k, v = super()._prepare_qkv(query, key, value, cache)
        return q.detach(), k, v


def _query_stopped(spec):
    """train_transformer with the planted bug in the first layer's attention (torch's fused
    in_proj_weight feeds paddle's q_proj, k_proj and v_proj)."""
    build = spec.module.paddle_model

    def paddle_model():
        model = build()
        model.layers[0].self_attn.__class__ = _QueryStopped
        return model
    spec.module.paddle_model = paddle_model
    return spec


def _bn_momentum(spec):
    spec.module.paddle_model = lambda: spec.module.PaddleCNN(momentum=0.1)
    return spec


def _cnn(**overrides):
    spec = PortSpec.from_file(spec_path("train_cnn"))
    for name, value in overrides.items():
        setattr(spec.module, name, value)
    return spec


def _tagger(**overrides):
    spec = PortSpec.from_file(spec_path("train_tagger"))
    for name, value in overrides.items():
        setattr(spec.module, name, value)
    return spec


WEIGHTS = np.array([1.0, 2.0, 1.0, 1.0, 3.0], np.float32)  # train_mlp's five classes; its first batch has no 4


def _soft_batches():
    """train_mlp's batches with class probabilities (a teacher's) as targets."""
    module = PortSpec.from_file(spec_path("train_mlp")).module
    rng = np.random.default_rng(5)
    return [(x, rng.dirichlet(np.ones(module.C), size=module.B).astype(np.float32)) for x, _ in module.batches()]


def _sched(model, warmup=4, t_max=16, **kw):
    cos = paddle.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=t_max)
    sched = paddle.optimizer.lr.LinearWarmup(cos, warmup_steps=warmup, start_lr=3e-4, end_lr=3e-3)
    return _adamw(model, learning_rate=sched, **kw), sched


CASES = {
    # name: (spec factory, phase, torch name (prefix), diagnosis words)
    "loss-reduction-sum": (lambda: _mlp(paddle_loss=lambda o, t: F.cross_entropy(o, t, reduction="sum")),
                           "loss", "loss", ["reduction", "sum"]),
    "loss-ignore-index": (lambda: _mlp(paddle_loss=lambda o, t: F.cross_entropy(o, t, ignore_index=0)),
                          "loss", "loss", ["ignore_index=0"]),
    "loss-label-smoothing": (lambda: _mlp(paddle_loss=lambda o, t: F.cross_entropy(o, t, label_smoothing=0.1)),
                             "loss", "loss", ["label smoothing 0.1"]),
    "loss-class-weights": (lambda: _mlp(paddle_loss=lambda o, t: F.cross_entropy(o, t, weight=paddle.to_tensor(WEIGHTS))),
                           "loss", "loss", ["class weights", "[1, 2, 1, 1, ?] (relative; ? a class absent", "torch's all alike"]),
    "loss-class-weights-torch-only": (
        lambda: _mlp(torch_loss=lambda o, t: torch.nn.functional.cross_entropy(o, t, weight=torch.from_numpy(WEIGHTS).to(o))),
        "loss", "loss", ["class weights", "paddle's loss weighs the classes all alike", "torch's [1, 2, 1, 1, ?]"]),
    "loss-soft-labels": (lambda: _mlp(batches=_soft_batches,
                                      torch_loss=lambda o, t: torch.nn.functional.cross_entropy(o, t.argmax(1)),
                                      paddle_loss=lambda o, t: F.cross_entropy(o, t, soft_label=True)),
                         "loss", "loss", ["soft labels", "paddle's loss takes the targets as probabilities"]),
    "loss-class-axis": (lambda: _tagger(paddle_loss=lambda o, t: F.cross_entropy(o, t, soft_label=True)),
                        "loss", "loss", ["class axis", "classes on axis 2", "axis=-1", "torch's on axis 1"]),
    "loss-nan": (lambda: _mlp(paddle_loss=lambda o, t: F.cross_entropy(o, t) + 0 * paddle.log(o.abs().min() * 0)),
                 "loss", "loss", ["paddle's loss is nan", "overflows or divides by zero"]),
    "parameter-group-lr": (lambda: _mlp(torch_optimizer=_torch_groups, paddle_optimizer=lambda m: _paddle_groups(m, 1.0)),
                           "optimizer", "fc2", ["learning rate: torch 0.0003, paddle 0.003"]),
    "learning-rate-factor-of-a-parameter": (lambda: _mlp(torch_optimizer=lambda m: torch.optim.AdamW(
        m.parameters(), lr=3e-3, weight_decay=0.05), paddle_model=_head_at_half_rate, paddle_optimizer=_adamw),
        "optimizer", "fc2.weight", ["learning rate: torch 0.003, paddle 0.0015", "ParamAttr(learning_rate=...)"]),
    "rmsprop-paddle-defaults": (lambda: _mlp(torch_optimizer=lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-3),
                                             paddle_optimizer=lambda m: paddle.optimizer.RMSProp(
                                                 1e-3, parameters=m.parameters())),
                                "optimizer", "", ["RMSProp rho (torch alpha): torch 0.99, paddle 0.95",
                                                  "epsilon: torch 1e-08, paddle 1e-06"]),
    "adam-epsilon": (lambda: _mlp(paddle_optimizer=lambda m: _sched(m, epsilon=1e-6)), "optimizer", "fc",
                     ["epsilon", "1e-06"]),
    "adam-beta2": (lambda: _mlp(paddle_optimizer=lambda m: _sched(m, beta2=0.99)), "optimizer", "",
                   ["beta1/beta2", "0.99"]),
    "l2-not-decoupled": (lambda: _mlp(paddle_optimizer=lambda m: _l2_adam(m)), "optimizer", "",
                         ["weight decay", "L2"]),
    "warmup-length": (lambda: _mlp(paddle_optimizer=lambda m: _sched(m, warmup=2)), "lr", "lr", ["warmup"]),
    "scheduler-on-torch-only": (lambda: _mlp(paddle_optimizer=lambda m: _adamw(m)), "lr", "lr",
                                ["paddle's learning rate stays at 0.003", "no scheduler"]),
    "scheduler-one-step-late": (lambda: _mlp(paddle_optimizer=lambda m: _late(m)), "lr", "lr",
                                ["one step late", "stepped once less"]),
    "schedule-per-epoch": (lambda: _mlp(paddle_optimizer=lambda m: _per_epoch(m)), "lr", "lr", ["per epoch"]),
    "no-clipping": (lambda: _mlp(clip_grad_norm=0.05, paddle_optimizer=lambda m: _sched(m)), "optimizer", "",
                    ["clipping", "none"]),
    "nesterov-dropped": (lambda: _cnn(torch_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.05,
                                                                                momentum=0.9, nesterov=True),
                                      paddle_optimizer=lambda m: paddle.optimizer.Momentum(
                                          0.05, 0.9, parameters=m.parameters())), "optimizer", "", ["nesterov"]),
    "sgd-dampening": (lambda: _cnn(torch_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9,
                                                                             dampening=0.5),
                                   paddle_optimizer=lambda m: paddle.optimizer.Momentum(0.05, 0.9,
                                                                                        parameters=m.parameters())),
                      "optimizer", "", ["dampening: torch 0.5, paddle 0.0", "reproduces paddle's step"]),
    "bn-momentum-convention": (lambda: _bn_momentum(_cnn()), "steps", "bn.running", ["momentum convention"]),
    "trainable-one-side": (lambda: _stop_fc1(_mlp()), "structure", "fc1.weight", ["trainable in torch only"]),
    "missing-from-optimizer": (lambda: _mlp(paddle_optimizer=lambda m: _adamw(m, parameters=m.fc2.parameters())),
                               "structure", "fc1", ["missing from paddle's optimizer"]),
    "stopped-gradient": (lambda: _detached_hidden(_mlp()), "backward", "", ["stopped on paddle's side"]),
    "custom-backward": (lambda: _custom_backward(_mlp()), "backward", "act", ["custom backward"]),
    "straight-through-backward": (lambda: _custom_backward(_mlp(), _StraightThroughGelu), "backward", "act",
                                  ["runs through the custom backward _StraightThroughGelu (paddle.autograd.PyLayer)"]),
}


def _l2_adam(model):
    cos = paddle.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=16)
    sched = paddle.optimizer.lr.LinearWarmup(cos, warmup_steps=4, start_lr=3e-4, end_lr=3e-3)
    return paddle.optimizer.Adam(learning_rate=sched, weight_decay=0.05, parameters=model.parameters()), sched


def _per_epoch(model):
    # warmup and cosine counted in epochs of 2 steps: the scheduler is stepped every other step
    class EveryOther(paddle.optimizer.lr.LRScheduler):
        def __init__(self, inner):
            self.inner = inner
            super().__init__(inner.last_lr)
            self.calls = 0

        def get_lr(self):
            return self.inner.last_lr if hasattr(self, "inner") else self.base_lr

        def step(self, epoch=None):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls % 2 == 0:
                self.inner.step()
            super().step()
    cos = paddle.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=16)
    sched = EveryOther(paddle.optimizer.lr.LinearWarmup(cos, warmup_steps=4, start_lr=3e-4, end_lr=3e-3))
    return _adamw(model, learning_rate=sched), sched


def _torch_groups(model):
    """AdamW with the head at a tenth of the rate and without weight decay."""
    head = [model.fc2.weight, model.fc2.bias]
    rest = [p for p in model.parameters() if all(p is not q for q in head)]
    return torch.optim.AdamW([{"params": rest}, {"params": head, "lr": 3e-4, "weight_decay": 0.0}], lr=3e-3,
                             weight_decay=0.05)


def _paddle_groups(model, head_factor):
    """paddle's parameter groups: 'learning_rate' is a factor of the optimizer's rate."""
    head = [model.fc2.weight, model.fc2.bias]
    rest = [p for p in model.parameters() if all(p is not q for q in head)]
    return paddle.optimizer.AdamW(3e-3, parameters=[
        {"params": rest}, {"params": head, "learning_rate": head_factor, "weight_decay": 0.0}], weight_decay=0.05)


def _head_at_half_rate():
    module = PortSpec.from_file(spec_path("train_mlp")).module
    model = module.PaddleMLP()
    model.fc2.weight.optimize_attr["learning_rate"] = 0.5  # what ParamAttr(learning_rate=0.5) sets
    return model


@pytest.mark.slow


def test_clean_parameter_groups_pass():
    """The parameter-group bug's clean twin: paddle's head group at a factor 0.1 of the rate."""
    report = train_check(_mlp(torch_optimizer=_torch_groups, paddle_optimizer=lambda m: _paddle_groups(m, 0.1)),
                         steps=STEPS, device="cpu")
    assert report.first_bad is None, report.first_bad
    assert any(r.phase == "optimizer" and r.paddle == "fc2.weight" for r in report.rows)


def _late(model):
    """Warmup and cosine one step behind: paddle's rate at step k is torch's at step k - 1."""
    cos = paddle.optimizer.lr.CosineAnnealingDecay(3e-3, T_max=16)
    right = paddle.optimizer.lr.LinearWarmup(cos, warmup_steps=4, start_lr=3e-4, end_lr=3e-3)
    rates = []
    for _ in range(40):
        rates.append(right.last_lr)
        right.step()

    class Late(paddle.optimizer.lr.LRScheduler):
        def get_lr(self):
            return rates[max(self.last_epoch - 1, 0)]
    sched = Late(rates[0])
    return _adamw(model, learning_rate=sched), sched


@pytest.mark.slow


def test_clean_tagger_with_soft_targets_on_axis_1_passes():
    """The class-axis bug's clean twin: paddle's cross_entropy told axis=1 agrees with torch's."""
    report = train_check(_tagger(), steps=3, device="cpu")
    assert report.first_bad is None, report.first_bad
    assert {r.phase for r in report.rows} >= {"loss", "backward", "optimizer", "steps"}


@pytest.mark.slow


def test_gradient_stopped_inside_fused_attention_is_named_at_the_attention():
    """The per-layer backward pairs torch's MultiheadAttention with paddle's MultiHeadAttention and
    compares q_proj, k_proj and v_proj's gradients each with its slice of torch's in_proj_weight
    gradient (as the conversion splits and transposes it): the stopped query is the only bad one,
    and the attention of the first layer (last in backward order) is named, in phase backward."""
    report = train_check(_query_stopped(PortSpec.from_file(spec_path("train_transformer"))), steps=2, device="cpu")
    fb = report.first_bad
    assert fb is not None and fb.phase == "backward" and fb.torch.startswith("layers.0.self_attn "), fb
    assert report.diagnosis[0].layer == "layers.0.self_attn"
    assert "stopped on paddle's side" in report.diagnosis[0].cause
    assert "'layers.0.self_attn.q_proj.weight'" in report.diagnosis[0].cause
    rows = {r.paddle: r for r in report.rows if r.phase == "backward" and r.note.endswith("local backward of "
                                                                                              "layers.0.self_attn")}
    names = [f"layers.0.self_attn.{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")]
    assert set(names) <= set(rows), sorted(rows)
    assert all(rows[n].torch.startswith("layers.0.self_attn.in_proj_") for n in names)
    assert [n for n in names if rows[n].bad] == names[:2]
    assert rows["layers.0.self_attn d input[0]"].bad


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_planted_training_bug_is_named_with_its_cause(case):
    make, phase, where, words = CASES[case]
    report = train_check(make(), steps=STEPS, device="cpu")
    fb = report.first_bad
    assert fb is not None, f"{case}: passed"
    assert fb.phase == phase, f"{case}: {fb}"
    assert fb.torch.startswith(where) or where in fb.torch, f"{case}: {fb}"
    text = " ".join(d.cause for d in report.diagnosis)
    for w in words:
        assert w in text, f"{case}: '{w}' not in {text!r}"
    assert report.exit_code == 1


def _tied(tmp_path, tied):
    import json
    spec = PortSpec.from_file(spec_path("train_tied"))
    rules = None
    if tied:
        rules = tmp_path / "tied.json"
        rules.write_text(json.dumps(spec.module.RULES))
    spec.module.paddle_model = lambda: spec.module.PaddleLM(tied)
    return train_check(spec, steps=STEPS, device="cpu", mapping=None if rules is None else str(rules))


@pytest.mark.slow


def test_a_tied_head_with_no_paddle_layer_needs_no_rule_file():
    """The port that computes the head from the embedding's weight has no layer for torch's tied
    head: inference drops its key, saying what it is tied to, and the forward and training
    checks pass with no rule file (before, inference stopped: "torch module 'head' has no paddle
    sublayer")."""
    from converter.rules.infer import infer_ruleset
    from converter.verify.run import verify
    from converter.compare.session import Options
    spec = PortSpec.from_file(spec_path("train_tied"))
    rules = {r.spec["key"]: r.spec for r in infer_ruleset(spec.torch_model(), spec.paddle_model()).rules
             if r.kind == "drop"}
    assert list(rules) == ["head.weight"] and "tied to 'emb.weight'" in rules["head.weight"]["comment"]
    assert verify(spec, Options(device="cpu")).verdict == "pass"
    trained = train_check(spec, steps=STEPS, device="cpu")
    assert trained.first_bad is None and trained.exit_code == 0, trained.first_bad


def test_a_tied_head_is_dropped_only_when_nothing_else_is_left_unpaired():
    """The tie is found whichever module registers first; but where another torch module is left
    without a paddle layer too, dropping the tied head would pair the rest by order (here torch's
    `proj` with paddle's `lm_head`): inference keeps its error naming both."""
    from converter.errors import UserError
    from converter.rules.infer import infer_ruleset
    spec = PortSpec.from_file(spec_path("train_tied"))
    V, D = spec.module.V, spec.module.D

    class HeadFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(D, V, bias=False)
            self.emb = torch.nn.Embedding(V, D)
            self.proj = torch.nn.Linear(D, D)
            self.head.weight = self.emb.weight
    drops = [r.spec["key"] for r in infer_ruleset(HeadFirst(), spec.paddle_model()).rules if r.kind == "drop"]
    assert drops == ["head.weight"]

    class NoProj(paddle.nn.Layer):  # the port lost proj and named its head lm_head
        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(V, D)
            self.lm_head = paddle.nn.Linear(D, V, bias_attr=False)
    with pytest.raises(UserError) as err:
        infer_ruleset(spec.torch_model(), NoProj())
    assert {"torch module 'head' has no paddle sublayer", "torch module 'proj' has no paddle sublayer"} <= \
        {d.split(" of the same name")[0] for d in err.value.details}


@pytest.mark.slow


def test_tied_weights_kept_pass_and_a_lost_tie_is_named_in_structure(tmp_path):
    """Torch's head shares the embedding's weight: the port that keeps the tie passes every phase;
    the port with a head of its own is named in phase structure, both names given, with the fix."""
    kept = _tied(tmp_path, True)
    assert kept.first_bad is None, kept.first_bad
    assert {r.phase for r in kept.rows} >= {"loss", "backward", "optimizer", "steps"}
    lost = _tied(tmp_path, False)
    fb = lost.first_bad
    assert fb.phase == "structure" and set(fb.torch.split(" = ")) == {"emb.weight", "head.weight"}, fb
    assert set(fb.paddle.split(" , ")) == {"emb.weight", "head.weight"}
    assert "tied in torch, separate tensors in paddle" in lost.diagnosis[0].cause
    assert "share the weight in paddle" in lost.diagnosis[0].hint


class _Tanh(paddle.autograd.PyLayer):
    """tanh with its own backward, correct."""

    @staticmethod
    def forward(ctx, x):
        y = paddle.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensor()
        return dy * (1 - y * y)


def test_a_correct_custom_backward_beside_a_detach_is_not_blamed():
    """paddle's act is tanh(x) * x with tanh a correct PyLayer and the second x detached; torch's
    tanh(x) * x. The gradient runs through the PyLayer, but run under autograd it changes nothing:
    the custom backward is not named, the place is."""
    spec = _with_act(_mlp(), lambda x: _Tanh.apply(x) * x.detach(), lambda x: torch.tanh(x) * x)
    report = train_check(spec, steps=STEPS, device="cpu")
    assert report.exit_code == 1 and report.first_bad.phase == "backward" and report.first_bad.torch.startswith("act")
    assert not [d for d in report.diagnosis if d.kind == "custom backward"], report.diagnosis
    assert [d.kind for d in report.diagnosis if d.layer == "act"] == ["backward"], report.diagnosis
