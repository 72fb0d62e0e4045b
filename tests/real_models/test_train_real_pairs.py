"""verify-port --train on HF transformers models against their PaddleNLP ports, as a user runs it:
the specs in train_specs/ (an encoder-decoder trained with label smoothing, a BERT classifier with
AdamW and clipping, a causal LM with RMSNorm, its head untied or tied, with warmup and cosine
decay) pass `--train --steps 10`, each phase well within budget; a bug planted in one phase of a
spec (the spec imported whole and one function changed, as a user's port would differ) is named in
that phase with the parameter or setting. The bugs already named on these pairs elsewhere (the
BERT classifier's attention dropout and pooler backward, a Llama norm's halved gradient:
test_train_real_setup.py, test_train_real_backward.py) are not repeated. Runs only where
transformers and PaddleNLP are installed (the side environment)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SPECS = os.path.join(HERE, "train_specs")

pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

from converter.spec import load_spec  # noqa: E402
from helpers.train import train_check  # noqa: E402

CLEAN_LIMIT = 0.8  # the largest clean ratio allowed in any phase: well within budget, not at its edge
PHASES = ("structure", "loss", "backward", "lr", "optimizer", "steps")


@pytest.mark.parametrize("name", ["bart_lm", "bert_classifier", "llama_lm", "llama_lm_tied"])
def test_a_clean_pair_passes_ten_training_steps(tmp_path, name):
    """`verify-port --spec SPEC --train --steps 10`, the installed console script in a fresh process."""
    out = tmp_path / "report.json"
    script = os.path.join(os.path.dirname(sys.executable), "verify-port")
    r = subprocess.run([script, "--spec", os.path.join(SPECS, f"{name}.py"), "--train", "--steps", "10",
                        "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    train = json.loads(out.read_text())["train"]
    assert train["verdict"] == "pass" and train["first_bad"] is None
    phases = {p["phase"]: p for p in train["phases"]}
    assert all(phases[p]["verdict"] in ("pass", "not compared") for p in phases), phases
    for phase in ("loss", "backward", "lr", "optimizer", "steps"):
        assert phases[phase]["checks"] > 0 and phases[phase]["verdict"] == "pass", phases[phase]
        worst = phases[phase]["worst"]["ratio"] if phases[phase]["worst"] else 0.0
        assert worst < CLEAN_LIMIT, (phase, phases[phase]["worst"])
    assert len(train["steps"]) == 10


def _planted(tmp_path, clean: str, change: str, steps: int = 4):
    """The report of `clean`'s spec with `change` (Python defining one function anew) after it."""
    path = tmp_path / f"{clean}_planted.py"
    path.write_text(f"import sys\nsys.path[:0] = [{SPECS!r}, {HERE!r}]\nfrom {clean} import *  # noqa\n"
                    f"from {clean} import paddle_model as clean_paddle_model  # noqa\n" + textwrap.dedent(change))
    return train_check(load_spec(str(path)), steps=steps, device="cpu")


def _named(report, phase: str, kind: str | None, *words):
    fb = report.first_bad
    assert fb is not None and fb.phase == phase, fb
    text = " ".join(f"{d.kind} {d.layer} {d.cause} {d.hint}" for d in report.diagnosis) + f" {fb.torch} {fb.note}"
    if kind is not None:
        assert any(d.kind == kind for d in report.diagnosis), report.diagnosis
    for w in words:
        assert w in text, (w, text)
    assert report.exit_code == 1


# a buffer the paddle port updates in every training-mode forward (a running scale on its outputs):
# the first step agrees, the later ones drift
RUNNING_SCALE = '''
import paddle


def with_running_scale(layer):
    layer.register_buffer("running_scale", paddle.ones([1]), persistable=False)

    def scaled(module, args, output):
        out = output * module.running_scale
        if module.training:
            module.running_scale.set_value(module.running_scale * 1.05)
        return out
    layer.register_forward_post_hook(scaled)
    return layer
'''

# the identity whose gradient is halved, on a layer's input: a custom backward with a wrong scale
HALF_GRADIENT = '''
import types
import paddle


class HalfGradient(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy * 0.5


def half_gradient_into(layer):
    forward = layer.forward
    layer.forward = lambda x, *a, **k: forward(HalfGradient.apply(x), *a, **k)
    return layer
'''

# BART's optimizer written in paddle by hand, as torch's is: AdamW, betas (0.9, 0.98), a linear warmup
BART_ADAMW = '''
def paddle_adamw(model, warmup=WARMUP, beta2=0.98):
    import paddle
    decay = paddle.optimizer.lr.LinearLR(1e-3, total_steps=STEPS - WARMUP, start_factor=1.0, end_factor=0.1)
    scheduler = paddle.optimizer.lr.LinearWarmup(decay, warmup_steps=warmup, start_lr=2.5e-4, end_lr=1e-3)
    return paddle.optimizer.AdamW(scheduler, beta1=0.9, beta2=beta2, epsilon=1e-8, weight_decay=0.01,
                                  parameters=model.parameters()), scheduler
'''

BART = {
    "structure": ('''
def paddle_model():
    return F.bart_lm_paddle(**dict(DROPOUT, attention_dropout=0.2))
''', "dropout", ["dropout rates differ", "0.1", "0.2"]),
    "loss": ('''
def paddle_loss(logits, labels):
    import paddle
    logits, labels = logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1])
    keep = labels != PAD
    return paddle.nn.functional.cross_entropy(logits[keep], labels[keep], label_smoothing=0.2)
''', "cross entropy", ["label smoothing 0.2", "torch's has 0.1"]),
    "loss-ignore-index": ('''
def paddle_loss(logits, labels):
    import paddle
    return paddle.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1]),
                                              ignore_index=PAD, label_smoothing=SMOOTHING)
''', "cross entropy", ["label_smoothing=0.1 and ignore_index=0 ignores no position"]),
    "backward": (HALF_GRADIENT + '''
def paddle_model():
    model = clean_paddle_model()
    half_gradient_into(model.bart.decoder.decoder.layers[1].linear2)
    return model
''', "custom backward", ["model.decoder.layers.1.fc2"]),
    "lr": (BART_ADAMW + '''
def paddle_optimizer(model):
    return paddle_adamw(model, warmup=WARMUP + 1)
''', "warmup", ["warmup"]),
    "optimizer": (BART_ADAMW + '''
def paddle_optimizer(model):
    return paddle_adamw(model, beta2=0.999)
''', None, ["beta2"]),
    "steps": (RUNNING_SCALE + '''
def paddle_model():
    model = clean_paddle_model()
    with_running_scale(model)
    return model
''', None, ["loss"]),
}


@pytest.mark.parametrize("plant", list(BART))
def test_a_bug_planted_in_the_encoder_decoder_is_named_in_its_phase(tmp_path, plant):
    change, kind, words = BART[plant]
    phase = plant.split("-")[0]
    _named(_planted(tmp_path, "bart_lm", change), phase, kind, *words)


BERT = {
    "loss": ('''
def paddle_loss(logits, target):
    import paddle
    return paddle.nn.functional.cross_entropy(logits, target, reduction="sum")
''', "cross entropy", ["reduced by 'sum'"]),
    "lr": ('''
def paddle_optimizer(model):
    import paddle
    scheduler = paddle.optimizer.lr.LambdaDecay(1e-3, lambda step: min(1.0, (step + 2) / (WARMUP + 1)))
    names = {p.name: n for n, p in model.named_parameters()}
    return paddle.optimizer.AdamW(scheduler, parameters=model.parameters(), weight_decay=0.01,
                                  apply_decay_param_fun=lambda name: decays(names[name]),
                                  grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_grad_norm)), scheduler
''', "scheduler step", ["one step early"]),
    "optimizer": ('''
def paddle_optimizer(model):
    import paddle
    scheduler = paddle.optimizer.lr.LambdaDecay(1e-3, lambda step: min(1.0, (step + 1) / (WARMUP + 1)))
    return paddle.optimizer.AdamW(scheduler, parameters=model.parameters(), weight_decay=0.01,
                                  grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_grad_norm)), scheduler
''', None, ["weight"]),
    "steps": (RUNNING_SCALE + '''
def paddle_model():
    model = clean_paddle_model()
    with_running_scale(model.classifier)
    return model
''', None, ["loss"]),
}


@pytest.mark.parametrize("plant", list(BERT))
def test_a_bug_planted_in_the_bert_classifier_is_named_in_its_phase(tmp_path, plant):
    change, kind, words = BERT[plant]
    _named(_planted(tmp_path, "bert_classifier", change), plant, kind, *words)


# the Llama optimizer written in paddle by hand, as torch's is: AdamW, a linear warmup into a cosine decay
LLAMA_ADAMW = '''
def paddle_adamw(model, warmup=WARMUP, kind="AdamW"):
    import paddle
    cosine = paddle.optimizer.lr.CosineAnnealingDecay(2e-3, T_max=STEPS - WARMUP)
    scheduler = paddle.optimizer.lr.LinearWarmup(cosine, warmup_steps=warmup, start_lr=2e-4, end_lr=2e-3)
    return getattr(paddle.optimizer, kind)(scheduler, weight_decay=0.1, parameters=model.parameters()), scheduler
'''

LLAMA = {
    "structure": ('''
def paddle_model():
    model = clean_paddle_model()
    model.llama.norm.weight.stop_gradient = True
    return model
''', "trainable", ["llama.norm.weight"]),
    "loss": ('''
def paddle_loss(output, tokens):
    import paddle
    logits = output[0] if isinstance(output, (tuple, list)) else output
    return paddle.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), tokens.reshape([-1]))
''', "cross entropy", ["label shift"]),
    "lr": (LLAMA_ADAMW + '''
def paddle_optimizer(model):
    return paddle_adamw(model, warmup=WARMUP - 1)
''', "warmup", ["warmup"]),
    "optimizer": (LLAMA_ADAMW + '''
def paddle_optimizer(model):
    return paddle_adamw(model, kind="Adam")
''', None, ["weight decay"]),
    "steps": (RUNNING_SCALE + '''
def paddle_model():
    model = clean_paddle_model()
    with_running_scale(model.llama.norm)
    return model
''', None, ["loss"]),
}


@pytest.mark.parametrize("plant", list(LLAMA))
def test_a_bug_planted_in_the_causal_lm_is_named_in_its_phase(tmp_path, plant):
    change, kind, words = LLAMA[plant]
    _named(_planted(tmp_path, "llama_lm", change), plant, kind, *words)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
