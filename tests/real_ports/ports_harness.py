"""Run one port through the project's Python API and read its answer.

`verify` runs `verify_port` (device cpu, `--bisect`, one strategy) on a spec made afresh (a
PortSpec builds its models once, so each run gets its own); `convert` saves the torch model's
state dict as `torch.save` does and runs `convert_weights` with the spec (rules inferred from the
two models where its mapping is None). Both turn the tool's exceptions into the exit code the
commands give (UserError: 2, anything else: 3), so that a test states what a user would see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Outcome:
    exit_code: int
    verdict: str | None = None
    named: str | None = None  # the torch module of the first layer over budget
    named_paddle: str | None = None
    causes: list = field(default_factory=list)
    headline: str = ""  # the verdict's first line, or the error's

    def __str__(self):
        return f"exit {self.exit_code}: {self.headline}"


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def verify(make_spec, strategy: str) -> Outcome:
    from converter import UserError, VerifyOptions, verify_port
    from converter.report import render_text
    try:
        report = verify_port(make_spec(), VerifyOptions(device="cpu", strategy=strategy, bisect=True))
    except UserError as e:  # the one line the commands print
        return Outcome(2, headline=e.render())
    except Exception as e:  # noqa: BLE001 - the tool's own failure is the answer
        return Outcome(3, headline=f"{type(e).__name__}: {_first_line(str(e))}")
    forward = report.forward
    text = render_text(report)
    verdict_line = next((line for line in text.splitlines() if line.startswith(("PASS", "FAIL"))), _first_line(text))
    first = forward.first_bad
    return Outcome(report.exit_code, verdict=str(report.verdict),
                   named=first.torch if first is not None else None,
                   named_paddle=first.paddle if first is not None else None,
                   causes=[d.cause for d in forward.diagnosis or []], headline=verdict_line)


@dataclass
class Converted:
    exit_code: int
    headline: str
    result: object = None


def convert(make_spec, tmp_dir) -> Converted:
    """torch.save the torch model's state dict, convert it with the spec, and report."""
    import torch

    from converter import UserError, convert_weights
    spec = make_spec()
    src = os.path.join(tmp_dir, "model.pt")
    torch.save(spec.torch_model().state_dict(), src)
    dst = os.path.join(tmp_dir, "model.pdparams")
    try:
        result = convert_weights(src, dst, spec=make_spec())
    except UserError as e:
        return Converted(2, e.render())
    except Exception as e:  # noqa: BLE001
        return Converted(3, f"{type(e).__name__}: {_first_line(str(e))}")
    return Converted(0 if result.ok else 1, f"{result.tensors} tensors, mapping {result.mapping}, "
                     f"missing {result.missing_keys}, unexpected {result.unexpected_keys}", result)


def outputs_of(make_spec, pdparams: str) -> tuple[np.ndarray, np.ndarray]:
    """Both models' (first) outputs on the spec's inputs, the paddle model loaded from the converted file."""
    import paddle
    import torch
    spec = make_spec()
    torch_model, paddle_model = spec.torch_model(), spec.paddle_model()
    missing, unexpected = paddle_model.set_state_dict(paddle.load(pdparams))
    assert not missing and not unexpected, (missing, unexpected)
    paddle_model.eval()
    inputs = spec.inputs()
    with torch.no_grad():
        if isinstance(inputs, dict):
            t = torch_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
            p = paddle_model(**{k: paddle.to_tensor(v) for k, v in inputs.items()})
        else:
            t = torch_model(*[torch.from_numpy(x) for x in inputs])
            p = paddle_model(*[paddle.to_tensor(x) for x in inputs])
    if isinstance(t, tuple):  # the first output (HF's last hidden state)
        t, p = t[0], p[0]
    return t.numpy(), p.numpy()


def assert_converts_to_torchs_outputs(name: str, make_spec, tmp_dir) -> None:
    """convert-weights with the spec exits 0, and the paddle model loaded from the file gives the
    torch model's outputs, within 1e-4 of their largest value."""
    converted = convert(make_spec, str(tmp_dir))
    assert converted.exit_code == 0, f"{name}: exit {converted.exit_code}: {converted.headline}"
    torch_out, paddle_out = outputs_of(make_spec, os.path.join(str(tmp_dir), "model.pdparams"))
    assert torch_out.shape == paddle_out.shape
    assert np.abs(torch_out - paddle_out).max() <= 1e-4 * np.abs(torch_out).max()


def named_at(name: str, make_spec, culprit: str, strategy: str, diagnosis: str | None = None) -> Outcome:
    """verify-port fails the port and names `culprit` (the torch module) first; under full, with a
    cause holding `diagnosis` where one is given. The outcome, for what else a test asks of it."""
    outcome = verify(make_spec, strategy)
    assert (outcome.exit_code, outcome.verdict, outcome.named) == (1, "fail", culprit), \
        f"{name} --strategy {strategy}: {outcome}"
    if strategy == "full" and diagnosis is not None:
        assert any(diagnosis in cause for cause in outcome.causes), outcome.causes
    return outcome

