"""Check the shipped rule sets (bert, gpt2, llama) against PaddleNLP's own model classes.

Builds each HF model from a small config with random weights, converts its checkpoint
with `--mapping NAME`, loads the result into the PaddleNLP model built from the same
config, and compares outputs on the same tokens. PaddleNLP is never a dependency of
this project: run this in a separate virtual environment (see README):

    python -m venv /tmp/nlpvenv
    /tmp/nlpvenv/bin/pip install -c constraints.txt torch paddlepaddle paddlenlp==2.8.1 \
        huggingface_hub==0.24.7 transformers==4.44.2 "aistudio-sdk<0.2" "datasets<3" "pyarrow<17" "numpy<2" \
        safetensors click tqdm
    PYTHONPATH=. /tmp/nlpvenv/bin/python scripts/check_mappings_paddlenlp.py
"""

import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402
import transformers as hf  # noqa: E402
from paddlenlp import transformers as nlp  # noqa: E402

from converter.convert import convert  # noqa: E402

SMALL = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def cases():
    bert_hf = hf.BertConfig(**SMALL, hidden_act="gelu")
    bert_pd = nlp.BertConfig(**SMALL, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    yield "bert", hf.BertModel(bert_hf), nlp.BertModel(bert_pd), "bin"
    yield "bert", hf.BertForSequenceClassification(bert_hf), nlp.BertForSequenceClassification(bert_pd), "bin"
    gpt_hf = hf.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128, n_inner=128,
                            activation_function="gelu_new")
    gpt_pd = nlp.GPTConfig(**SMALL, max_position_embeddings=128, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    yield "gpt2", hf.GPT2Model(gpt_hf), nlp.GPTModel(gpt_pd), "bin"
    yield "gpt2", hf.GPT2LMHeadModel(gpt_hf), nlp.GPTForCausalLM(gpt_pd), "bin"
    yield "gpt2", hf.GPT2LMHeadModel(gpt_hf), nlp.GPTForCausalLM(gpt_pd), "safetensors"
    llama = dict(SMALL, num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=128)
    yield "llama", hf.LlamaForCausalLM(hf.LlamaConfig(**llama)), nlp.LlamaForCausalLM(nlp.LlamaConfig(**llama)), "bin"


def first(out):
    """The main output: logits when there are some, else the last hidden state."""
    if isinstance(out, (tuple, list)):
        return out[0]
    for attr in ("logits", "last_hidden_state"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    return out


def main():
    failures = 0
    ids = np.random.default_rng(0).integers(1, 300, (2, 16))  # 0 is the pad id PaddleNLP masks
    for name, hf_model, pd_model, how in cases():
        torch.manual_seed(0)
        hf_model.eval()
        with tempfile.TemporaryDirectory() as tmp:
            if how == "safetensors":  # as HF writes model.safetensors: tied weights (lm_head) left out
                hf_model.save_pretrained(tmp, safe_serialization=True)
                src = os.path.join(tmp, "model.safetensors")
            else:  # pytorch_model.bin keeps the tied weights
                src = os.path.join(tmp, "pytorch_model.bin")
                torch.save(hf_model.state_dict(), src)
            dst = os.path.join(tmp, "model.pdparams")
            convert(src, dst, mapping=name, progress=False)
            state = paddle.load(dst)
        missing, unexpected = pd_model.set_state_dict(state)
        pd_model.eval()
        with torch.no_grad():
            y_hf = first(hf_model(torch.from_numpy(ids))).numpy()
        y_pd = first(pd_model(paddle.to_tensor(ids)))
        y_pd = (y_pd[0] if isinstance(y_pd, (tuple, list)) else y_pd).numpy()
        err = float(np.abs(y_hf - y_pd).max()) if y_hf.shape == y_pd.shape else float("inf")
        scale = float(np.abs(y_hf).max())
        ok = not missing and not unexpected and err <= 1e-4 * max(scale, 1.0)
        failures += not ok
        print(f"{name:6s} {os.path.basename(src):18s} {type(hf_model).__name__:30s} -> {type(pd_model).__name__:32s} "
              f"missing={len(missing)} unexpected={len(unexpected)} max|diff|={err:.2e} (output scale {scale:.2f}) "
              f"{'OK' if ok else 'FAIL'} {missing[:3]} {unexpected[:3]}")
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
