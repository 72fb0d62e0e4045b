"""What verify-port --train adds to the command: run the checks, print them, write the optimizer."""

from __future__ import annotations

import click

from ..errors import UserError


def run_train(spec, options, steps: int, weights, converted, mapping, emit_optimizer):
    """The training checks of `spec` under the command's options; prints their lines."""
    from .report import render_text
    from .run import train_check
    report = train_check(spec, steps, options.device, options.precision, dict(options.emulate), weights, converted,
                         mapping)
    if emit_optimizer and report.optimizer_code is None:
        raise UserError("--emit-optimizer: torch's optimizer has no translation here, and the spec gives "
                        "paddle_optimizer(model) itself; there is nothing to write")
    click.echo(render_text(report))
    return report


def write_optimizer(report, path: str | None, force: bool) -> None:
    """--emit-optimizer: paddle's translated optimizer as a spec's paddle_optimizer(model)."""
    if path:
        from ..cli_common import write_output
        write_output(path, report.optimizer_code, force)
        click.echo(f"paddle's optimizer written to {path}", err=True)


def add_train(report, body: dict, page: str):
    """The forward report's JSON and HTML with the training section added."""
    from .report import render_html
    return dict(body, train=report.to_json()), render_html(report, page)
