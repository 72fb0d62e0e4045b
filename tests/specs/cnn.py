"""A small CNN with BatchNorm (trained running stats), PReLU and a ConvTranspose, ported by hand."""

import numpy as np
import paddle
import torch


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.act = torch.nn.PReLU(8)
        self.down = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.up = torch.nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, groups=2)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = self.act(self.bn(self.stem(x)))
        x = torch.relu(self.bn2(self.down(x)))
        return self.head(self.up(x))


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.stem = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(8)
        self.act = paddle.nn.PReLU(8)
        self.down = paddle.nn.Conv2D(8, 16, 3, stride=2, padding=1, groups=2)
        self.bn2 = paddle.nn.BatchNorm2D(16)
        self.up = paddle.nn.Conv2DTranspose(16, 8, 4, stride=2, padding=1, groups=2)
        self.head = paddle.nn.Conv2D(8, 4, 1)

    def forward(self, x):
        x = self.act(self.bn(self.stem(x)))
        x = paddle.nn.functional.relu(self.bn2(self.down(x)))
        return self.head(self.up(x))


def torch_model():
    torch.manual_seed(3)
    net = TorchNet()
    with torch.no_grad():  # non-trivial running statistics, as after training
        for bn in (net.bn, net.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.num_batches_tracked.fill_(100)
        net.act.weight.uniform_(0.05, 0.4)
    return net


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32),)
