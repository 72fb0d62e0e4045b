"""RNN/LSTM/GRU: the same flat names (weight_ih_l0, ..._reverse) and gate order on both sides.

paddle also lists alias keys (`0.cell.weight_ih`) on the same tensors; the walker
adds those as aliases, so the entry covers paddle's internal cell sublayers."""

from . import Family, PortedLayer, register


def _rnn(pair: PortedLayer) -> None:
    m = pair.torch_module
    if getattr(m, "proj_size", 0):
        pair.unsupported("LSTM proj_size has no paddle LSTM counterpart")
    for name in pair.torch_keys():
        pair.rename(name)


register(Family("rnn", ("RNN", "LSTM", "GRU"), ("SimpleRNN", "LSTM", "GRU"), _rnn, owns_children=True))
