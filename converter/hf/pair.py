"""`verify-port HF_DIR PADDLE_DIR`: a port spec made from two model directories.

The torch model is transformers' class that HF_DIR's config.json names in `architectures`, loaded
from HF_DIR; the paddle model is the class of the same architecture in PaddleFormers (else
PaddleNLP), built from PADDLE_DIR's config.json and loaded with PADDLE_DIR's paddle weights as they
were written (no conversion on paddle's side). The paddle model keeps those weights (mapping
"loaded"): each is checked bit for bit against torch's under the rule set the directory conversion
used (config.json's model_type for the library), and the layers are paired through it. The inputs
are token ids drawn from the config's vocabulary, a padded second row where both models take an
attention_mask.

Where the memory estimate made from the two directories' headers (compare/memory.py's before_build:
torch's tensors in the dtype from_pretrained loads them in, paddle's as PADDLE_DIR holds them)
says the run would not fit in memory and HF_DIR's weights are read one tensor at a time
(safetensors, or torch's zip format), both models are built
without their weights, torch's from config.json with its parameters on the meta device (its
buffers computed on the CPU) and paddle's under LazyGuard, and both stream block by block: torch's
from HF_DIR's checkpoint, paddle's from PADDLE_DIR's weights, each of those checked bit for bit
against torch's first, one tensor at a time (compare/stream.py).
"""

from __future__ import annotations

import glob
import importlib.metadata
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..compare.upstream import CROSS_ENTROPY_IGNORED
from ..errors import UserError, quoted
from .classes import DOCS, PaddleClass, paddle_class_of, torch_class_of
from .config import family_of
from .fields import fields_apart
from .directory import CONFIG, INDEX, WEIGHTS, WRITTEN_FOR, is_model_directory, read_config
from ..spec import LOADED, PortSpec

BATCH, LENGTH, PADDED = 2, 16, 5  # token inputs: 2 rows of 16, the second row's last 5 padded
SEED = 0
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
SHOWN = 5  # keys named when a directory's weights do not fit the model
LEARNING_RATE = 1e-3  # verify-port --train's AdamW
IGNORED = -100  # a label no loss counts (the padded positions'), as HF's and paddle's cross entropy take it


@dataclass(frozen=True)
class DirectoryRun:
    """What verify-port HF_DIR PADDLE_DIR runs: the spec (mapping "loaded" is the caller's to pass),
    and where both models stream, the checkpoint their weights are read from (`weights`: HF_DIR's,
    `converted`: PADDLE_DIR); both None for a run in memory. `apart`: the fields of PADDLE_DIR's
    config.json with another value than HF_DIR's translates to (hf.fields, for the report)."""

    spec: PortSpec
    weights: str | None = None
    converted: str | None = None
    apart: tuple = ()


def directory_spec(hf_dir: str, paddle_dir: str, mapping: str | None = None, train: bool = False,
                   log: Callable[[str], None] = lambda line: None, max_memory: int | None = None) -> DirectoryRun:
    """The run that builds both models from their directories: verify_port(run.spec, weights=run.weights,
    converted=run.converted, mapping=LOADED). `mapping`: a rule-set name or file; default the
    one convert-weights HF_DIR OUT_DIR uses for config.json's model_type and the paddle library.
    Its training parts (verify-port --train): the architecture's loss (training_loss) and AdamW;
    `train` only says them in the log. Both models stream where the run would not fit in memory
    (not with `train`: training holds both models), or holding at most `max_memory` bytes would
    not. Bad input, and a run that fits in memory neither way, raise UserError before any model is
    built."""
    hf_config = _model_directory(hf_dir, "HF_DIR", "the directory save_pretrained wrote")
    paddle_config = _model_directory(paddle_dir, "PADDLE_DIR", "the directory convert-weights HF_DIR OUT_DIR wrote")
    architecture = _architecture(hf_config, hf_dir)
    _hf_weights(hf_dir)
    paddle_weights = _paddle_weight_keys(paddle_dir)
    torch_class = torch_class_of(architecture)
    named = paddle_config.get("architectures")  # convert-weights writes the library's class name there
    paddle_class = paddle_class_of(named[0] if isinstance(named, list) and named and isinstance(named[0], str)
                                   else architecture, paddle_config.get(WRITTEN_FOR), paddle_dir)
    ruleset = _ruleset(hf_config, hf_dir, paddle_class.library, mapping)
    log(f"torch: transformers {importlib.metadata.version('transformers')}'s {torch_class.__name__} from "
        f"{quoted(hf_dir)}; paddle: {paddle_class.describe()} from {quoted(paddle_dir)}; rules "
        f"{quoted(ruleset.name) if ruleset is not None else 'inferred from the two models'}")
    inputs = token_inputs(hf_config)
    checkpoint, why = streamed_checkpoint(hf_dir, paddle_dir, hf_config, paddle_config, train, max_memory)
    if checkpoint is not None:
        log(why)

    def torch_model():
        if checkpoint is not None:
            return _meta_torch(torch_class, hf_dir, checkpoint)
        model, info = torch_class.from_pretrained(hf_dir, output_loading_info=True)
        _check_hf_loading(info, hf_dir, torch_class.__name__)
        model.config.use_cache = False  # both sides return the logits alone
        return model.eval()

    def paddle_model():
        model = _lazy_paddle(paddle_class, paddle_dir) if checkpoint is not None else _load_paddle(paddle_class,
                                                                                                   paddle_dir)
        _check_loaded_keys(model, paddle_weights, paddle_dir, paddle_class.library)
        return model

    def model_inputs():
        return _with_attention_mask(inputs, torch_class, paddle_class.cls)

    loss = training_loss(architecture, hf_config)
    if train:
        log(f"training checks: {loss.what if loss else 'the default loss (a fixed random projection of the outputs)'}, "
            f"AdamW(lr={LEARNING_RATE})")
    label = f"{os.path.basename(os.path.normpath(hf_dir))} -> {os.path.basename(os.path.normpath(paddle_dir))}"
    training = {} if loss is None else {"batches": lambda: [(model_inputs(), loss.target(model_inputs()))],
                                        "torch_loss": loss.torch, "paddle_loss": loss.paddle}
    spec = PortSpec(torch_model, paddle_model, model_inputs, ruleset, label=label, torch_optimizer=_adamw, **training)
    return DirectoryRun(spec, checkpoint, paddle_dir if checkpoint is not None else None,
                        tuple(fields_apart(hf_config, paddle_config, paddle_class.library)))


# memory -------------------------------------------------------------------------------------------
def directory_memory(hf_dir: str, paddle_dir: str, hf_config: dict, paddle_config: dict, available: int):
    """(the estimate of the run's peaks from both directories' headers (memory.Planned), HF_DIR's
    checkpoint, whether it is read one tensor at a time)."""
    from ..compare.build import read_tensor_by_tensor
    from ..io import open_source
    from ..compare import memory
    with open_source(hf_dir) as source:
        torch_infos, path, files = dict(source.infos), source.path, source.files
    paddle_file = os.path.join(paddle_dir, INDEX if os.path.isfile(os.path.join(paddle_dir, INDEX)) else WEIGHTS)
    with open_source(paddle_file) as source:
        paddle_infos = dict(source.infos)
    planned = memory.before_build(torch_infos, available, _torch_dtype(hf_config), paddle_infos,
                                  _config_dtype(paddle_config))
    return planned, path, read_tensor_by_tensor(files)


def streamed_checkpoint(hf_dir: str, paddle_dir: str, hf_config: dict, paddle_config: dict,
                        train: bool, max_memory: int | None = None) -> tuple[str | None, str]:
    """(HF_DIR's checkpoint, why) where both models stream (the run would not fit in memory, or
    within `max_memory`), else (None, ''); a UserError where it fits neither way."""
    from ..compare import memory
    available, where = memory.available_memory(max_memory)
    planned, path, streamable = directory_memory(hf_dir, paddle_dir, hf_config, paddle_config, available)
    need = planned.must_stream(available, where, "verify-port HF_DIR PADDLE_DIR", train, None if streamable else (
        f"a run that streams the weights block by block reads HF_DIR's one tensor at a time, which {quoted(path)} (a "
        "torch pickle of the format before zip files) does not allow: save HF_DIR with save_pretrained(..., "
        "safe_serialization=True), or free memory"))
    if need is None:
        return None, ""
    return path, f"weights: streamed block by block from both directories, as {need}"


def _config_dtype(config: dict) -> str | None:
    """The dtype config.json names (HF 5's 'dtype', or 'torch_dtype'), or None."""
    from .. import dtypes
    named = config.get("dtype", config.get("torch_dtype"))
    try:
        return dtypes.canonical(named) if isinstance(named, str) else None
    except UserError:
        return None


def _torch_dtype(config: dict) -> str:
    """The dtype from_pretrained loads HF_DIR's floating weights in: float32 in transformers 4,
    config.json's dtype in transformers 5 (its "auto")."""
    major = int(importlib.metadata.version("transformers").split(".")[0])
    return (_config_dtype(config) if major >= 5 else None) or "float32"


def _meta_torch(torch_class: type, hf_dir: str, checkpoint: str):
    """transformers' class built from HF_DIR's config.json with its parameters on the meta device
    (its buffers computed on the CPU), as from_pretrained builds it, HF_DIR's checkpoint holding
    every parameter by the model's names."""
    from ..compare.build import parameters_on_meta
    from ..io import open_source
    config = torch_class.config_class.from_pretrained(hf_dir)
    with parameters_on_meta():
        model = torch_class._from_config(config)
    model.config.use_cache = False  # both sides return the logits alone
    state = model.state_dict(keep_vars=True)
    with open_source(checkpoint) as source:
        held = set(source.infos)
    ids = {}
    for key, t in state.items():
        ids.setdefault(id(t), []).append(key)
    missing = sorted(k for k, t in state.items() if t.is_meta and not set(ids[id(t)]) & held)
    unexpected = sorted(held - set(state))
    if missing or unexpected:
        said = _keys_said((missing, "are not there"), (unexpected, "are not the model's"))
        raise UserError(f"HF_DIR {quoted(hf_dir)}'s checkpoint does not hold {torch_class.__name__}'s tensors by its "
                        f"names: {said}; a run that streams the weights reads each by the model's name: "
                        "verify the pair where it fits in memory")
    return model.eval()


def _lazy_paddle(paddle_class: PaddleClass, paddle_dir: str):
    """The paddle class built from PADDLE_DIR's config.json under LazyGuard (its parameters take no
    memory; streamed from PADDLE_DIR's weights), in the dtype from_pretrained gives it."""
    from ..lazy import import_paddle
    paddle = import_paddle()
    config = paddle_class.cls.config_class.from_pretrained(paddle_dir)
    with paddle.LazyGuard():
        model = paddle_class.cls._from_config(config)
    return _as_run(model)


# the directories ---------------------------------------------------------------------------------
def _model_directory(path: str, what: str, hint: str) -> dict:
    if not os.path.isdir(path):
        raise UserError(f"{what} {quoted(path)} is not a directory; give {hint}")
    if not is_model_directory(path):
        raise UserError(f"{what} {quoted(path)} is not a model directory (it has no {CONFIG}); give {hint}")
    return read_config(path)


def _architecture(config: dict, hf_dir: str) -> str:
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UserError(f"{quoted(os.path.join(hf_dir, CONFIG))} names no model class in 'architectures'; add the "
                        "class it was saved from (e.g. \"architectures\": [\"LlamaForCausalLM\"])")
    return names[0]


def _hf_weights(hf_dir: str) -> None:
    if not any(glob.glob(os.path.join(glob.escape(hf_dir), name)) for name in HF_WEIGHTS + ("*.safetensors",)):
        raise UserError(f"HF_DIR {quoted(hf_dir)} holds no weights ({', '.join(HF_WEIGHTS[::2])} or shards with "
                        "their index); give the directory save_pretrained wrote")


def _paddle_weight_keys(paddle_dir: str) -> set[str]:
    """The tensor names of PADDLE_DIR's paddle weights (model_state.pdparams, or its shards' index)."""
    import json
    index, single = os.path.join(paddle_dir, INDEX), os.path.join(paddle_dir, WEIGHTS)
    if os.path.isfile(index):
        from ..io.inputs import CONFIG_CAP, read_small_file
        try:
            body = json.loads(read_small_file(index, "index file", CONFIG_CAP).decode("utf-8"))
            return set(body["weight_map"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{quoted(index)} is not a weights index (a JSON object with a 'weight_map'); "
                            "convert the directory again") from None
    if os.path.isfile(single):
        from ..io import open_source
        with open_source(single) as source:
            return set(source.infos)
    raise UserError(f"PADDLE_DIR {quoted(paddle_dir)} holds no paddle weights ({WEIGHTS} or its shards with "
                    f"{INDEX}); write them with: convert-weights HF_DIR {paddle_dir}")


def _ruleset(hf_config: dict, hf_dir: str, target: str, mapping: str | None):
    """The rules given, else the shipped set convert-weights uses for config.json's model_type and
    the target library, with the config's fields that a merge by groups names; None (inferred from
    the two models) where the library's table has no such family."""
    from ..rules.ruleset import resolve_mapping
    if mapping and mapping != LOADED:  # "loaded" is what this mode is: the rules are still the directory's
        return resolve_mapping(mapping).with_params(hf_config)
    try:
        family = family_of(hf_config, quoted(os.path.join(hf_dir, CONFIG)), target)
    except UserError:
        return None
    return resolve_mapping(family.mapping).with_params(hf_config)


# the models ---------------------------------------------------------------------------------------
def _load_paddle(paddle_class: PaddleClass, paddle_dir: str):
    """The paddle class from PADDLE_DIR: its config.json, its paddle weights as they are."""
    if paddle_class.library == "paddleformers":  # its default converts an HF checkpoint itself
        model = paddle_class.cls.from_pretrained(paddle_dir, load_checkpoint_format=None, convert_from_hf=False)
    else:
        model = paddle_class.cls.from_pretrained(paddle_dir)
    return _as_run(model)


def _as_run(model):
    """The paddle model as both sides run, in eval mode, its config with no cache, the output as a
    ModelOutput (HF's default: a forward that builds its tuple otherwise may hold more than the
    logits, DeepSeek-V3's its empty multi-token-prediction outputs), and no fused RMSNorm on a CPU."""
    from ..lazy import import_paddle
    paddle = import_paddle()
    config = getattr(model, "config", None)
    if config is not None:
        config.use_cache = False  # both sides return the logits alone
        config.return_dict = True
        if not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
            config.fuse_rms_norm = False  # paddle has no CPU kernel for the fused RMSNorm PaddleFormers uses
    model.eval()
    return model


def _check_loaded_keys(model, weights: set[str], paddle_dir: str, library: str) -> None:
    """Every parameter of the model is in PADDLE_DIR's weights and every tensor there is the
    model's: PaddleFormers loads a directory whose names do not fit without an error, and random
    weights stay."""
    expected = set(model.state_dict())
    parameters = {name for name, _ in model.named_parameters()}
    missing = sorted(parameters - weights)
    unexpected = sorted(weights - expected)
    if missing or unexpected:
        said = ("the model's " if missing else "") + _keys_said((missing, "are not there"),
                                                                (unexpected, "are not the model's"))
        raise UserError(f"PADDLE_DIR {quoted(paddle_dir)}'s weights do not fit {type(model).__name__}: "
                        f"{said}; convert HF_DIR for this library (convert-weights HF_DIR OUT_DIR "
                        f"--target {library})")


def _check_hf_loading(info: dict, hf_dir: str, name: str) -> None:
    """transformers initialises what HF_DIR's weights lack (or hold in another shape) at random and
    goes on: that is bad input here, not a difference of the port."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(m[0]) if isinstance(m, (tuple, list)) else str(m) for m in info.get("mismatched_keys") or [])
    if missing or mismatched:
        said = _keys_said((missing, "are not there"), (mismatched, "have another shape"))
        raise UserError(f"HF_DIR {quoted(hf_dir)}'s weights do not fit {name}: the model's {said}; give "
                        "the directory this model was saved to")


def _keys_said(*groups: tuple[list[str], str]) -> str:
    """Each (keys, what) that has keys as its first SHOWN keys and what they are, joined by '; '."""
    return "; ".join(f"{', '.join(map(quoted, keys[:SHOWN]))}{f' and {len(keys) - SHOWN} more' if len(keys) > SHOWN else ''} "
                     f"{what}" for keys, what in groups if keys)


# the inputs ---------------------------------------------------------------------------------------
def token_inputs(config: dict) -> dict[str, Any]:
    """Token ids drawn (seeded) from the config's vocabulary, BATCH x LENGTH; the second row's last
    PADDED positions are padding (the config's pad_token_id where it has one) with attention_mask 0."""
    import numpy as np
    vocab = config.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise UserError(f"config.json's 'vocab_size' is {vocab!r}, not a positive integer; the token inputs are "
                        f"drawn from it: correct config.json, or write a port spec (see {DOCS})")
    ids = np.random.default_rng(SEED).integers(0, vocab, (BATCH, LENGTH)).astype(np.int64)
    mask = np.ones((BATCH, LENGTH), dtype=np.int64)
    mask[1, LENGTH - PADDED:] = 0
    pad = config.get("pad_token_id")
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < vocab:
        ids[1, LENGTH - PADDED:] = pad
    return {"input_ids": ids, "attention_mask": mask}


def _takes(cls: type, name: str) -> bool:
    try:
        return name in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


def _with_attention_mask(inputs: dict, torch_class: type, paddle_class: type) -> dict:
    """The inputs with the attention_mask where both models take one; else the ids alone, unpadded."""
    if _takes(torch_class, "attention_mask") and _takes(paddle_class, "attention_mask"):
        return dict(inputs)
    return {"input_ids": inputs["input_ids"]}


# training (verify-port --train) --------------------------------------------------------------------
@dataclass(frozen=True)
class TrainingLoss:
    """The loss --train checks for an architecture: `target(inputs)` the labels, `torch` and `paddle`
    the loss on (output, labels) in each framework, the same formula."""

    what: str
    target: Callable[[dict], Any]
    torch: Callable
    paddle: Callable


def training_loss(architecture: str, config: dict) -> TrainingLoss | None:
    """A causal LM's next-token cross entropy (labels: the input ids, padded positions not counted)
    or a sequence classifier's cross entropy (labels drawn from its classes); None for another
    architecture (--train's default loss)."""
    if architecture.endswith(("ForCausalLM", "LMHeadModel")):
        return TrainingLoss("causal-LM cross entropy (labels: the input ids)", _causal_labels,
                            _torch_causal_loss, _paddle_causal_loss)
    if architecture.endswith("ForSequenceClassification"):
        classes = _classes(config)
        return TrainingLoss(f"sequence-classification cross entropy ({classes} classes)",
                            lambda inputs: _class_labels(classes), _torch_class_loss, _paddle_class_loss)
    return None


def _classes(config: dict) -> int:
    labels = config.get("id2label")
    count = config.get("num_labels", len(labels) if isinstance(labels, dict) and labels else 2)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 2


def _causal_labels(inputs: dict):
    import numpy as np
    labels = inputs["input_ids"].copy()
    if "attention_mask" in inputs:
        labels[inputs["attention_mask"] == 0] = IGNORED
    return labels.astype(np.int64)


def _class_labels(classes: int):
    import numpy as np
    return np.random.default_rng(SEED + 1).integers(0, classes, (BATCH,)).astype(np.int64)


def _logits(output):
    """The logits of a model's output: a ModelOutput's field, a tuple's first element, or the tensor."""
    if hasattr(output, "logits"):
        return output.logits
    return output[0] if isinstance(output, (tuple, list)) else output


def _torch_causal_loss(output, labels):
    import torch
    logits = _logits(output)[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                             ignore_index=IGNORED)


def _paddle_causal_loss(output, labels):
    """Summed and divided by the labels counted, as torch's and HF's (compare/upstream.py
    CROSS_ENTROPY_IGNORED: paddle's mean divides by every label, the ignored ones included)."""
    import paddle
    logits, labels = _logits(output)[:, :-1], labels[:, 1:].reshape([-1])
    losses = paddle.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels, ignore_index=IGNORED,
                                                reduction="none")
    return losses.sum() / (labels != IGNORED).astype(losses.dtype).sum()


# paddle's side of the causal-LM loss counts as torch's does: said once in the training report's notes
_paddle_causal_loss.convention = (
    f"paddle {CROSS_ENTROPY_IGNORED.version} {CROSS_ENTROPY_IGNORED.paddle} (torch: {CROSS_ENTROPY_IGNORED.torch}): "
    "paddle's causal-LM loss here sums and divides by the labels counted")


def _torch_class_loss(output, labels):
    import torch
    return torch.nn.functional.cross_entropy(_logits(output), labels)


def _paddle_class_loss(output, labels):
    import paddle
    return paddle.nn.functional.cross_entropy(_logits(output), labels)


def _adamw(model):
    import torch
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
