"""The seed story for training: the CNN pair whose paddle BatchNorm keeps torch's momentum value
(0.1), which paddle reads in its own convention (weight of the old statistic). Run it with
--emulate paddle=tf32: the loss curves then differ by TF32 noise, and the running statistics by a bug."""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location("train_cnn_pair", os.path.join(os.path.dirname(__file__), "train_cnn.py"))
_cnn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cnn)

torch_model, inputs, batches = _cnn.torch_model, _cnn.inputs, _cnn.batches
torch_loss, paddle_loss, torch_optimizer = _cnn.torch_loss, _cnn.paddle_loss, _cnn.torch_optimizer


def paddle_model():
    return _cnn.PaddleCNN(momentum=0.1)
