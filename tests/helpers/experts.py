"""A mixture of experts' output, in torch and in paddle: each token's output is the sum over its
top-k choices of the choice's weight times that expert's output (every expert runs on every token,
its output kept where the token chose it)."""


def torch_mixture(flat, index, weights, experts):
    """flat [tokens, hidden]; index and weights [tokens, k]: the chosen experts and their weights."""
    import torch
    out = torch.zeros_like(flat)
    for k in range(index.shape[1]):
        for e, expert in enumerate(experts):
            weight = torch.where(index[:, k] == e, weights[:, k], torch.zeros_like(weights[:, k]))
            out = out + weight[:, None] * expert(flat)
    return out


def paddle_mixture(flat, index, weights, experts):
    """As torch_mixture, on paddle tensors."""
    import paddle
    out = paddle.zeros_like(flat)
    for k in range(index.shape[1]):
        for e, expert in enumerate(experts):
            weight = paddle.where(index[:, k] == e, weights[:, k], paddle.zeros_like(weights[:, k]))
            out = out + weight.unsqueeze(-1) * expert(flat)
    return out
