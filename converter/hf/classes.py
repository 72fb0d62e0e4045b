"""The two classes `verify-port HF_DIR PADDLE_DIR` builds: transformers' class of config.json's
architecture, and the paddle class of the same architecture in PaddleFormers (else PaddleNLP).

PaddleFormers 1.2 imports modules it does not install: the modeling files of qwen2, qwen3, their
MoE kin and glm4_moe import paddlefleet's GPT provider at the top (their `XForCausalLM` is built
by paddlefleet; their plain-paddle class, `XForCausalLMDeprecated`, does not use it), and the MoE
token dispatcher (qwen3_moe, deepseek_v3, glm4_moe) imports paddlefleet_ops only to ask whether
DeepEP is there. Where one of those is missing, a stand-in that says what the plain-paddle
classes ask (an empty provider with its `transform_rules`; DeepEP not available) lets the file
import, and the class's description names the module that is missing; a module missing that no
stand-in replaces is named in one line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from dataclasses import dataclass

from ..errors import UserError, quoted
from .directory import WRITTEN_FOR

LIBRARIES = (("paddleformers", "PaddleFormers"), ("paddlenlp", "PaddleNLP"))  # tried in this order
DOCS = "docs/verify-port.md#model-directories"
PROVIDER = "paddleformers.transformers.gpt_provider"  # imports paddlefleet at the top
FLEET, FLEET_OPS = "paddlefleet", "paddlefleet_ops"
_ADDED: dict[tuple[str, str], list[str]] = {}  # (library, class name) -> the stand-ins its import added


@dataclass(frozen=True)
class PaddleClass:
    """The paddle model class for an architecture: the library's module name, its name for users,
    the class, and why it is not the class of the architecture's own name, or which stand-ins
    it was imported with (or None)."""

    library: str
    library_name: str
    cls: type
    note: str | None = None

    def describe(self) -> str:
        version = importlib.metadata.version(self.library)
        return f"{self.library_name} {version}'s {self.cls.__name__}" + (f" ({self.note})" if self.note else "")


# transformers ------------------------------------------------------------------------------------
def torch_class_of(architecture: str) -> type:
    """transformers' class of that name (torch imported first: PaddleFormers imported before torch
    hides torch from transformers)."""
    from ..lazy import import_torch
    import_torch()
    _hide_torchcodec_without_metadata()
    if importlib.util.find_spec("transformers") is None:
        raise UserError("verify-port HF_DIR PADDLE_DIR builds the torch model with transformers, which is not "
                        "installed; install it (pip install transformers) or write a port spec (see "
                        f"{DOCS})")
    import transformers
    try:
        return getattr(transformers, architecture)
    except (AttributeError, ImportError, RuntimeError):
        raise UserError(f"transformers {transformers.__version__} has no {quoted(architecture)} (config.json's "
                        f"'architectures'); install a version that has it, or write a port spec (see {DOCS})") from None


def _hide_torchcodec_without_metadata() -> None:
    """paddlecodec (a PaddleFormers dependency) installs a `torchcodec` package without its
    distribution metadata, and transformers fails to import any torch model when it finds one
    (it asks for the version); transformers works without torchcodec, as PaddleFormers makes it."""
    if "torchcodec" in sys.modules or importlib.util.find_spec("torchcodec") is None:
        return
    try:
        importlib.metadata.version("torchcodec")
    except importlib.metadata.PackageNotFoundError:
        sys.modules["torchcodec"] = None


# the paddle libraries ----------------------------------------------------------------------------
def paddle_class_of(architecture: str, written_for: str | None = None, paddle_dir: str = "") -> PaddleClass:
    """The paddle class of `architecture`: from the library PADDLE_DIR was written for where its
    config.json says (`written_for`), else from the first installed library that has it."""
    from ..lazy import import_paddle
    import_paddle()
    installed = [(lib, name) for lib, name in LIBRARIES if importlib.util.find_spec(lib) is not None]
    if written_for in dict(LIBRARIES):
        wanted = [(lib, name) for lib, name in installed if lib == written_for]
        if not wanted:
            other = [lib for lib, _ in installed]
            instead = f", or convert HF_DIR again for {other[0]} (--target {other[0]})" if other else ""
            raise UserError(f"PADDLE_DIR {quoted(paddle_dir)} was written for {dict(LIBRARIES)[written_for]} "
                            f"(its config.json's {WRITTEN_FOR!r}), which is not installed: pip install {written_for}"
                            f"{instead}")
        installed = wanted
    if not installed:
        raise UserError("verify-port HF_DIR PADDLE_DIR builds the paddle model with PaddleFormers or PaddleNLP, "
                        "neither of which is installed; install paddleformers (pip install paddleformers) or "
                        f"paddlenlp, or write a port spec (see {DOCS})")
    for library, library_name in installed:
        found = _class_in(library, library_name, architecture)
        if found is not None:
            return found
    names = [f"{name} {importlib.metadata.version(lib)}" for lib, name in installed]
    which = f"neither {' nor '.join(names)} has" if len(names) > 1 else f"{names[0]} has no"
    raise UserError(f"{which} {quoted(architecture)}; write a port spec for this model (see {DOCS})")


def _class_in(library: str, library_name: str, architecture: str) -> PaddleClass | None:
    """The library's class of that name; PaddleFormers' plain-paddle `XForCausalLMDeprecated` first
    where paddlefleet, which builds its `XForCausalLM`, is not installed."""
    module = importlib.import_module(f"{library}.transformers")
    names = [architecture]
    if library == "paddleformers" and importlib.util.find_spec(FLEET) is None:
        names.insert(0, architecture + "Deprecated")
    for name in names:
        cls = _imported(module, library_name, name, architecture)
        if cls is None:
            continue
        notes = [f"its {architecture} is built by {FLEET}, which is not installed"] if name != architecture else []
        notes += [STAND_INS[m][1] for m in _ADDED.get((library, name), [])]
        return PaddleClass(library, library_name, cls, "; ".join(notes) or None)
    return None


def _imported(module: types.ModuleType, library_name: str, name: str, architecture: str) -> type | None:
    """The class `name` of the library's module, or None where it has none; stand-ins added for
    what its import asks and is not installed (recorded in _ADDED). A module missing that no
    stand-in replaces: a UserError naming it."""
    while True:
        try:
            return getattr(module, name)
        except (AttributeError, ImportError) as exc:
            missing, frames, message = _import_failure(exc)
            if isinstance(exc, AttributeError) and not any(f.startswith(module.__name__ + ".") for f in frames):
                return None  # the library has no such name (not a failure inside one of its modules' imports)
            stand_in = _stand_in_for(missing, frames)
            if stand_in is None or not add_stand_in(stand_in):
                what = f"it imports {quoted(missing)}, which is not installed; install it" if missing else message
                whose = library_name + ("'" if library_name.endswith("s") else "'s")
                raise UserError(f"{whose} {quoted(architecture)} cannot be imported: {what}; "
                                f"or write a port spec (see {DOCS})") from None
            _ADDED.setdefault((module.__name__.partition(".")[0], name), []).append(stand_in)


def _import_failure(exc: BaseException) -> tuple[str | None, set[str], str]:
    """What made an import fail, from the first error along its causes (PaddleFormers' lazy module
    wraps it in its own): the top-level name of the module that is not there (None where it
    raised otherwise), the modules whose code the error passed through, and its message."""
    seen = set()
    while id(exc) not in seen and (exc.__cause__ or exc.__context__) is not None:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    frames, tb = set(), exc.__traceback__
    while tb is not None:
        frames.add(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    missing = exc.name.partition(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
    return missing, frames, str(exc)


def _stand_in_for(missing: str | None, frames: set[str]) -> str | None:
    """The stand-in that replaces what failed: the GPT provider where its own import failed and
    paddlefleet is not installed; paddlefleet_ops where it is the module not there."""
    if PROVIDER in frames and PROVIDER not in sys.modules and importlib.util.find_spec(FLEET) is None:
        return PROVIDER
    if missing == FLEET_OPS and FLEET_OPS not in sys.modules:
        return FLEET_OPS
    return None


# the stand-ins -----------------------------------------------------------------------------------
def add_stand_in(name: str) -> bool:
    """Put the stand-in for `name` (PROVIDER or FLEET_OPS) in sys.modules where what it replaces is
    not installed and nothing is there yet; whether it is there."""
    if name not in sys.modules:
        if importlib.util.find_spec(FLEET if name == PROVIDER else name) is not None:
            return False
        stand_in = types.ModuleType(name)
        stand_in.stand_in = True
        for attr, value in STAND_INS[name][0]().items():
            setattr(stand_in, attr, value)
        sys.modules[name] = stand_in
    return getattr(sys.modules[name], "stand_in", False) is True


def _provider() -> dict:
    """An empty GPT provider: the plain-paddle classes do not use it; the providers that the modeling
    files define at import extend its `transform_rules`."""
    return {"GPTModelProvider": type("GPTModelProvider", (), {"transform_rules": {}})}


def _fleet_ops() -> dict:
    """paddlefleet_ops as the MoE token dispatcher asks it: DeepEP is not available (the dispatcher
    then takes its plain-paddle path)."""
    return {"is_deep_ep_available": lambda: False}


STAND_INS = {  # the module -> (what it holds, what the description of a class whose import added it says)
    PROVIDER: (_provider, f"an empty stand-in for {FLEET}'s GPT provider, which this class does not use, lets its "
                          "modeling file import"),
    FLEET_OPS: (_fleet_ops, f"{FLEET_OPS} is not installed: a stand-in that says DeepEP is not available lets the "
                            "MoE token dispatcher import"),
}
