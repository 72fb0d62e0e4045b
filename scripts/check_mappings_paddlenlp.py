"""Check every shipped rule set, and the model-directory conversion, against PaddleNLP 2.8.1's own
model classes.

For each case an HF model is built from a small config with random weights (Linear weights
N(0, 1/fan_in), norm weights 1 + N(0, 0.1), biases N(0, 0.02)) and saved as HF saves it
(`pytorch_model.bin`, `model.safetensors`, or sharded with an index). Then:

* weights: `convert-weights --target paddlenlp` with no --mapping (the rule set is detected from the keys) ->
  `paddle.load` -> the PaddleNLP class built from the translated config -> `set_state_dict`;
* directories: `convert-weights HF_DIR OUT_DIR --target paddlenlp` -> PaddleNLP's `AutoModel.from_pretrained(OUT_DIR)`;

and both models run on the same tokens. Printed per case: the rule set detected, missing /
unexpected keys, max |paddle - HF fp32| with the output's scale, and that difference against
HF's own fp32 error (|paddle - HF fp64| / |HF fp32 - HF fp64|; about 1 is fp32 noise).

PaddleNLP is never a dependency of this project: run this in a separate virtual environment:

    python -m venv /tmp/nlpvenv
    /tmp/nlpvenv/bin/pip install -c constraints.txt torch paddlepaddle paddlenlp==2.8.1 \
        huggingface_hub==0.24.7 transformers==4.44.2 "aistudio-sdk<0.2" "datasets<3" "pyarrow<17" "numpy<2" \
        safetensors click tqdm
    PYTHONPATH=. /tmp/nlpvenv/bin/python scripts/check_mappings_paddlenlp.py [--only FAMILY]
"""

import argparse
import copy
import json
import inspect
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402
import transformers as hf  # noqa: E402
from paddlenlp import transformers as nlp  # noqa: E402

from converter.convert import convert  # noqa: E402
from converter.hf.config import translate_config  # noqa: E402

VOCAB = 300
RECORDED = None
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


@dataclass
class Case:
    family: str  # the rule set expected to be detected
    hf_class: str
    config: object  # the HF config
    how: str = "bin"  # bin | safetensors | sharded
    choices: int = 0  # multiple choice: inputs [B, choices, T]
    same_file: tuple = ()  # other rule sets detection may name instead, writing the same file
    note: str = ""
    tolerated: tuple = ()  # unexpected keys known and said in the README


def weight_cases():
    bert = hf.BertConfig(**SMALL, num_labels=3)
    yield Case("bert", "BertModel", bert, same_file=("roberta",))
    yield Case("bert", "BertForSequenceClassification", bert)
    gpt = hf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, n_inner=128,
                        activation_function="gelu_new")
    yield Case("gpt2", "GPT2Model", gpt)
    yield Case("gpt2", "GPT2LMHeadModel", gpt)
    yield Case("gpt2", "GPT2LMHeadModel", gpt, "safetensors")
    llama = hf.LlamaConfig(**SMALL, num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=128)
    yield Case("llama", "LlamaForCausalLM", llama)
    yield Case("llama", "LlamaForCausalLM", llama, "sharded")

    v3 = dict(SMALL, num_labels=3, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16,
              norm_rel_ebd="layer_norm", share_att_key=True, conv_kernel_size=3, conv_act="gelu",
              position_biased_input=False, type_vocab_size=0, max_relative_positions=-1)
    sep = dict(SMALL, num_labels=3, relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=False,
               position_biased_input=True, type_vocab_size=2, embedding_size=32, max_relative_positions=32)
    deberta = hf.DebertaV2Config(**v3)
    yield Case("deberta-v2", "DebertaV2Model", deberta)
    yield Case("deberta-v2", "DebertaV2Model", hf.DebertaV2Config(**sep), "safetensors", note="separate pos projections, embed_proj")
    yield Case("deberta-v2", "DebertaV2Model", hf.DebertaV2Config(**dict(v3, hidden_size=1536, num_attention_heads=24,
                                                                          num_hidden_layers=1, intermediate_size=256)),
               note="1536 wide: square 1536x1536 query_proj")
    yield Case("deberta-v2", "DebertaV2ForSequenceClassification", deberta, "safetensors")
    yield Case("deberta-v2", "DebertaV2ForTokenClassification", deberta)
    yield Case("deberta-v2", "DebertaV2ForQuestionAnswering", hf.DebertaV2Config(**dict(v3, num_labels=2)))
    yield Case("deberta-v2", "DebertaV2ForMultipleChoice", deberta, choices=2)
    yield Case("deberta-v2", "DebertaV2ForSequenceClassification", hf.DebertaV2Config(**sep), "sharded")

    roberta = hf.RobertaConfig(**SMALL, num_labels=3, type_vocab_size=1, max_position_embeddings=130)
    yield Case("roberta", "RobertaModel", roberta, same_file=("bert",))
    yield Case("roberta", "RobertaForSequenceClassification", roberta, "safetensors")
    yield Case("roberta", "RobertaForTokenClassification", roberta)
    yield Case("roberta", "RobertaForQuestionAnswering", hf.RobertaConfig(**SMALL, type_vocab_size=1,
                                                                           max_position_embeddings=130))
    yield Case("roberta", "RobertaForMaskedLM", roberta)
    yield Case("roberta", "RobertaForMaskedLM", roberta, "safetensors")
    yield Case("roberta", "RobertaForMultipleChoice", roberta, choices=2)

    electra = hf.ElectraConfig(**SMALL, embedding_size=32, num_labels=3)
    yield Case("electra", "ElectraModel", electra)
    yield Case("electra", "ElectraModel", hf.ElectraConfig(**SMALL, embedding_size=64), same_file=("bert", "roberta"),
               note="embedding_size = hidden_size: no embeddings_project")
    yield Case("electra", "ElectraForSequenceClassification", electra, "safetensors")
    yield Case("electra", "ElectraForTokenClassification", electra)
    yield Case("electra", "ElectraForQuestionAnswering", hf.ElectraConfig(**SMALL, embedding_size=32))
    yield Case("electra", "ElectraForPreTraining", electra)
    yield Case("electra", "ElectraForMaskedLM", electra)
    yield Case("electra", "ElectraForMultipleChoice", electra, choices=2)

    t5 = dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
              relative_attention_num_buckets=8)
    yield Case("t5", "T5ForConditionalGeneration", hf.T5Config(**t5), "safetensors", note="tied (v1.0)")
    yield Case("t5", "T5ForConditionalGeneration", hf.T5Config(**t5), "bin", tolerated=("lm_head.weight",),
               note="tied (v1.0): the .bin keeps lm_head, which PaddleNLP's tied model does not take")
    yield Case("t5", "T5ForConditionalGeneration", hf.T5Config(**t5, feed_forward_proj="gated-gelu",
                                                                tie_word_embeddings=False), note="untied (v1.1)")
    yield Case("t5", "T5ForConditionalGeneration", hf.T5Config(**t5, feed_forward_proj="gated-gelu",
                                                                tie_word_embeddings=False), "sharded", note="untied (v1.1)")

    opt = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
               max_position_embeddings=64, word_embed_proj_dim=64)
    yield Case("opt", "OPTModel", hf.OPTConfig(**opt))
    yield Case("opt", "OPTForCausalLM", hf.OPTConfig(**opt))
    yield Case("opt", "OPTForCausalLM", hf.OPTConfig(**opt), "safetensors")
    yield Case("opt", "OPTModel", hf.OPTConfig(**dict(opt, word_embed_proj_dim=32, do_layer_norm_before=False)),
               note="350m-like: post-LN, project_in/out")

    bloom = hf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, num_labels=3, pad_token_id=0)
    yield Case("bloom", "BloomModel", bloom)
    yield Case("bloom", "BloomForCausalLM", bloom, "safetensors")
    yield Case("bloom", "BloomForSequenceClassification", bloom)
    yield Case("bloom", "BloomForTokenClassification", bloom)

    mixtral = hf.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=128)
    yield Case("mixtral", "MixtralForCausalLM", mixtral)
    yield Case("mixtral", "MixtralForCausalLM", mixtral, "sharded")


def directory_cases():
    """Bare models through a directory: config.json translated, weights converted, AutoModel.from_pretrained."""
    for case in weight_cases():
        if "For" not in case.hf_class and "LMHead" not in case.hf_class and not case.note.startswith("1536"):
            yield case
    yield Case("llama", "LlamaModel", hf.LlamaConfig(**SMALL, num_key_value_heads=2, max_position_embeddings=128), "sharded")
    yield Case("mixtral", "MixtralModel", hf.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4,
                                                           num_experts_per_tok=2, max_position_embeddings=128), "safetensors")
    yield Case("t5", "T5Model", hf.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                            relative_attention_num_buckets=8), "sharded")


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif p.ndim == 1:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model


def save(model, how, directory):
    """As HF writes it; returns the path to hand convert-weights (a file, or the index of a sharded checkpoint)."""
    if how == "bin":
        model.save_pretrained(directory, safe_serialization=False)
        return os.path.join(directory, "pytorch_model.bin")
    if how == "safetensors":
        model.save_pretrained(directory, safe_serialization=True)
        return os.path.join(directory, "model.safetensors")
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="100KB")
    return os.path.join(directory, "model.safetensors.index.json")


def inputs(case, seed=0):
    rng = np.random.default_rng(seed)
    shape = (2, case.choices, 12) if case.choices else (2, 12)
    x = {"input_ids": rng.integers(3, VOCAB, shape)}  # ids 0-2 are pad/bos/eos in these families
    if case.family == "t5":
        x["decoder_input_ids"] = rng.integers(3, VOCAB, (2, 7))
    return x


def hf_main(out):
    for attr in ("logits", "start_logits", "last_hidden_state"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    return out[0]


def paddle_main(model, x):
    kwargs = {k: paddle.to_tensor(v) for k, v in x.items()}
    if "return_dict" in inspect.signature(model.forward).parameters:
        kwargs["return_dict"] = True
    out = model(**kwargs)
    for attr in ("logits", "start_logits", "last_hidden_state"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def mixtral_moe_forward(self, hidden_states):
    """PaddleNLP 2.8.1's MixtralSparseMoeBlock.forward with one index made 2-D: under paddle 3.3.1
    paddle.where returns 1-D indices, so the routing weights were [N] against [N, H]."""
    import paddle.nn.functional as F
    batch_size, seq_len, hidden_dim = hidden_states.shape
    hidden_states = hidden_states.reshape([-1, hidden_dim])
    router_logits = self.gate(hidden_states)
    routing = F.softmax(router_logits.astype("float32"), axis=1)
    routing, chosen = paddle.topk(routing, self.top_k, axis=-1)
    routing = (routing / routing.sum(axis=-1, keepdim=True)).astype(hidden_states.dtype)
    final = paddle.zeros([batch_size * seq_len, hidden_dim], dtype=hidden_states.dtype)
    mask = F.one_hot(chosen, num_classes=self.num_experts).transpose([2, 1, 0])
    for expert_id in range(self.num_experts):
        slot, token = paddle.where(mask[expert_id])
        slot, token = slot.reshape([-1]), token.reshape([-1])
        if token.shape[0] == 0:
            continue
        out = self.experts[expert_id](paddle.gather(hidden_states, token)) * routing[token, slot].reshape([-1, 1])
        final.index_add_(token, 0, out.astype(hidden_states.dtype))
    return final.reshape([batch_size, seq_len, hidden_dim]), router_logits


def shim_mixtral():
    from paddlenlp.transformers.mixtral import modeling
    modeling.MixtralSparseMoeBlock.forward = mixtral_moe_forward


def compare(hf_model, pd_model, x):
    """(max |paddle - HF fp32|, output scale, ratio to HF's own fp32 error against fp64)."""
    hf_model.eval()
    pd_model.eval()
    tx = {k: torch.from_numpy(v) for k, v in x.items()}
    with torch.no_grad():
        y32 = hf_main(hf_model(**tx)).numpy()
        try:
            y64 = hf_main(copy.deepcopy(hf_model).double()(**tx)).numpy()
        except RuntimeError:  # HF's OPT cannot run in float64 (its mask's minimum overflows float32)
            y64 = None
    yp = paddle_main(pd_model, x).numpy()
    if yp.shape != y32.shape:
        return float("inf"), float(np.abs(y32).max()), float("inf")
    err = float(np.abs(yp - y32).max())
    if y64 is None:
        return err, float(np.abs(y32).max()), float("nan")
    own = float(np.abs(y32 - y64).max())
    return err, float(np.abs(y32).max()), float(np.abs(yp - y64).max()) / max(own, 1e-30)


def detected(lines):
    for line in lines:
        if line.startswith("mapping: detected '"):
            return line.split("'")[1]
    return "?"


def record(case, model, src, dst):
    """The case as the tests replay it without PaddleNLP: HF's keys and shapes, and for each key of
    the converted file the HF key its values came from and whether they were transposed (found by
    value, not from the plan)."""
    from converter.io import open_source
    with open_source(src) as source:
        hf_keys = {k: list(i.shape) for k, i in source.infos.items()}
        by_value = {}
        for k in hf_keys:
            a = np.asarray(source.read(k))
            by_value.setdefault(np.sort(a, axis=None).tobytes(), []).append((k, a))
        out = {}
        for name, b in paddle.load(dst, return_numpy=True).items():
            same = [k for k, a in by_value.get(np.sort(b, axis=None).tobytes(), []) if a.shape == b.shape and np.array_equal(a, b)]
            flipped = [k for k, a in by_value.get(np.sort(b, axis=None).tobytes(), [])
                       if a.ndim == 2 and a.T.shape == b.shape and np.array_equal(a.T, b)]
            if not same and not flipped:
                return None  # a split or merged tensor (gpt2's c_attn): not replayed this way
            # HF ties some tensors (a .bin keeps both names): every key holding these values is listed
            out[name] = [same or flipped, not same, list(b.shape)]
    return {"family": case.family, "hf_class": case.hf_class, "how": case.how, "same_file": list(case.same_file),
            "note": case.note, "hf": hf_keys, "paddle": out}


def run_weights(case, tmp):
    torch.manual_seed(0)
    model = randomize(getattr(hf, case.hf_class)(case.config))
    src = save(model, case.how, os.path.join(tmp, "hf"))
    dst = os.path.join(tmp, "model_state.pdparams")
    log = []
    convert(src, dst, mapping=None, progress=False, log=log.append, target="paddlenlp")
    translated = translate_config(case.config.to_dict(), force=False, target="paddlenlp")
    pd_class = getattr(nlp, translated.family.classes[case.hf_class], None)
    if pd_class is None:
        from importlib import import_module
        pd_class = getattr(import_module(f"paddlenlp.transformers.{case.family.replace('-', '_')}.modeling"),
                           translated.family.classes[case.hf_class])
    pd_model = pd_class(pd_class.config_class(**translated.config))
    missing, unexpected = pd_model.set_state_dict(paddle.load(dst))
    if RECORDED is not None and case.how != "sharded":
        RECORDED.append(record(case, model, src, dst) or {})
    return model, pd_model, detected(log), untied(pd_model, missing), unexpected


def untied(pd_model, missing):
    """The missing keys, less those whose parameter is one the file did fill under another name (a
    tied LM head: HF's model.safetensors leaves it out, and PaddleNLP holds one parameter)."""
    state = pd_model.state_dict()
    filled = {id(state[k]) for k in state if k not in missing}
    return [k for k in missing if id(state[k]) not in filled]


def run_directory(case, tmp):
    from converter.hf.directory import convert_directory
    torch.manual_seed(0)
    model = randomize(getattr(hf, case.hf_class)(case.config))
    save(model, case.how, os.path.join(tmp, "hf"))
    out = os.path.join(tmp, "out")
    log = []
    convert_directory(os.path.join(tmp, "hf"), out, progress=False, log=log.append, target="paddlenlp")
    try:
        pd_model = nlp.AutoModel.from_pretrained(out)
    except AttributeError:  # PaddleNLP 2.8.1's AutoModel has no deberta-v2: its own class loads it
        with open(os.path.join(out, "config.json")) as f:
            pd_model = getattr(nlp, json.load(f)["architectures"][0]).from_pretrained(out)
    return model, pd_model, detected(log), [], []


def report(kind, case, model, pd_model, found, missing, unexpected):
    err, scale, ratio = compare(model, pd_model, inputs(case))
    found_ok = found == case.family or found in case.same_file or kind == "dir"
    unexpected = [k for k in unexpected if k not in case.tolerated]
    ok = found_ok and not missing and not unexpected and err <= 2e-5 * max(scale, 1.0)
    print(f"{kind:4s} {case.family:10s} {case.how:11s} {case.hf_class:36s} -> {type(pd_model).__name__:36s} "
          f"detected={found:10s} missing={len(missing)} unexpected={len(unexpected)} max|diff|={err:.1e} "
          f"(scale {scale:.2f}) vs-fp64={ratio:.1f} {'OK' if ok else 'FAIL'} {case.note} "
          f"{list(missing)[:3] or ''} {list(unexpected)[:3] or ''}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="one family")
    ap.add_argument("--skip-directories", action="store_true")
    ap.add_argument("--record", metavar="FILE", help="write what the tests replay (tests/unit/rules/test_families_recorded.json)")
    args = ap.parse_args()
    global RECORDED
    RECORDED = [] if args.record else None
    shim_mixtral()
    failures = total = 0
    kinds = [("file", weight_cases, run_weights)] + ([] if args.skip_directories else [("dir", directory_cases, run_directory)])
    for kind, cases, run in kinds:
        for case in cases():
            if args.only and case.family != args.only:
                continue
            total += 1
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    ok = report(kind, case, *run(case, tmp))
                except Exception as exc:  # a failed case is reported and the others still run
                    print(f"{kind:4s} {case.family:10s} {case.how:11s} {case.hf_class:36s} ERROR "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
                    ok = False
            failures += not ok
    print(f"{total - failures} of {total} cases OK, {failures} failed")
    if args.record:
        with open(args.record, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in RECORDED if r) + "\n]\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
