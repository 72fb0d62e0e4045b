"""What is trained, as opposed to how: parameters trainable on one side only, parameters missing
from paddle's optimizer, weights tied in torch but not in paddle, and dropout rates that differ
between paired layers."""

from __future__ import annotations

from collections import defaultdict

from ..paths import prefixes
from .result import Row
from .session import TrainSession
from .spec import paddle_held
from .backward import LayerPairs

INF = float("inf")


def structure_rows(session: TrainSession, pairs: LayerPairs, torch_side: tuple, paddle_side: tuple) -> list:
    """The structure phase's rows, from torch's optimizer as the spec builds it on a copy of torch's
    model and paddle's on a copy of paddle's: `torch_side` and `paddle_side` are (model, optimizer)."""
    (torch_model, topt), (paddle_model, popt) = torch_side, paddle_side
    tparams = dict(torch_model.named_parameters(remove_duplicate=False))
    pstate = paddle_model.state_dict()
    pparams = dict(paddle_model.named_parameters())
    in_topt = {id(p) for g in topt.param_groups for p in g["params"]}
    in_popt = {id(p) for p in paddle_held(popt)}
    rows = []
    for pair in session.pairs:
        if len(pair.torch) != 1 or pair.torch[0] not in tparams or pair.paddle not in pparams:
            continue
        t, p = tparams[pair.torch[0]], pparams[pair.paddle]
        t_train, p_train = t.requires_grad, not p.stop_gradient
        if t_train != p_train:
            side = "torch" if t_train else "paddle"
            rows.append(Row("structure", None, pair.torch[0], pair.paddle, INF, note=(
                f"trainable in {side} only (torch requires_grad={t_train}, paddle stop_gradient={p.stop_gradient})")))
            continue
        if t_train and (id(t) in in_topt) != (id(p) in in_popt):
            where = "paddle's optimizer" if id(t) in in_topt else "torch's optimizer"
            rows.append(Row("structure", None, pair.torch[0], pair.paddle, INF, note=f"missing from {where}"))
    rows += _ties(session, torch_model, pstate)
    return rows + dropout_rows(session, pairs)


def _ties(session: TrainSession, torch_model, pstate) -> list:
    """Torch parameters that are one tensor whose paddle counterparts are separate tensors."""
    from ..rules.infer import same_tensor_groups
    by_torch = {pair.torch[0]: pair.paddle for pair in session.pairs if len(pair.torch) == 1}
    for entry in session.port.plan.entries:  # aliases: one paddle tensor under several names
        for alias in entry.aliases:
            by_torch.setdefault(entry.parts[0].source, alias)
    rows = []
    for names in same_tensor_groups(torch_model.named_parameters(remove_duplicate=False)):
        mapped = [(n, by_torch.get(n)) for n in names]
        paddle_names = {pstate[p].name for _, p in mapped if p in pstate}
        if len(paddle_names) > 1:
            rows.append(Row("structure", None, " = ".join(names), " , ".join(p for _, p in mapped if p), INF,
                            note="tied in torch, separate tensors in paddle"))
    return rows


SHOWN = 4  # names shown for one rate


def dropout_rows(session: TrainSession, layer_pairs: LayerPairs) -> list:
    """The dropout rates the training checks set to 0, compared between the sides: in each pair of a
    module and a layer (by their state, as the backward pairs them), the distinct rates applied
    under it and under no deeper pair; and the fields of the model configs named alike."""
    pairs = layer_pairs.modules
    back = {p: t for t, p in pairs.items()}
    by_pair = defaultdict(lambda: (defaultdict(list), defaultdict(list)))
    for z in session.dropout.torch:
        if not z.config:
            t = _nearest(z.path, pairs)
            by_pair[t, pairs.get(t, "")][0][z.rate].append(z.name)
    for z in session.dropout.paddle:
        if not z.config:
            p = _nearest(z.path, back)
            by_pair[back.get(p, ""), p][1][z.rate].append(z.name)
    rows = []
    for (t, p), (t_rates, p_rates) in by_pair.items():
        if set(t_rates) != set(p_rates):
            rows.append(Row("structure", None, t or "<model>", p or "<model>", INF,
                            note=f"dropout rates differ: torch {_rates(t_rates)}, paddle {_rates(p_rates)}"))
    t_config = {z.attr: z.rate for z in session.dropout.torch if z.config}
    p_config = {z.attr: z.rate for z in session.dropout.paddle if z.config}
    for attr in sorted(set(t_config) & set(p_config)):
        if t_config[attr] != p_config[attr]:
            rows.append(Row("structure", None, f"config.{attr}", f"config.{attr}", INF,
                            note=f"dropout rates differ: torch {t_config[attr]:g}, paddle {p_config[attr]:g}"))
    return rows


def _nearest(path: str, paired: dict) -> str:
    """The path itself or its nearest ancestor among `paired`'s keys ("" the model)."""
    return next((p for p in reversed(prefixes(path)[1:]) if p in paired), "")


def _rates(rates: dict) -> str:
    if not rates:
        return "none"
    said = []
    for rate, names in sorted(rates.items()):
        shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
        said.append(f"{rate:g} ({shown})")
    return "; ".join(said)
