#!/usr/bin/env bash
# The GPU check: wheels prepared here, one command there (how to run it: scripts/README.md).
#
#   bash scripts/gpu_check.sh prepare         # here, on the CPU machine (.venv and a package
#                                             # registry): the cp312 manylinux wheels the GPU
#                                             # image lacks, into .gpu_wheels/ (git-ignored)
#   bash scripts/gpu_check.sh prepare --plan  # what prepare would fetch, without fetching
#   bash scripts/gpu_check.sh device          # there, from the repository root with $OUT set:
#                                             # install the wheels into a target folder, run the
#                                             # GPU tests and `mage bench hardware --device cuda`
#                                             # for the Qwen3 shapes; JSON under $OUT, < 8 min
#   bash scripts/gpu_check.sh --dry-run       # here: the device half on the CPU with the tiny
#                                             # model and no install, in about a minute
#
# Environment: GPU_WHEELS (default .gpu_wheels); OUT (default: a new temporary folder);
# GPU_CHECK_BUDGET_S (seconds for the device half, default 450; every step is time-boxed
# within it); GPU_CHECK_MODELS (default "qwen3-0.6b qwen3-1.7b qwen3-4b"; dry run: tiny);
# GPU_CHECK_SITE (where the device half installs the wheels, default /tmp/mage-gpu-site);
# GPU_CHECK_STEPS (a rerun of some steps: words among "pytest hardware zero", the part of
# a step's name before its first underscore; env and install always run);
# GPU_CHECK_PROFILE (1, the default: the hardware steps profile the learner and decode;
# 0 leaves the profiles out, about 40 s less per shape).
# To rehearse the device half in a CPU image: GPU_CHECK_PYTHON=3.11 (wheels for that
# Python) for prepare, GPU_CHECK_DEVICE=cpu (small CPU benchmarks) for device.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS="${GPU_WHEELS:-.gpu_wheels}"
LIMIT_MIB=64  # what the device tool carries: the working tree plus the carried folders
MARGIN_MIB=2  # room for the tree to grow between prepare and the run

# -- prepare (CPU machine) ------------------------------------------------------------------

prepare() {
    local py=.venv/bin/python
    [ -x "$py" ] || { echo "prepare needs .venv (bash scripts/setup.sh dev)" >&2; return 2; }
    "$py" scripts/gpu_check.py prepare "$WHEELS" "$LIMIT_MIB" "$MARGIN_MIB" "$@"
}

# -- device half (GPU machine; --dry-run: here, on the CPU) -----------------------------------

step() {  # step NAME LIMIT_S CMD...: run CMD time-boxed, log under $OUT/logs, record the outcome
    local name=$1 limit=$2
    shift 2
    if [ -n "${GPU_CHECK_STEPS:-}" ] && [ "$name" != env ] && [ "$name" != install ] &&
        ! [[ " $GPU_CHECK_STEPS " =~ \ ${name%%_*}\  ]]; then
        printf '%s\tnot asked\t0\n' "$name" >>"$OUT/steps.tsv"
        echo "== $name: not asked (GPU_CHECK_STEPS)"
        return
    fi
    local left=$((BUDGET - ($(date +%s) - START) - 15))
    if [ "$left" -lt 20 ]; then
        printf '%s\tskipped\t0\n' "$name" >>"$OUT/steps.tsv"
        echo "== $name: skipped (budget spent)"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local begin rc
    begin=$(date +%s)
    echo "== $name (at most ${limit}s)"
    timeout -k 10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - begin))" >>"$OUT/steps.tsv"
    tail -n 4 "$OUT/logs/$name.log" | sed 's/^/   /'
    echo "   -> rc $rc in $(($(date +%s) - begin))s"
}

device() {
    local mode=$1
    OUT="${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}"
    mkdir -p "$OUT/logs"
    : >"$OUT/steps.tsv"
    START=$(date +%s)
    BUDGET=${GPU_CHECK_BUDGET_S:-450}
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
    local tests_gpu tests_cpu models bench=() pytest_args
    tests_gpu=$(grep -rl "pytest.mark.gpu" tests --include='*.py' | sort)
    pytest_args=(-o addopts= -p no:cacheprovider -q -rfE)
    local small=(--samples 2 --prompt-len 16 --response-len 4 --repeats 1 --batch-sizes 1,2
        --decode-tokens 3 --matmul-size 256 --copy-mib 8 --profile)
    if [ "$mode" = device ]; then
        PY=$(command -v python3 || command -v python)
        local site=${GPU_CHECK_SITE:-/tmp/mage-gpu-site}
        export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
        models=${GPU_CHECK_MODELS:-qwen3-0.6b qwen3-1.7b qwen3-4b}
        bench=(--device cuda --dtype bf16 --samples 64)
        [ "${GPU_CHECK_PROFILE:-1}" = 1 ] && bench+=(--profile)
        if [ "${GPU_CHECK_DEVICE:-cuda}" = cpu ]; then  # a rehearsal in a CPU image
            bench=(--device cpu "${small[@]}")
        fi
        [ -f "$WHEELS/smollm2-tokenizer/tokenizer.json" ] && bench+=(--tokenizer "$WHEELS/smollm2-tokenizer")
        tests_cpu="tests/policy/test_engine.py tests/policy/test_static_decode.py tests/rl/test_learner.py"
    else
        PY=.venv/bin/python
        [ -x "$PY" ] || PY=$(command -v python3)
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        models=${GPU_CHECK_MODELS:-tiny}
        bench=(--device cpu "${small[@]}")
        tests_cpu="tests/test_cuda.py"
    fi
    echo "gpu_check $mode: results in $OUT, budget ${BUDGET}s"
    step env 60 "$PY" scripts/gpu_check.py env "$OUT" "$WHEELS"
    if [ "$mode" = device ]; then
        step install 90 "$PY" scripts/gpu_check.py install "$OUT" "$WHEELS" "$site"
    fi
    # shellcheck disable=SC2086  # word splitting of the file lists is meant
    step pytest_gpu 150 "$PY" -m pytest "${pytest_args[@]}" -m gpu --continue-on-collection-errors \
        --junitxml="$OUT/pytest_gpu.xml" $tests_gpu
    local limit=100
    for m in $models; do
        [ "$m" = qwen3-4b ] && limit=150
        step "hardware_$m" "$limit" "$PY" -m mage_rl.cli bench hardware --model "$m" "${bench[@]}" \
            --json "$OUT/hardware_$m.json"
    done
    # shellcheck disable=SC2086
    step pytest_cpu 120 "$PY" -m pytest "${pytest_args[@]}" -m "not slow and not vllm" \
        --junitxml="$OUT/pytest_cpu.xml" $tests_cpu
    if [ "$mode" = device ] && ls "$WHEELS"/deepspeed-*.whl >/dev/null 2>&1; then
        # OpenRLHF's actor, one DeepSpeed ZeRO-2/3 step on MAGE experiences, with the
        # image's torch (on its CPU: the test drives DeepSpeed over gloo).
        step zero_cpu_probe 90 env CUDA_VISIBLE_DEVICES= "$PY" -m pytest "${pytest_args[@]}" \
            --junitxml="$OUT/pytest_zero.xml" tests/cluster/test_openrlhf_deepspeed.py
    fi
    "$PY" scripts/gpu_check.py summary "$OUT" "$WHEELS" "$mode"
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    device) device device ;;
    --dry-run | dry-run) device dry-run ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
esac
