"""torch MultiheadAttention (fused in_proj [3E, E]) to paddle MultiHeadAttention (q/k/v_proj Linear).

out_proj is a Linear child on both sides and is paired by the walker."""

from . import Family, PortedLayer, register

_QKV = ["q_proj", "k_proj", "v_proj"]


def _mha(pair: PortedLayer) -> None:
    m = pair.torch_module
    if getattr(m, "bias_k", None) is not None or getattr(m, "add_zero_attn", False):
        pair.unsupported("add_bias_kv / add_zero_attn have no paddle MultiHeadAttention counterpart")
    pair.split("in_proj_weight", [f"{n}.weight" for n in _QKV], axis=0, transpose=True)
    pair.split("in_proj_bias", [f"{n}.bias" for n in _QKV], axis=0)
    for n in _QKV:  # separate projections when kdim/vdim differ from embed_dim
        pair.rename(f"{n}_weight", f"{n}.weight", transpose=True)


register(Family("multihead-attention", ("MultiheadAttention",), ("MultiHeadAttention",), _mha))
