#!/usr/bin/env bash
# Build, once, the second side virtual environment: HF transformers 5 against PaddleFormers 1.2,
# and print its python's path as the last line of stdout.
#
#   PY=$(scripts/side_env_paddleformers.sh) && "$PY" -m pytest -q tests/real_models_paddleformers
#
# It sits at $T2P_SIDE_ENV_PADDLEFORMERS (default ~/.cache/torch2paddle-port/side-env-paddleformers)
# and is built as scripts/side_env.sh builds the first one (same stamps, same rebuild rules). torch
# and paddle come from constraints.txt. The project is installed editable without dependencies
# (its hard ones are installed beside the pins): pip never re-resolves PaddleFormers' pins.
#
# In a process that uses both libraries, import torch before paddleformers (otherwise transformers'
# torch models are hidden in it), and hide paddlecodec's `torchcodec` module, which has no
# distribution metadata, before importing transformers: sys.modules["torchcodec"] = None.
set -euo pipefail

# shellcheck source=scripts/side_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/side_env.sh"

PINS=(paddleformers==1.2.0 "transformers>=5.0,<5.4")
OTHERS=(torch paddlepaddle safetensors click tqdm google-re2 isal pytest hypothesis)
PROJECT_ARGS=(--no-deps -e "$ROOT")
build_side_env "${T2P_SIDE_ENV_PADDLEFORMERS:-$HOME/.cache/torch2paddle-port/side-env-paddleformers}"
