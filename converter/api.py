"""The Python API: the same engine and result objects as the two commands.

    from converter import PortSpec, VerifyOptions, convert_weights, verify_port

    report = verify_port(PortSpec.from_file("my_port.py"), VerifyOptions(device="cpu", bisect=True))
    trained = verify_port(PortSpec.from_file("my_port.py"), VerifyOptions(train=True, steps=10))
    result = convert_weights("model.safetensors", "model.pdparams")

Importing this module imports neither torch nor paddle; each function imports what its work needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .errors import UserError
from .spec import DEFAULT_STEPS, PortSpec

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from .convert import ConversionResult
    from .train.result import TrainReport
    from .verify.report import Report
    from .compare.session import Options

__all__ = ["PortSpec", "VerifyOptions", "convert_weights", "verify_port"]

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("as-is", "strict")
STRATEGIES = ("auto", "full", "binary")
EMULATED_SIDES = ("torch", "paddle")
EMULATED_FORMATS = ("tf32", "bf16", "fp16")
MAX_STEPS = 10_000  # a check of N steps compares every step: more is a run, not a check


@dataclass
class VerifyOptions:
    """How verify_port runs: the options of the verify-port command.

    device: auto (CUDA when both frameworks see a GPU), cpu or cuda. precision: as-is, or strict
    (TF32 off on both sides for the run). emulate: side -> format, e.g. {"paddle": "tf32"}, makes
    that side round its matmul/conv inputs and weights to the format. strategy: auto, full or
    binary. bisect: name the first layer over budget and diagnose it. train: run the training
    checks of verify-port --train instead (loss, backward, optimizer and `steps` training steps)."""

    device: str = "auto"
    precision: str = "as-is"
    emulate: dict[str, str] = field(default_factory=dict)
    strategy: str = "auto"
    bisect: bool = False
    train: bool = False
    steps: int = DEFAULT_STEPS

    def __post_init__(self) -> None:
        _one_of("device", self.device, DEVICES)
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("strategy", self.strategy, STRATEGIES)
        if not isinstance(self.emulate, dict):
            raise UserError(f"VerifyOptions: emulate must be a dict of side -> format, e.g. {{'paddle': 'tf32'}}; "
                            f"got {type(self.emulate).__name__}")
        for side, fmt in self.emulate.items():
            _one_of("emulate side", side, EMULATED_SIDES)
            _one_of(f"emulate format for {side}", fmt, EMULATED_FORMATS)
        if not isinstance(self.train, bool):
            raise UserError(f"VerifyOptions: train must be True or False; got {self.train!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise UserError(f"VerifyOptions: steps must be a whole number from 1 to {MAX_STEPS}; got {self.steps!r}")

    def session_options(self) -> Options:
        """The options a verification session takes (all of these but bisect)."""
        from .compare.session import Options
        return Options(device=self.device, precision=self.precision, emulate=dict(self.emulate),
                       strategy=self.strategy)


def _one_of(what: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise UserError(f"VerifyOptions: {what} must be one of {', '.join(allowed)}; got {value!r}")


def verify_port(spec: PortSpec, options: VerifyOptions | None = None, weights: str | None = None,
                converted: str | None = None, mapping: str | None = None) -> Report | TrainReport:
    """Run both models of `spec`, compare every layer against its expected-error budget and return
    the Report (`report.verdict`, `report.first_bad`, `report.diagnosis`, `report.to_json()`).
    With `options.train`, run the training checks instead and return the TrainReport (the same
    fields; `steps` per step; `to_json()` is the `train` section of verify-port --train --json).

    weights: a torch checkpoint loaded into the torch model first. converted: a paddle weights file
    loaded as is instead of converting torch's weights in memory. mapping: a rule-set name or file
    (default: the spec's own, else inferred from the two models), or "loaded": the paddle model keeps
    the weights it was loaded with, each checked bit for bit against torch's under the spec's rules
    (else inferred, else the shipped set that fits); one that differs fails the report (`weights`).
    Framework flags, hooks, train/eval modes, devices and the weights that emulation rounds are put
    back when the run ends, also on error; the paddle model keeps the weights it was verified with.
    Bad input raises UserError."""
    from .verify.run import verify
    if not isinstance(spec, PortSpec):
        raise UserError(f"verify_port takes a PortSpec (PortSpec(...) or PortSpec.from_file(path)), "
                        f"not {type(spec).__name__}")
    options = options if options is not None else VerifyOptions()
    if options.train:
        from .train.run import train_check
        return train_check(spec, options.steps, options.device, options.precision, dict(options.emulate),
                           weights=weights, converted=converted, mapping=mapping)
    return verify(spec, options.session_options(), weights=weights, converted=converted, mapping=mapping,
                  bisect=options.bisect)


def convert_weights(src: str, dst: str, mapping: str | None = None, spec: PortSpec | str | None = None,
                    dtype: str | None = None, force: bool = False, emit_mapping: str | None = None,
                    progress: bool = False, log: Callable[[str], None] | None = None,
                    also_written: dict[str, str | None] | None = None,
                    allow_outside_shards: bool = False, json_path: str | None = None) -> ConversionResult:
    """Convert the torch checkpoint `src` to the paddle weights file `dst` (.pdparams or .safetensors)
    and check every written tensor bit for bit; returns the ConversionResult (`ok`, `tensors`,
    `mapping`, `dropped`, `to_json()`).

    mapping: a shipped rule-set name, a rule file, or "auto"/None (detected from the checkpoint's
    keys, or inferred from the spec's models). spec: a PortSpec or a spec file path; the result is
    then also loaded into its paddle model (`missing_keys`, `unexpected_keys`). dtype casts the
    floating tensors. log receives one-line notes (what was unwrapped, the detected rule set).
    also_written names the caller's own outputs (option -> path), checked with dst before anything
    is written. json_path: the result's JSON report, written together with dst and emit_mapping
    (all of them or none). Bad input raises UserError, and nothing is written."""
    from .convert import convert
    if isinstance(spec, str):
        spec = PortSpec.from_file(spec)
    return convert(src, dst, mapping=mapping, spec=spec, dtype=dtype, force=force, emit_mapping=emit_mapping,
                   progress=progress, log=log or _quiet, also_written=also_written,
                   allow_outside_shards=allow_outside_shards, json_path=json_path)


def _quiet(line: str) -> None:
    pass
