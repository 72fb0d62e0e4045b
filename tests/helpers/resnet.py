"""torchvision-style ResNet blocks (ReLU(inplace=True), `out += identity`): tensors changed in
place after the layer that made them."""

import paddle
import torch


class TorchBasicBlock(torch.nn.Module):  # torchvision's BasicBlock: ReLU(inplace=True) and out += identity
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out += x
        return self.relu(out)


class PaddleBasicBlock(paddle.nn.Layer):
    def __init__(self, epsilon=1e-5, where="bn2"):
        super().__init__()
        eps = {where: epsilon}
        self.conv1 = paddle.nn.Conv2D(8, 8, 3, padding=1, bias_attr=False)
        self.bn1 = paddle.nn.BatchNorm2D(8, epsilon=eps.get("bn1", 1e-5))
        self.conv2 = paddle.nn.Conv2D(8, 8, 3, padding=1, bias_attr=False)
        self.bn2 = paddle.nn.BatchNorm2D(8, epsilon=eps.get("bn2", 1e-5))
        self.relu = paddle.nn.ReLU()

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out += x
        return self.relu(out)


def resnet_like(torch_side: bool, bug: str | None = None):
    """A stem (conv, BatchNorm, ReLU(inplace=True) on the torch side) and three basic blocks, as
    torchvision builds them; `bug`: the BatchNorm given epsilon 1e-3 on the paddle side, as a path."""
    eps = lambda path: 1e-3 if path == bug else 1e-5
    if torch_side:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(inplace=True), *[TorchBasicBlock() for _ in range(3)])
        for bn in (b for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
        return m
    def block(i):
        where = next((w for w in ("bn1", "bn2") if bug == f"{i}.{w}"), "bn1")
        return PaddleBasicBlock(eps(f"{i}.{where}"), where)
    blocks = [block(i) for i in range(3, 6)]
    return paddle.nn.Sequential(paddle.nn.Conv2D(8, 8, 3, padding=1, bias_attr=False),
                                paddle.nn.BatchNorm2D(8, epsilon=eps("1")), paddle.nn.ReLU(), *blocks)
