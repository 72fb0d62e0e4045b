#!/usr/bin/env bash
# Build, once, the side virtual environment of the suite on ports nobody here wrote
# (tests/real_ports: torchvision against paddle.vision, and PaConvert's output of real model
# files, public hand-written ports and timm), and print its python's path as the last line of stdout.
#
#   PY=$(scripts/side_env_ports.sh) && "$PY" -m pytest -q tests/real_ports
#
# It sits at $T2P_SIDE_ENV_PORTS (default ~/.cache/torch2paddle-port/side-env-ports) and is built
# as scripts/side_env.sh builds the first one (same stamps, same rebuild rules), under
# scripts/constraints_ports.txt instead of constraints.txt: torchvision 0.29.1 runs beside torch
# 2.14.1 only (a CUDA build of torch: several GB), never beside constraints.txt's 2.13.0.
# torchvision, PaConvert, transformers and timm are never dependencies of this project (timm: ConvNeXt's
# original file imports its layers; timm 1.0.31 installs beside the pins, pulling nothing else). The project is
# installed editable without dependencies (its hard ones are installed beside the pins).
set -euo pipefail

# shellcheck source=scripts/side_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/side_env.sh"

CONSTRAINTS="$ROOT/scripts/constraints_ports.txt"
PINS=(torch==2.14.1 torchvision==0.29.1 paddlepaddle==3.3.1 paconvert==3.3.1 black==22.8.0 isort==5.11.5
      transformers==4.44.2 timm==1.0.31)
OTHERS=(numpy safetensors click tqdm google-re2 isal pytest)
PROJECT_ARGS=(--no-deps -e "$ROOT")
build_side_env "${T2P_SIDE_ENV_PORTS:-$HOME/.cache/torch2paddle-port/side-env-ports}"
