"""What verify-port --train adds to the command: run the checks, print them, write the optimizer."""

from __future__ import annotations

import click

from ..api import MAX_STEPS
from ..errors import UserError


def run_checks(spec, options, steps: int, weights, converted, mapping, emit_optimizer):
    """--train: the training checks of `spec`, then the forward check, on one session (one
    conversion, one float64 copy of the torch model) under the command's options; prints the
    training checks' lines. Returns (the forward Report, the TrainReport)."""
    from ..compare.session import PortSession
    from ..verify.run import run_on
    from .report import render_text
    from .run import train_on, translation_of
    from .spec import TrainSpec
    if not 1 <= steps <= MAX_STEPS:
        raise UserError(f"--steps takes 1 to {MAX_STEPS} steps; got {steps}")
    if emit_optimizer:
        translation_of(spec)  # nothing to write is bad input, said before the checks run
    tspec = TrainSpec(spec)
    session_options = options.session_options()
    with PortSession(spec, session_options, weights=weights, converted=converted, mapping=mapping) as session:
        trained = train_on(session, tspec, steps)  # first: it gives the models back as it found them
        click.echo(render_text(trained))
        return run_on(session, session_options, options.bisect), trained


def add_train(report, body: dict, page: str):
    """The forward report's JSON and HTML with the training section added."""
    from .report import render_html
    return dict(body, train=report.to_json()), render_html(report, page)
