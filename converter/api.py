"""The Python API: the same engine and result objects as the two commands.

    from converter import PortSpec, VerifyOptions, convert_directory, convert_weights, verify_port

    report = verify_port(PortSpec.from_file("my_port.py"), VerifyOptions(device="cpu", bisect=True))
    both = verify_port(PortSpec.from_file("my_port.py"), VerifyOptions(train=True, steps=10))
    result = convert_weights("model.safetensors", "model.pdparams")
    done = convert_directory("hf_model", "paddle_model")

Importing this module imports neither torch nor paddle; each function imports what its work needs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

from .errors import UserError
from .report import PortReport
from .spec import DEFAULT_STEPS, PortSpec

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from .compare.session import Options
    from .convert import ConversionResult

__all__ = ["PortSpec", "VerifyOptions", "PortReport", "DirectoryConversion", "OptionError", "convert_weights",
           "convert_directory", "converts_a_directory", "verify_port", "verify_directories", "translated_optimizer"]

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("as-is", "strict")
STRATEGIES = ("auto", "full", "binary")
EMULATED_SIDES = ("torch", "paddle")
EMULATED_FORMATS = ("tf32", "bf16", "fp16")
MAX_STEPS = 10_000  # a check of N steps compares every step: more is a run, not a check


class OptionError(UserError):
    """A VerifyOptions field with a value it does not take: `option` names the field ("steps",
    "emulate", ...), `value` is what was given (for emulate, the (side, format) entry)."""

    def __init__(self, option: str, value, message: str):
        super().__init__(f"VerifyOptions: {message}")
        self.option = option
        self.value = value


@dataclass
class VerifyOptions:
    """How verify_port runs: the options of the verify-port command.

    device: auto (CUDA when both frameworks see a GPU), cpu or cuda. precision: as-is, or strict
    (TF32 off on both sides for the run). emulate: side -> format, e.g. {"paddle": "tf32"}, makes
    that side round its matmul/conv inputs and weights to the format. strategy: auto, full or
    binary. bisect: name the first layer over budget and diagnose it. train: also run the training
    checks of verify-port --train (loss, backward, optimizer and `steps` training steps), before
    the forward check and on the same session. max_memory: the most the process may hold, in
    bytes (None: the memory available); within it, as within the memory available, a run whose
    weights come from a checkpoint or model directories streams them block by block where holding
    both models would not fit, and the blocks kept made and the activations kept are sized to it.
    threshold: a fixed tolerance the user holds (as reprod_log's 1e-5), or None; the report says
    where the arithmetic each side used cannot hold it and whether the run's errors are within it
    (it changes no verdict)."""

    device: str = "auto"
    precision: str = "as-is"
    emulate: dict[str, str] = field(default_factory=dict)
    strategy: str = "auto"
    bisect: bool = False
    train: bool = False
    steps: int = DEFAULT_STEPS
    max_memory: int | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        for option, allowed in (("device", DEVICES), ("precision", PRECISIONS), ("strategy", STRATEGIES)):
            value = getattr(self, option)
            if value not in allowed:
                raise OptionError(option, value, _not_one_of(option, value, allowed))
        if not isinstance(self.emulate, dict):
            raise OptionError("emulate", self.emulate, "emulate must be a dict of side -> format, e.g. "
                              f"{{'paddle': 'tf32'}}; got {type(self.emulate).__name__}")
        for side, fmt in self.emulate.items():
            if side not in EMULATED_SIDES:
                raise OptionError("emulate", (side, fmt), _not_one_of("emulate side", side, EMULATED_SIDES))
            if fmt not in EMULATED_FORMATS:
                raise OptionError("emulate", (side, fmt), _not_one_of(f"emulate format for {side}", fmt,
                                                                       EMULATED_FORMATS))
        if not isinstance(self.train, bool):
            raise OptionError("train", self.train, f"train must be True or False; got {self.train!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise OptionError("steps", self.steps,
                              f"steps must be a whole number from 1 to {MAX_STEPS}; got {self.steps!r}")
        if self.max_memory is not None and (isinstance(self.max_memory, bool) or not isinstance(self.max_memory, int)
                                            or self.max_memory <= 0):
            raise OptionError("max_memory", self.max_memory,
                              f"max_memory must be a number of bytes above 0, or None; got {self.max_memory!r}")
        if self.threshold is not None and (isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float))
                                           or not math.isfinite(self.threshold) or self.threshold <= 0):
            raise OptionError("threshold", self.threshold,
                              f"threshold must be a finite number above 0 (such as 1e-5), or None; got {self.threshold!r}")

    def session_options(self) -> Options:
        """The options a verification session takes (all of these but bisect and steps)."""
        from .compare.session import Options
        return Options(device=self.device, precision=self.precision, emulate=dict(self.emulate),
                       strategy=self.strategy, max_memory=self.max_memory, train=self.train)


def _not_one_of(what: str, value, allowed: tuple) -> str:
    return f"{what} must be one of {', '.join(allowed)}; got {value!r}"


def verify_port(spec: PortSpec, options: VerifyOptions | None = None, weights: str | None = None,
                converted: str | None = None, mapping: str | None = None) -> PortReport:
    """Run both models of `spec`, compare every layer against its expected-error budget and return
    the PortReport: `report.verdict`, `report.exit_code`, `report.to_json()`, and `report.forward`,
    the forward check's Report (`first_bad`, `layers`, `diagnosis`, `weights`). With
    `options.train`, the training checks run first, on the same session (one conversion, one
    float64 copy of the torch model), and `report.train` is their TrainReport (`first_bad` with its
    phase, `steps`, `diagnosis`, `rows`).

    weights: a torch checkpoint loaded into the torch model first. converted: a paddle weights file
    loaded as is instead of converting torch's weights in memory. mapping: a rule-set name or file
    (default: the spec's own, else inferred from the two models), or "loaded": the paddle model keeps
    the weights it was loaded with, each checked bit for bit against torch's under the spec's rules
    (else inferred, else the shipped set that fits); one that differs fails the report (`weights`).
    The forward report explains its figures (`report.forward.explanation`: each side's error against
    float64, the budget's terms, fp32's figures where a side used TF32 or bf16, and the answer to
    `options.threshold`). Framework flags, hooks, train/eval modes, devices and the weights that
    emulation rounds are put back when the run ends, also on error; the paddle model keeps the
    weights it was verified with.
    Bad input raises UserError."""
    from .compare.session import PortSession
    from .verify.explain import explained
    from .verify.run import run_on
    if not isinstance(spec, PortSpec):
        raise UserError(f"verify_port takes a PortSpec (PortSpec(...) or PortSpec.from_file(path)), "
                        f"not {type(spec).__name__}")
    options = options if options is not None else VerifyOptions()
    session_options = options.session_options()
    training = None
    if options.train:
        from .train.spec import TrainSpec
        training = TrainSpec(spec)  # the spec's training parts are checked before the models are built
    with PortSession(spec, session_options, weights=weights, converted=converted, mapping=mapping) as session:
        trained = None
        if training is not None:
            from .train.run import train_on
            trained = train_on(session, training, options.steps)  # first: it gives the models back as it found them
        forward = explained(session, run_on(session, session_options, options.bisect), options.threshold)
        return PortReport(forward, trained)


def verify_directories(hf_dir: str, paddle_dir: str, options: VerifyOptions | None = None,
                       mapping: str | None = None, log: Callable[[str], None] | None = None) -> PortReport:
    """verify_port with no spec: the torch model is transformers' class that `hf_dir`'s config.json
    names in `architectures`, loaded from `hf_dir`; the paddle model PaddleFormers' class of the same
    architecture (else PaddleNLP's), built from `paddle_dir` (what convert_directory wrote) with its
    weights as they are. Each of them is checked bit for bit against torch's under the rule set the
    directory conversion used (or `mapping`), and the forward check runs on token ids drawn from the
    config's vocabulary (a padded second row where both models take an attention_mask). With
    `options.train`, the training checks run first with AdamW and a causal LM's next-token loss or a
    sequence classifier's cross entropy (another architecture: the default loss). log receives one
    line naming the two classes and the rules (and one naming the loss). Bad input raises UserError."""
    from .hf.fields import in_config_terms
    from .hf.pair import directory_spec
    from .spec import LOADED
    options = options if options is not None else VerifyOptions()
    run = directory_spec(hf_dir, paddle_dir, mapping, options.train, log or _quiet, options.max_memory)
    report = verify_port(run.spec, options, weights=run.weights, converted=run.converted, mapping=LOADED)
    return in_config_terms(report, list(run.apart))  # fields and hints in config.json's terms


def translated_optimizer(spec: PortSpec) -> str:
    """Torch's optimizer of `spec` translated to paddle's, as the code of a spec's
    `paddle_optimizer(model)` (what verify-port --train --emit-optimizer writes; the training
    report's `optimizer_code` is the same, for the parameters the run found torch's optimizer
    holding). Bad input where torch's optimizer has no translation."""
    from .train.run import translation_of
    return translation_of(spec).code()


def convert_weights(src: str, dst: str, mapping: str | None = None, spec: PortSpec | str | None = None,
                    dtype: str | None = None, force: bool = False, emit_mapping: str | None = None,
                    progress: bool = False, log: Callable[[str], None] | None = None,
                    also_written: dict[str, str | None] | None = None,
                    allow_outside_shards: bool = False, json_path: str | None = None,
                    target: str | None = None) -> ConversionResult:
    """Convert the torch checkpoint `src` to the paddle weights file `dst` (.pdparams or .safetensors)
    and check every written tensor bit for bit; returns the ConversionResult (`ok`, `tensors`,
    `mapping`, `dropped`, `to_json()`).

    mapping: a shipped rule-set name, a rule file, or "auto"/None (detected from the checkpoint's
    keys, or inferred from the spec's models). spec: a PortSpec or a spec file path; the result is
    then also loaded into its paddle model (`missing_keys`, `unexpected_keys`). dtype casts the
    floating tensors. log receives one-line notes (what was unwrapped, the detected rule set).
    also_written names the caller's own outputs (option -> path), checked with dst before anything
    is written. json_path: the result's JSON report, written together with dst and emit_mapping
    (all of them or none). target: "paddleformers" or "paddlenlp", the library whose shipped sets
    detection tries (default: PaddleFormers' where one fits). Bad input raises UserError, and
    nothing is written."""
    from .convert import convert
    check_target(target)
    if isinstance(spec, str):
        spec = PortSpec.from_file(spec)
    return convert(src, dst, mapping=mapping, spec=spec, dtype=dtype, force=force, emit_mapping=emit_mapping,
                   progress=progress, log=log or _quiet, also_written=also_written,
                   allow_outside_shards=allow_outside_shards, json_path=json_path, target=target)


@dataclass(frozen=True)
class DirectoryConversion:
    """What convert_directory wrote: the output directory, its files, the rule set, the tensors and
    their bytes, and the source keys the rules dropped. `to_json()` is convert-weights --json's body."""

    output: str
    files: list[str]
    mapping: str
    tensors: int
    bytes: int
    dropped: list[str]

    def to_json(self) -> dict:
        return asdict(self)


def converts_a_directory(src: str, dst: str) -> bool:
    """Whether (src, dst) is a model directory conversion (convert_directory's), not a weights
    file's (convert_weights'): src holds a config.json and dst is not a weights file name."""
    from .hf.directory import converts_a_directory as directory_pair
    return directory_pair(src, dst)


def convert_directory(src_dir: str, out_dir: str, mapping: str | None = None, dtype: str | None = None,
                      force: bool = False, max_shard_size: str | None = None, progress: bool = False,
                      log: Callable[[str], None] | None = None, json_path: str | None = None,
                      target: str | None = None) -> DirectoryConversion:
    """Convert the HF model directory `src_dir` (config.json and single or sharded weights) into
    `out_dir`, which PaddleFormers' or PaddleNLP's from_pretrained loads (`target`: "paddleformers"
    or "paddlenlp"; default PaddleFormers where it has config.json's model_type): the weights (cut
    into shards of at most `max_shard_size`, e.g. "5GB", else sharded as the source was) and
    config.json in that library's field names, every tensor checked bit for bit. The directory appears complete or not at all;
    with force it replaces only a directory this tool wrote. mapping: a rule-set name or file
    (default: the one config.json's model_type names). json_path: the result's JSON, written
    together with out_dir. Bad input raises UserError, and nothing is written."""
    from .hf.directory import convert_directory as convert_dir
    check_target(target)
    done = convert_dir(src_dir, out_dir, mapping, dtype, force, max_shard_size, progress, log or _quiet,
                       json_path=json_path, target=target)
    return DirectoryConversion(**done)


def check_target(target: str | None) -> None:
    """A target library convert_weights and convert_directory take: paddleformers, paddlenlp or None."""
    from .rules.detect import check_target as checked
    checked(target)


def _quiet(line: str) -> None:
    pass
