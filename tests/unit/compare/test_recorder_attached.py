"""The recorder's attached mode, on which the training checks' backward phase records torch's forward:
inputs kept as detached copies, outputs kept attached to the graph with their gradients retained,
every call of a module counted."""

import torch

from converter.compare.capture import Recorder, record
from converter.frameworks import torch_side


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.shared = torch.nn.Linear(4, 4)
        self.frozen = torch.nn.Linear(4, 4).requires_grad_(False)

    def forward(self, x):
        z = x.detach().clone()
        out = self.shared(self.shared(self.fc(x))) + self.frozen(z)
        z.mul_(0)  # an in-place change after the call: what was recorded stays as it was received
        return out


def _recorded(paths, attached=True):
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(3, 4)
    recorder = record(torch_side, net, Recorder(paths, attached=attached))
    try:
        out = net(x)
    finally:
        recorder.remove()
    return net, x, out, recorder


def test_outputs_stay_on_the_graph_with_their_gradients():
    net, x, out, recorder = _recorded({"fc", "shared", "frozen"})
    g = torch.randn(3, 4)
    out.backward(g)
    shared = recorder.calls["shared"]
    assert shared.count == 2 and recorder.calls["fc"].count == 1
    assert shared.outputs[0].grad is not None and shared.outputs[0].grad_fn is not None
    # the first call's output feeds the second: its gradient is the second call's input gradient
    assert torch.allclose(shared.outputs[0].grad, g @ net.shared.weight)
    assert recorder.calls["frozen"].outputs == []  # it requires no gradient: nothing kept
    assert not net.fc._forward_hooks and not net.fc._forward_pre_hooks


def test_inputs_are_detached_copies_of_what_the_call_received():
    net, x, out, recorder = _recorded({"fc", "shared", "frozen"})
    shared_in = recorder.calls["shared"].args[0]
    assert shared_in.grad_fn is None and not shared_in.requires_grad
    assert torch.equal(shared_in, net.fc(x).detach())
    assert torch.equal(recorder.calls["frozen"].args[0], x)  # as received, before the in-place change
    assert torch.equal(recorder.calls["fc"].args[0], x) and recorder.calls["fc"].args[0] is not x


def test_a_tensor_passed_twice_stays_one_copy():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bilinear = torch.nn.Bilinear(4, 4, 2)

        def forward(self, x):
            return self.bilinear(x, x)

    net, x = Twice(), torch.randn(3, 4)
    recorder = record(torch_side, net, Recorder({"bilinear"}, attached=True))
    try:
        net(x)
    finally:
        recorder.remove()
    a, b = recorder.calls["bilinear"].args
    assert a is b and a is not x and torch.equal(a, x)


def test_without_attached_outputs_are_detached_and_calls_still_counted():
    net, x, out, recorder = _recorded({"shared"}, attached=False)
    kept = recorder.calls["shared"].outputs[0]
    assert kept.grad_fn is None and recorder.calls["shared"].count == 2
