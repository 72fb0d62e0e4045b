"""PaConvert's output of real model files, generated at test time and imported.

`paconverted(path)` runs PaConvert 3.3.1 on a file of an installed package (`torchvision/...` or
`transformers/...`; into a temporary directory, once a session), applies the hand fixes below and
imports the result. The output is kept as generated but for these fixes: the least that makes it
import and run on paddle 3.3.1. Each fix is an explicit text substitution with the reason it is
needed; a fix listed for a file must find its text there (so a PaConvert that changes its output
shows here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fix:
    old: str  # a regular expression (re.M)
    new: str
    why: str
    required: bool = True  # the file must contain `old`


# Applied to every converted torchvision file where their text occurs.
TORCHVISION = [
    # The output no longer sits inside torchvision's package: its relative imports of torchvision's
    # weight enums, metadata and logging (no model code) become absolute ones...
    Fix(r"^from \.\.(transforms|utils)\b", r"from torchvision.\1", "relative import outside the package", False),
    Fix(r"^from \.(_api|_meta|_utils)\b", r"from torchvision.models.\1", "relative import outside the package", False),
    # ...and the model code it imports from torchvision.ops is PaConvert's output of those files too.
    Fix(r"^from \.\.ops\.(misc|stochastic_depth) import", r"from paconverted_ops_\1 import",
        "torchvision.ops' layers are torch modules: import their converted copies", False),
    # torchvision's model registry already holds every builder's name: registering again raises.
    Fix(r"^@register_model\(\)\n", "", "the builder is registered in torchvision already", False),
    # Lines PaConvert marks unconvertible (">>>>>>"), all TorchScript or torch.fx only:
    Fix(r"^>>>>>>( *)@torch\.jit\.unused\n", "", "TorchScript only (unconvertible marker)", False),
    Fix(r"^>>>>>>( *)@torch\.jit\._overload_method\n", "", "TorchScript only (unconvertible marker)", False),
    Fix(r"^>>>>>>torch\.fx\.wrap\(.*\)\n", "", "torch.fx only (unconvertible marker)", False),
    Fix(r"^>>>>>>( *)if torch\.jit\.is_scripting\(\):", r"\1if False:", "never TorchScript (unconvertible marker)", False),
    Fix(r"^>>>>>>( *)if not torch\.jit\.is_scripting\(\) and not torch\.jit\.is_tracing\(\):", r"\1if True:",
        "never TorchScript (unconvertible marker)", False),
    # paddle 3.3.1 has paddle.nn.Conv2d (an alias of Conv2D) but no paddle.nn.MaxPool2d.
    Fix(r"paddle\.nn\.MaxPool2d\(", "paddle.nn.MaxPool2D(", "paddle 3.3.1 has no paddle.nn.MaxPool2d", False),
    # paddle's activations take no `inplace` (the values are the same).
    Fix(r"paddle\.nn\.ReLU\(inplace=True\)", "paddle.nn.ReLU()", "paddle.nn.ReLU takes no inplace", False),
    Fix(r"paddle\.nn\.functional\.relu\((\w+), inplace=True\)", r"paddle.nn.functional.relu(\1)",
        "paddle.nn.functional.relu takes no inplace", False),
]

# transformers' PreTrainedModel is a torch.nn.Module, and so are the activations ACT2FN builds:
# the converted file gets paddle stand-ins, written here, of the few parts its models' forward uses
# (the extended mask as HF computes it: (1 - mask) * the float32 minimum); nothing else changes.
HF_STANDINS = '''import numpy as np
import paddle


class PreTrainedModel(paddle.nn.Layer):
    """The parts of transformers' PreTrainedModel (a torch.nn.Module) that the models' forward uses."""

    def __init__(self, config, *inputs, **kwargs):
        super().__init__()
        self.config = config

    def post_init(self):
        pass  # weights are initialised by the converted __init__s, and replaced by the check

    def warn_if_padding_and_no_attention_mask(self, input_ids, attention_mask):
        pass

    def get_head_mask(self, head_mask, num_hidden_layers, is_attention_chunked=False):
        assert head_mask is None
        return [None] * num_hidden_layers

    def get_extended_attention_mask(self, attention_mask, input_shape, dtype=None):
        extended = attention_mask[:, None, None, :].astype("float32")  # [B, 1, 1, T], as HF's
        return (1.0 - extended) * float(np.finfo("float32").min)


class _ACT2FN:
    """transformers.activations.ACT2FN, building paddle layers."""

    def __getitem__(self, name):
        return {"gelu": paddle.nn.GELU, "relu": paddle.nn.ReLU, "tanh": paddle.nn.Tanh}[name]()


ACT2FN = _ACT2FN()
'''

# Applied to every converted transformers file.
TRANSFORMERS = [
    Fix(r"^import paddle\n", HF_STANDINS.replace("\\", "\\\\"), "paddle stand-ins of PreTrainedModel and ACT2FN"),
    Fix(r"^from \.\.\.activations import ACT2FN\n", "", "ACT2FN builds torch modules: the stand-in above"),
    Fix(r"^from \.\.\.modeling_utils import PreTrainedModel\n", "", "a torch.nn.Module: the stand-in above"),
    # the output no longer sits inside transformers' package: outputs, configs, utilities (no model code)
    Fix(r"^from \.\.\.", "from transformers.", "relative import outside the package"),
    Fix(r"^from \.configuration_(\w+) import", r"from transformers.models.\1.configuration_\1 import",
        "relative import outside the package"),
]

# Per file, after the package's own list.
FILES = {
    "torchvision/ops/misc.py": [
        Fix(r'params = \{\} if inplace is None else \{"inplace": inplace\}', "params = {}",
            "paddle's activation layers take no inplace"),
    ],
    "torchvision/models/mobilenetv3.py": [
        Fix(r"partial\(paddle\.nn\.BatchNorm2D, eps=0\.001, momentum=0\.01\)",
            "partial(paddle.nn.BatchNorm2D, epsilon=0.001, momentum=0.99)",
            "torch's BatchNorm arguments kept under partial(): paddle's names (and momentum 1 - torch's)"),
        Fix(r"paddle\.nn\.Dropout\(p=dropout, inplace=True\)", "paddle.nn.Dropout(p=dropout)",
            "paddle.nn.Dropout takes no inplace"),
    ],
    "torchvision/models/vision_transformer.py": [
        Fix(r"^import paddle\n", "import paddle\n\n\ndef _assert(condition, message):\n    assert condition, message\n",
            "paddle has no _assert (torch._assert)"),
        Fix(r"paddle\._assert\(", "_assert(", "paddle has no _assert (torch._assert)"),
        Fix(r"self\.conv_proj\.(in_channels|kernel_size)\b", r"self.conv_proj._\1",
            "paddle's Conv2D keeps its arguments as _in_channels and _kernel_size"),
    ],
}

_OUT = None  # the session's directory of converted files


def _out_dir() -> str:
    global _OUT
    if _OUT is None:
        _OUT = tempfile.mkdtemp(prefix="paconverted-")
    return _OUT


def fix_text(path: str, text: str) -> str:
    common = TORCHVISION if path.startswith("torchvision/") else TRANSFORMERS
    for fix in common + FILES.get(path, []):
        text, n = re.subn(fix.old, fix.new, text, flags=re.M)
        assert n or not fix.required, f"{path}: hand fix {fix.old!r} ({fix.why}) no longer applies"
    return text


def run_paconvert(src: str, dst: str) -> None:
    """PaConvert's command line on one file, as a user runs it."""
    log = os.path.join(os.path.dirname(dst), "log")
    code = ("import sys; from paconvert.main import main; "
            f"sys.argv = ['paconvert', '-i', {src!r}, '-o', {dst!r}, '--log_dir', {log!r}]; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and os.path.exists(dst), f"paconvert {src}: {done.stdout[-500:]}{done.stderr[-500:]}"


_ABSENT = object()


def _restore(cls, before: dict, changed: dict) -> None:
    for key in changed:
        if before.get(key, _ABSENT) is _ABSENT:
            delattr(cls, key)
        else:
            setattr(cls, key, before[key])


@contextlib.contextmanager
def tensor_patches_of(path: str):
    """The paddle.Tensor attributes the converted module of `path` set at import, set while inside."""
    import paddle
    patches = getattr(paconverted(path), "tensor_patches", {})
    before = dict(vars(paddle.Tensor))
    for key, value in patches.items():
        setattr(paddle.Tensor, key, value)
    try:
        yield
    finally:
        _restore(paddle.Tensor, before, patches)


def paconverted(path: str):
    """The module PaConvert makes of the installed file `path` (`torchvision/models/resnet.py`),
    fixed and imported (once)."""
    package, relpath = path.split("/", 1)
    name = "paconverted_" + os.path.splitext(relpath)[0].replace("models/", "").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    if path.startswith("torchvision/models/"):  # the converted torchvision.ops layers it may import
        for dep in ("misc", "stochastic_depth"):
            paconverted(f"torchvision/ops/{dep}.py")
    src = os.path.join(os.path.dirname(importlib.import_module(package).__file__), relpath)
    generated = os.path.join(_out_dir(), name + "_generated.py")
    run_paconvert(src, generated)
    with open(generated, encoding="utf-8") as f:
        text = fix_text(path, f.read())
    fixed = os.path.join(_out_dir(), name + ".py")
    with open(fixed, "w", encoding="utf-8") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(name, fixed)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    import paddle
    before = dict(vars(paddle.Tensor))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        # what the generated code sets on paddle.Tensor at import (PaConvert's BERT replaces
        # Tensor.split with a torch-style one, which breaks paddle.compat.nn.MultiheadAttention's
        # own split in any port run after it in the process): kept with the module, put back here,
        # and set only while that port runs (ConvertedPair.patched)
        module.tensor_patches = {k: v for k, v in vars(paddle.Tensor).items() if before.get(k, _ABSENT) is not v}
        _restore(paddle.Tensor, before, module.tensor_patches)
    return module


@dataclass(frozen=True)
class ConvertedPair:
    """The builder `builder` of the installed file `path` (torch) against the same builder in
    PaConvert's output of that file (paddle), given the same keyword arguments."""
    name: str
    path: str  # "torchvision/models/resnet.py"
    builder: str
    size: int = 0  # the side of the input image
    kwargs: tuple = ()  # (key, value) pairs given to both builders
    fix: object = None  # applied to the paddle model after it is built
    input_shape: tuple = ()  # default: one RGB image of size x size
    inputs: object = None  # a function returning the inputs, instead of one image

    @property
    def shape(self) -> tuple:
        return self.input_shape or (1, 3, self.size, self.size)

    def torch_model(self):
        import importlib

        import torch

        from ports_vision import calibrate_batchnorms
        module = importlib.import_module(os.path.splitext(self.path)[0].replace("/", "."))
        torch.manual_seed(0)
        model = getattr(module, self.builder)(**dict(self.kwargs))
        if self.inputs is None:
            calibrate_batchnorms(model, self.shape)
        return model.eval()

    def paddle_model(self):
        import paddle
        paddle.seed(0)
        model = getattr(paconverted(self.path), self.builder)(**dict(self.kwargs))
        if self.fix is not None:
            self.fix(model)
        return model.eval()

    def spec(self):
        from converter import PortSpec
        image = (lambda: (np.random.default_rng(0).standard_normal(self.shape).astype("float32"),))
        return PortSpec(torch_model=self.torch_model, paddle_model=self.paddle_model, inputs=self.inputs or image,
                        mapping=None, label=f"<{self.name}>")


def set_on_layers(cls_name: str, attr: str, value, first_only: bool = False):
    """A planted bug: `attr` set to `value` on the paddle model's layers of class `cls_name` (the
    first one only where `first_only`)."""
    def fix(model):
        layers = [layer for _, layer in model.named_sublayers() if type(layer).__name__ == cls_name]
        assert layers, f"no {cls_name} in the paddle model"
        for layer in layers[:1] if first_only else layers:
            setattr(layer, attr, value)
    return fix
