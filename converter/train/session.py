"""Both models set up for training checks: weights as the forward check has them, dropout at 0,
training mode, the parameter correspondence, torch's optimizer translated, and the initial states to
start every run from."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import numpy as np

from ..compare.session import PortSession
from ..errors import UserError
from ..spec import PortSpec
from .optimizer import Translation, translate


@contextlib.contextmanager
def one_thread():
    """Torch's CPU work inside on one thread (this thread's count put back after): the checks' own
    copies of tensors and their float64 reference steps, passes over each tensor that are not the
    models' arithmetic. At a layer's size OpenMP's fork and join cost about what they save, and on a
    machine whose cores other work holds every pass waits for a core (a copy of a 256 x 256 weight:
    15 us on one thread, milliseconds on two beside other work). Elementwise results are the same on
    any thread count."""
    import torch
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class ParamPair:
    """A paddle state-dict entry and the torch entries it is computed from (by the mapping)."""

    paddle: str
    torch: list
    entry: object  # the plan's TargetEntry: how torch's arrays become paddle's

    @property
    def torch_name(self) -> str:
        return self.torch[0] if len(self.torch) == 1 else "+".join(self.torch)

    def to_paddle(self, arrays: dict) -> np.ndarray:
        """Torch-side arrays (name -> array, in torch's layout) in paddle's layout, dtype kept: a view
        where the plan's rules give one (a transpose keeps torch's order in memory)."""
        pieces = [part.apply(np.asarray(arrays[part.source])) for part in self.entry.parts]
        if self.entry.merge_axis is None:
            return pieces[0]
        return np.concatenate(pieces, axis=self.entry.merge_axis)


@dataclass(frozen=True)
class Zeroed:
    """A dropout rate set to 0: `holder.attr` was `rate`; `path` is the module's (or the layer's) path
    in its model, "" the model itself; `config` is true for a model config's field."""

    holder: object
    attr: str
    rate: float
    path: str
    config: bool = False

    @property
    def name(self) -> str:
        if self.config:
            return f"config.{self.attr}"
        return f"{self.path}.{self.attr}" if self.path else self.attr


@dataclass(frozen=True)
class DropoutState:
    torch: list  # Zeroed
    paddle: list

    @property
    def count(self) -> tuple[int, int]:
        """How many modules (torch) and layers (paddle) had a rate zeroed; config fields not counted."""
        held = lambda zeroed: len({id(z.holder) for z in zeroed if not z.config})
        return held(self.torch), held(self.paddle)

    def restore(self) -> None:
        for z in reversed(self.torch + self.paddle):
            setattr(z.holder, z.attr, z.rate)


TORCH_DROPOUT_ATTRS = {"Dropout": "p", "Dropout1d": "p", "Dropout2d": "p", "Dropout3d": "p", "AlphaDropout": "p",
                       "FeatureAlphaDropout": "p", "MultiheadAttention": "dropout", "LSTM": "dropout", "GRU": "dropout",
                       "RNN": "dropout"}
PADDLE_DROPOUT_ATTRS = {"Dropout": "p", "Dropout2D": "p", "Dropout3D": "p", "AlphaDropout": "p",
                        "FeatureAlphaDropout": "p", "MultiHeadAttention": "dropout", "LSTM": "dropout", "GRU": "dropout",
                        "SimpleRNN": "dropout"}


def _dropout_attr(module, table: dict) -> str | None:
    """The attribute holding `module`'s dropout probability, by its class or the nearest base class
    the table names (a model's own subclass of MultiHeadAttention drops out as its base does)."""
    return next((table[c.__name__] for c in type(module).__mro__ if c.__name__ in table), None)


def _rate(value) -> bool:
    """A dropout probability to zero: a number (not a flag) above 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _rate_attrs(obj) -> list[str]:
    """`obj`'s own attributes that hold a dropout rate by their name: a probability whose name says drop
    (HF sdpa attention's dropout_prob handed to scaled_dot_product_attention, DeBERTa's StableDropout
    drop_prob, attention_dropout, a config's hidden_dropout_prob, layerdrop)."""
    return [k for k, v in vars(obj).items() if "drop" in k.lower() and isinstance(v, float) and 0 < v <= 1]


def _zero_dropout(named, table: dict) -> list[Zeroed]:
    """Every dropout the modules apply set to 0: the rate of a dropout module (by class), every
    attribute that holds a rate by its name, and those of the model configs the modules hold."""
    configs, saved = set(), []
    for path, module in named:
        attrs = [_dropout_attr(module, table)] + _rate_attrs(module)
        for attr in dict.fromkeys(a for a in attrs if a is not None):
            if _rate(getattr(module, attr, None)):
                saved.append(Zeroed(module, attr, getattr(module, attr), path))
                setattr(module, attr, 0.0)
        config = vars(module).get("config")
        if config is not None and id(config) not in configs and hasattr(config, "__dict__"):
            configs.add(id(config))
            for attr in _rate_attrs(config):
                saved.append(Zeroed(config, attr, getattr(config, attr), "", config=True))
                setattr(config, attr, 0.0)
    return saved


class TrainSession:
    """The models of a set-up PortSession (its conversion, its precision, its --emulate formats),
    ready for the training checks of `tspec`; `restore()` puts them back as the forward check takes them."""

    port: PortSession
    spec: PortSpec
    device: str
    torch_model: object
    paddle_model: object
    formats: dict  # side -> the format its matmuls compute in
    torch_init: dict  # torch's state dict as given, cloned
    paddle_init: dict  # paddle's, as numpy arrays
    pairs: list  # ParamPair per paddle state-dict entry the conversion computes
    # torch's optimizer translated to paddle's (None where it has none and the spec gives paddle_optimizer),
    # and (model, optimizer): the optimizer it was read from, as the spec builds it on a copy of torch's model
    translation: Translation | None
    torch_optimizer: tuple
    dropout: DropoutState  # the dropout rates set to 0, put back by restore()

    def __init__(self, port: PortSession, tspec):
        self.port = port
        self.spec = port.spec
        self.device = port.device
        self.torch_model = port.torch_model
        self.paddle_model = port.paddle_model
        self.formats = port.formats
        with one_thread():
            self.torch_init = {k: v.detach().clone() for k, v in self.torch_model.state_dict().items()}
        self.paddle_init = {k: np.array(v.numpy()) for k, v in self.paddle_model.state_dict().items()}
        self.pairs = self._pairs()
        self._run_only = {}  # side -> the copy run_only_copy gives
        self._spare = {}  # (side, dtype) -> a copy no check runs any more, to be the next one asked for
        # before any rate is set to 0: where torch's optimizer has no translation, the models are left as given
        self.translation, self.torch_optimizer = _translated(self, tspec)
        self.dropout = DropoutState(_zero_dropout(self.torch_model.named_modules(), TORCH_DROPOUT_ATTRS),
                                    _zero_dropout(self.paddle_model.named_sublayers(include_self=True),
                                                  PADDLE_DROPOUT_ATTRS))

    def _pairs(self) -> list[ParamPair]:
        table = self.port.plan.by_output_name()
        out = []
        for name in self.paddle_init:
            entry = table.get(name)
            if entry is not None and entry.name == name:  # aliases hold the same tensor
                out.append(ParamPair(name, [p.source for p in entry.parts], entry))
        return out

    # fresh models --------------------------------------------------------------------------
    def torch_copy(self, dtype=None):
        """A torch model at the initial weights (float64 when asked), in training mode, on CPU for float64:
        a copy given back (done_with) reset, else a new one."""
        import torch
        model = self._spare.pop(("torch", dtype), None)
        with one_thread():
            if model is not None:
                model.zero_grad(set_to_none=True)
                model.load_state_dict(self.torch_init)  # widened to float64 on the way, for a float64 model
            else:
                model = copy.deepcopy(self.torch_model)
                model.load_state_dict(self.torch_init)
                if dtype == torch.float64:
                    model = model.double().cpu()
        model.train()
        return model

    def paddle_copy(self):
        """A paddle model at the initial weights, in training mode: a copy given back (done_with) reset,
        else a new one."""
        model = self._spare.pop(("paddle", None), None)
        if model is not None:
            model.clear_gradients(set_to_zero=False)
        else:
            model = copy.deepcopy(self.paddle_model)
        model.set_state_dict(self.paddle_init)
        model.train()
        return model

    def done_with(self, model, side: str, dtype=None) -> None:
        """`model`, a torch (float64 when `dtype` says so) or paddle copy that no check will run again,
        with no hook left on it: the next copy of its kind asked for is this one, reset to the initial
        weights with its gradients dropped, rather than a new deep copy."""
        self._spare[side, dtype] = model

    def done_with_run_only(self, side: str) -> None:
        """The checks that only run the model of `side` are done: its shared copy (run_only_copy) is given
        back (done_with); a later run_only_copy of that side makes a new one."""
        if side in self._run_only:
            self.done_with(self._run_only.pop(side), side)

    def run_only_copy(self, side: str):
        """A copy of the torch model (side "torch") or the paddle model ("paddle") at the initial weights, in
        training mode, shared by the checks that only run it: forward, and backward into its gradients,
        with their hooks removed after; none steps it or builds an optimizer on it (an optimizer factory
        of the spec's may change the model it is handed). Made when first asked for."""
        if side not in self._run_only:
            self._run_only[side] = self.torch_copy() if side == "torch" else self.paddle_copy()
        return self._run_only[side]

    def restore(self) -> None:
        """The models as they were given: initial weights, dropout, evaluation mode."""
        self.torch_model.load_state_dict(self.torch_init)
        self.paddle_model.set_state_dict(self.paddle_init)
        self.dropout.restore()
        self.torch_model.eval()
        self.paddle_model.eval()


def _translated(session: TrainSession, tspec) -> tuple:
    """(translation, (model, optimizer)): torch's optimizer translated to paddle's (None when it has no
    translation and the spec gives paddle_optimizer itself), and the optimizer it was read from, as the
    spec builds it on a copy of torch's model."""
    model = session.torch_copy()
    opt, sched = tspec.torch_optimizer(model)
    try:
        translation = translate(opt, sched, tspec.clip_grad_norm)
    except UserError:
        if tspec.has["paddle_optimizer"]:
            return None, (model, opt)
        raise
    held = _held(session, model, opt)
    return (translation if held is None else translation.only(held)), (model, opt)


def _held(session: TrainSession, model, opt):
    """The paddle parameters whose torch counterparts torch's optimizer holds, where it does not
    hold every trainable parameter (fine-tuning a part); None where it holds them all."""
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    if all(id(p) in ids for p in model.parameters() if p.requires_grad):
        return None
    names = {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in ids}
    paddle_params = {n for n, _ in session.paddle_model.named_parameters()}
    return [pair.paddle for pair in session.pairs if pair.paddle in paddle_params and set(pair.torch) <= names]
