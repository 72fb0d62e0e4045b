"""The seed story, training side: paddle's matmuls in TF32 (emulated) and a BatchNorm momentum left
in torch's convention. The report calls the first noise and names the second as the cause."""

import pytest
from helpers.cli import spec_path
from converter.spec import PortSpec
from converter.train.report import render_text
from helpers.train import train_check


@pytest.mark.slow


def test_tf32_is_noise_and_the_batchnorm_momentum_is_the_bug():
    report = train_check(PortSpec.from_file(spec_path("train_seed")), steps=20, device="cpu",
                         emulate={"paddle": "tf32"})
    fb = report.first_bad
    assert fb.phase == "steps" and fb.torch == "bn.running_mean" and fb.paddle == "bn._mean" and fb.ratio > 10
    # every loss of the 20 steps is within the band that includes TF32 on paddle's side
    assert all(abs(s.loss_paddle - s.loss_torch) <= s.band for s in report.steps)
    assert all(r.ratio <= 1 for r in report.rows if r.phase in ("loss", "backward", "lr", "optimizer")
               and r.ratio is not None)
    causes = {d.layer: d.cause for d in report.diagnosis}
    assert "momentum convention" in causes["bn"]
    assert "tf32 noise, not a bug" in causes["<loss curve>"]
    text = render_text(report)
    assert "first over budget: free-running steps at step 20: torch 'bn.running_mean'" in text
    assert "training verdict: FAIL" in text


@pytest.mark.slow


def test_without_tf32_the_same_losses_would_be_over_the_fp32_band():
    """The TF32 noise is real noise: the fp32-only band is far tighter than the loss differences."""
    report = train_check(PortSpec.from_file(spec_path("train_seed")), steps=20, device="cpu",
                         emulate={"paddle": "tf32"})
    noise = next(d for d in report.diagnosis if d.layer == "<loss curve>")
    times = float(noise.cause.split("), ")[1].split(" times")[0])
    assert times > 10


@pytest.mark.slow


def test_bf16_noise_on_a_clean_port_passes_and_is_called_noise():
    """paddle's matmuls in bf16 (emulated) on the clean CNN: every phase passes and the loss drift
    is called bf16 noise, with the way to compare in fp32 for bf16 (a float32 model, not a TF32 flag)."""
    report = train_check(PortSpec.from_file(spec_path("train_cnn")), steps=10, device="cpu",
                         emulate={"paddle": "bf16"})
    assert report.first_bad is None, report.first_bad
    noise = next(d for d in report.diagnosis if d.layer == "<loss curve>")
    assert "bf16 noise, not a bug" in noise.cause
    assert "float32" in noise.hint and "FLAGS_cublas_allow_tf32" not in noise.hint
