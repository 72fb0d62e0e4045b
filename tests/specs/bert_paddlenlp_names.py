"""The bundled BERT-like torch model (HF names) against a paddle port laid out as PaddleNLP's
BertModel (paddle.nn.TransformerEncoder: self_attn.q_proj, linear1, norm1, ...). The names
differ everywhere; the shipped `bert` rule set maps the weights and pairs the layers."""

import paddle

from converter.examples import bert_port as B

mapping = "bert"


class PaddleNLPStyleEmbeddings(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.word_embeddings = paddle.nn.Embedding(B.VOCAB, B.HIDDEN)
        self.position_embeddings = paddle.nn.Embedding(B.MAX_POS, B.HIDDEN)
        self.token_type_embeddings = paddle.nn.Embedding(2, B.HIDDEN)
        self.layer_norm = paddle.nn.LayerNorm(B.HIDDEN, epsilon=1e-12)

    def forward(self, input_ids, token_type_ids):
        pos = paddle.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.layer_norm(x)


class PaddleNLPStyleBert(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embeddings = PaddleNLPStyleEmbeddings()
        layer = paddle.nn.TransformerEncoderLayer(B.HIDDEN, B.HEADS, B.FFN, dropout=0.0, activation="gelu",
                                                  attn_dropout=0.0, act_dropout=0.0, layer_norm_eps=1e-12)
        self.encoder = paddle.nn.TransformerEncoder(layer, B.LAYERS)

    def forward(self, input_ids, token_type_ids):
        return self.encoder(self.embeddings(input_ids, token_type_ids))


def torch_model():
    return B.torch_model()


def paddle_model():
    return PaddleNLPStyleBert()


def inputs():
    return B.inputs()
