"""The training checks' report through the public API, as verify-port --train makes it."""

from converter.spec import DEFAULT_STEPS


def train_check(spec, steps: int = DEFAULT_STEPS, device: str = "auto", precision: str = "as-is", emulate=None, weights=None,
                converted=None, mapping=None):
    """The TrainReport of verify_port with train=True on `spec` (a PortSpec)."""
    from converter.api import VerifyOptions, verify_port
    options = VerifyOptions(device=device, precision=precision, emulate=dict(emulate or {}), train=True, steps=steps)
    return verify_port(spec, options, weights=weights, converted=converted, mapping=mapping).train
