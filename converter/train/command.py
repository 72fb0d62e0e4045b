"""What verify-port --train adds to the command: run the checks, print them, write the optimizer."""

from __future__ import annotations

import click

from ..api import MAX_STEPS
from ..errors import UserError


def run_train(spec, options, steps: int, weights, converted, mapping, emit_optimizer):
    """The training checks of `spec` under the command's options, through the Python API's
    verify_port; prints their lines."""
    import dataclasses

    from ..api import verify_port
    from .report import render_text
    from .run import translation_of
    if not 1 <= steps <= MAX_STEPS:
        raise UserError(f"--steps takes 1 to {MAX_STEPS} steps; got {steps}")
    if emit_optimizer:
        translation_of(spec)  # nothing to write is bad input, said before the checks run
    report = verify_port(spec, dataclasses.replace(options, train=True, steps=steps), weights=weights,
                         converted=converted, mapping=mapping)
    click.echo(render_text(report))
    return report


def add_train(report, body: dict, page: str):
    """The forward report's JSON and HTML with the training section added."""
    from .report import render_html
    return dict(body, train=report.to_json()), render_html(report, page)
