"""What is trained, as opposed to how: parameters trainable on one side only, parameters missing
from paddle's optimizer, and weights tied in torch but not in paddle."""

from __future__ import annotations

from .loop import paddle_optimizer
from .result import Row

INF = float("inf")


def _paddle_optimized(opt) -> set:
    params = getattr(opt, "_parameter_list", None) or []
    out = set()
    for p in params:
        if isinstance(p, dict):
            out.update(id(q) for q in p.get("params", []))
        else:
            out.add(id(p))
    return out


def structure_rows(session, tspec) -> list:
    torch_model, paddle_model = session.torch_copy(), session.paddle_copy()
    topt, _ = tspec.torch_optimizer(torch_model)
    popt, _ = paddle_optimizer(session, tspec, paddle_model)
    tparams = dict(torch_model.named_parameters(remove_duplicate=False))
    pstate = paddle_model.state_dict()
    pparams = dict(paddle_model.named_parameters())
    in_topt = {id(p) for g in topt.param_groups for p in g["params"]}
    in_popt = _paddle_optimized(popt)
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
    return rows


def _ties(session, torch_model, pstate) -> list:
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
