"""Training pair: a small CNN with BatchNorm, trained with SGD with momentum and a step schedule."""

import numpy as np
import paddle
import torch

B, C, S, K = 6, 3, 8, 4


class TorchCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(C, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, K)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


class PaddleCNN(paddle.nn.Layer):
    def __init__(self, momentum=0.9):
        super().__init__()
        self.conv = paddle.nn.Conv2D(C, 8, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(8, momentum=momentum)
        self.conv2 = paddle.nn.Conv2D(8, 8, 3, stride=2, padding=1)
        self.bn2 = paddle.nn.BatchNorm2D(8)
        self.head = paddle.nn.Linear(8, K)

    def forward(self, x):
        x = paddle.nn.functional.relu(self.bn(self.conv(x)))
        x = paddle.nn.functional.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(axis=(2, 3)))


def torch_model():
    torch.manual_seed(0)
    return TorchCNN()


def paddle_model():
    return PaddleCNN()


def inputs():
    return (np.random.default_rng(0).standard_normal((B, C, S, S)).astype(np.float32),)


def batches():
    rng = np.random.default_rng(2)
    return [((rng.standard_normal((B, C, S, S)).astype(np.float32),), rng.integers(0, K, B).astype(np.int64))
            for _ in range(5)]


def torch_loss(output, target):
    return torch.nn.functional.cross_entropy(output, target)


def paddle_loss(output, target):
    return paddle.nn.functional.cross_entropy(output, target)


def torch_optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
