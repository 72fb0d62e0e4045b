"""A MobileNet-style CNN with reflect padding, BatchNorm, ReLU6, AvgPool (count_include_pad) and bilinear Upsample."""

import numpy as np
import paddle
import torch


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1, padding_mode="reflect")
        self.bn = torch.nn.BatchNorm2d(16)
        self.act = torch.nn.ReLU6()
        self.pool = torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=True)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.up = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = torch.nn.Conv2d(16, 4, 1)

    def forward(self, x):
        x = self.pool(self.act(self.bn(self.conv1(x))))
        return self.head(self.up(self.conv2(x)))


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv1 = paddle.nn.Conv2D(3, 16, 3, padding=1, padding_mode="reflect")
        self.bn = paddle.nn.BatchNorm2D(16)
        self.act = paddle.nn.ReLU6()
        self.pool = paddle.nn.AvgPool2D(3, stride=2, padding=1, exclusive=False)
        self.conv2 = paddle.nn.Conv2D(16, 16, 3, padding=1)
        self.up = paddle.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False, align_mode=0)
        self.head = paddle.nn.Conv2D(16, 4, 1)

    def forward(self, x):
        x = self.pool(self.act(self.bn(self.conv1(x))))
        return self.head(self.up(self.conv2(x)))


def torch_model():
    torch.manual_seed(6)
    net = TorchNet()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.3, 0.3)
        net.bn.running_var.uniform_(0.5, 1.5)
        net.bn.weight.uniform_(2.0, 4.0)  # wide activations, so that ReLU6 clips
    return net


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.random.default_rng(6).standard_normal((2, 3, 24, 24)).astype(np.float32),)
