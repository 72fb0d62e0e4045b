"""The convert-weights command: a weights file, or an HF model directory into a directory."""

from __future__ import annotations

import click

from .. import api
from ..errors import CheckFailed, UserError
from .common import CONTEXT, OneLineCommand, one_line_errors, progress_shown, say


@click.command(cls=OneLineCommand, context_settings=CONTEXT)
@click.argument("src")
@click.argument("dst")
@click.option("--mapping", metavar="auto|NAME|FILE", help="Shipped rule set by name, a rule file, or auto (the default "
              "without --spec): the shipped set that fits the checkpoint's keys.")
@click.option("--spec", "spec_path", metavar="FILE", help="Port spec: infer rules from the two models and check the result loads.")
@click.option("--dtype", metavar="D", help="Cast floating tensors to D (float32, float16, bfloat16).")
@click.option("--force", is_flag=True, help="Replace an existing output (only once the new file is complete).")
@click.option("--emit-mapping", metavar="FILE", help="Write the rules used, to review, edit and pass back with --mapping.")
@click.option("--json", "json_path", metavar="FILE", help="Write a JSON report.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--max-shard-size", metavar="SIZE", help="Model directories: cut the weights into shards of at most SIZE "
              "(5GB, 500MB, 2GiB) with an index; without it, shards as the source was.")
@click.option("--target", metavar="paddleformers|paddlenlp", help="The library the weights are for: PaddleFormers 1.2 "
              "or PaddleNLP 2.8.1 (default: PaddleFormers where it has the family, else PaddleNLP).")
@click.option("--allow-outside-shards", is_flag=True,
              help="Read shards an index names outside its own directory (refused by default).")
@one_line_errors
def convert_weights(src, dst, mapping, spec_path, dtype, force, emit_mapping, json_path, quiet, max_shard_size,
                    target, allow_outside_shards):
    """Convert the torch checkpoint SRC to Paddle weights DST (.pdparams or .safetensors), or the HF model
    directory SRC to the directory DST that PaddleFormers' or PaddleNLP's from_pretrained loads."""
    api.check_target(target)
    if api.converts_a_directory(src, dst):
        if spec_path or emit_mapping:
            raise UserError("--spec and --emit-mapping take a weights file; give SRC as its config.json's weights file")
        done = api.convert_directory(src, dst, mapping=mapping, dtype=dtype, force=force, max_shard_size=max_shard_size,
                                     progress=progress_shown(quiet), log=say, json_path=json_path, target=target)
        say(f"converted {done.tensors} tensors ({done.bytes / 2**20:.1f} MiB) with mapping '{done.mapping}' "
            f"into {dst}: {', '.join(done.files)}; every tensor checked bit for bit")
        return
    if max_shard_size:
        raise UserError("--max-shard-size applies when SRC is an HF model directory (with config.json) and DST a directory")

    spec = api.PortSpec.from_file(spec_path) if spec_path else None
    result = api.convert_weights(src, dst, mapping=mapping, spec=spec, dtype=dtype, force=force,
                                 emit_mapping=emit_mapping, progress=progress_shown(quiet), log=say,
                                 json_path=json_path, allow_outside_shards=allow_outside_shards, target=target)
    say(f"converted {result.tensors} tensors ({result.bytes / 2**20:.1f} MiB) with mapping "
        f"'{result.mapping}' to {dst}; dropped {len(result.dropped)} key(s)")
    say("check passed: every written tensor matches its source bit for bit")
    if result.missing_keys is not None:
        if result.missing_keys or result.unexpected_keys:
            raise CheckFailed("the paddle model does not take the converted file cleanly",
                              [f"missing: {k}" for k in result.missing_keys]
                              + [f"unexpected: {k}" for k in result.unexpected_keys])
        say("loaded into the paddle model: no missing or unexpected keys")
