"""verify-port --train spec: llama_lm.py with the output head tied to the token embedding on both
sides: HF ties `lm_head.weight` to `model.embed_tokens.weight` (tie_word_embeddings); PaddleNLP's
LlamaLMHead keeps a [hidden, vocab] weight of its own whatever the config says, so the port holds
the embedding's own Parameter in its head and multiplies by its transpose.

    verify-port --spec tests/real_models/train_specs/llama_lm_tied.py --train --steps 10
"""

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import families as F  # noqa: E402
from llama_lm import batches, inputs, paddle_loss, torch_loss, torch_optimizer  # noqa: E402,F401

# the shipped llama rules, the head left untransposed: it is the embedding's own tensor on both sides
mapping = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_tied.json")


def torch_model():
    hf = F._hf()
    config = hf.LlamaConfig(**dict(F.LLAMA, tie_word_embeddings=True), attn_implementation="eager", use_cache=False)
    return F.randomize(hf.LlamaForCausalLM(config))


def _tied_head(self, hidden_states, tensor_parallel_output=None):
    import paddle
    return paddle.matmul(hidden_states, self.weight, transpose_y=True)


def paddle_model():
    model = F.llama_paddle(tie_word_embeddings=True)
    head = model.lm_head
    head.weight = model.llama.embed_tokens.weight
    head.forward = types.MethodType(_tied_head, head)
    return model
