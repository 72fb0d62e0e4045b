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
#
# Sourced, this file defines build_side_env only (scripts/side_env_paddleformers.sh builds its
# environment with it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}

# build_side_env DIR: builds DIR from the arrays PINS and OTHERS (installed together under
# $CONSTRAINTS, default constraints.txt), installs the project with PROJECT_ARGS (pip arguments after
# `--no-build-isolation`), each step only when what it depends on changed, and prints DIR's python.
build_side_env() {
    local env_dir=$1
    local py="$env_dir/bin/python"
    local stamp="$env_dir/.torch2paddle-side-env"
    local constraints=${CONSTRAINTS:-$ROOT/constraints.txt}
    local want
    want=$({ printf '%s\n' "${PINS[@]}" "${OTHERS[@]}"; cat "$constraints"; "$PYTHON" -c 'import sys; print(sys.version)'; } \
        | sha256sum | cut -d' ' -f1)

    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" || ! -x "$py" ]]; then
        echo "side_env: building $env_dir (pins changed or first build)" >&2
        local start=$SECONDS
        rm -rf "$env_dir"
        mkdir -p "$(dirname "$env_dir")"
        "$PYTHON" -m venv "$env_dir"
        "$py" -m pip install --quiet -c "$constraints" "${OTHERS[@]}" "${PINS[@]}" >&2
        echo "$want" > "$stamp"  # written last: an interrupted build is redone next time
        echo "side_env: built in $((SECONDS - start)) s" >&2
    fi

    # The project, editable; again when setup.py changes or another clone is to be installed.
    local project_stamp="$env_dir/.torch2paddle-project"
    local project_key
    project_key="$(realpath "$ROOT") $(sha256sum "$ROOT/setup.py" | cut -d' ' -f1)"
    if [[ ! -f "$project_stamp" || "$(cat "$project_stamp")" != "$project_key" ]]; then
        "$py" -I -c 'import setuptools' 2>/dev/null || "$py" -m pip install --quiet setuptools >&2
        "$py" -m pip install --quiet --no-build-isolation "${PROJECT_ARGS[@]}" >&2
        echo "$project_key" > "$project_stamp"
    fi

    echo "$py"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    PINS=(paddlenlp==2.8.1 huggingface_hub==0.24.7 transformers==4.44.2 "aistudio-sdk<0.2" "datasets<3" "pyarrow<17" "numpy<2")
    # torch and paddle come from constraints.txt; the project's own hard dependencies and pytest beside them
    OTHERS=(torch paddlepaddle safetensors click tqdm pytest)
    # the project with its hard dependencies (setup.py's install_requires, no extras) resolved with the pins
    PROJECT_ARGS=(-c "$ROOT/constraints.txt" -e "$ROOT" "${PINS[@]}")
    build_side_env "${T2P_SIDE_ENV:-$HOME/.cache/torch2paddle-port/side-env}"
fi
