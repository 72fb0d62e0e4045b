#!/usr/bin/env bash
# Build, once, the side virtual environment in which the real-model suite runs (HF transformers
# against PaddleNLP 2.8.1's ports), and print its python's path as the last line of stdout.
#
#   PY=$(scripts/side_env.sh) && "$PY" -m pytest -q tests/real_models
#
# PaddleNLP and transformers are never dependencies of this project: they live only here. The
# environment sits outside the clone, at $T2P_SIDE_ENV (default
# ~/.cache/torch2paddle-port/side-env), and is rebuilt only when its pins change: a stamp file
# holds a hash of the pins, constraints.txt and the python version. This project is installed
# into it editable with its hard dependencies only (no extras: torch and paddle come from
# constraints.txt, and pip never re-resolves them against PaddleNLP's pins), again when setup.py
# changes or the clone moves.
# Build output goes to stderr; stdout carries the python path only.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ENV_DIR=${T2P_SIDE_ENV:-$HOME/.cache/torch2paddle-port/side-env}
PYTHON=${PYTHON:-python3}
PINS=(paddlenlp==2.8.1 huggingface_hub==0.24.7 transformers==4.44.2 "aistudio-sdk<0.2" "datasets<3" "pyarrow<17" "numpy<2")
# torch and paddle come from constraints.txt; the project's own hard dependencies and pytest beside them
OTHERS=(torch paddlepaddle safetensors click tqdm pytest)

key() {
    { printf '%s\n' "${PINS[@]}" "${OTHERS[@]}"; cat "$ROOT/constraints.txt"; "$PYTHON" -c 'import sys; print(sys.version)'; } \
        | sha256sum | cut -d' ' -f1
}

STAMP="$ENV_DIR/.torch2paddle-side-env"
WANT=$(key)
PY="$ENV_DIR/bin/python"

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" || ! -x "$PY" ]]; then
    echo "side_env: building $ENV_DIR (pins changed or first build)" >&2
    start=$SECONDS
    rm -rf "$ENV_DIR"
    mkdir -p "$(dirname "$ENV_DIR")"
    "$PYTHON" -m venv "$ENV_DIR"
    "$PY" -m pip install --quiet -c "$ROOT/constraints.txt" "${OTHERS[@]}" "${PINS[@]}" >&2
    echo "$WANT" > "$STAMP"  # written last: an interrupted build is redone next time
    echo "side_env: built in $((SECONDS - start)) s" >&2
fi

# The project, editable, with its hard dependencies (setup.py's install_requires, no extras) resolved
# together with the pins; again when setup.py changes or another clone is to be installed.
PROJECT_STAMP="$ENV_DIR/.torch2paddle-project"
PROJECT_KEY="$(realpath "$ROOT") $(sha256sum "$ROOT/setup.py" | cut -d' ' -f1)"
if [[ ! -f "$PROJECT_STAMP" || "$(cat "$PROJECT_STAMP")" != "$PROJECT_KEY" ]]; then
    "$PY" -I -c 'import setuptools' 2>/dev/null || "$PY" -m pip install --quiet setuptools >&2
    "$PY" -m pip install --quiet --no-build-isolation -c "$ROOT/constraints.txt" -e "$ROOT" "${PINS[@]}" >&2
    echo "$PROJECT_KEY" > "$PROJECT_STAMP"
fi

echo "$PY"
