#!/usr/bin/env bash
# The course's GPU paths in one go, for a learner with an NVIDIA GPU (a Colab, a gaming card, a
# rented H100). Run it from the repository root once `uv sync` has run and data/ is prepared:
#
#   bash scripts/gpu_check.sh            # about 10 minutes on one data-centre GPU
#   bash scripts/gpu_check.sh --quick    # shorter budgets: about 4 minutes
#   bash scripts/gpu_check.sh --dry-run  # print the commands, run nothing
#
# Each row runs one command with a time limit, keeps its whole output in the run folder
# (runs/gpu-check.XXXX, made fresh: nothing of yours is written over) and shows its last
# figure in a table at the end. PYTHON="python3" runs the commands without uv.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0 dry=0
for arg in "$@"; do
    case $arg in
        --quick) quick=1 ;;
        --dry-run) dry=1 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option $arg (use --quick, --dry-run or --help)" >&2; exit 2 ;;
    esac
done
read -r -a PY <<< "${PYTHON:-uv run python}"

if (( quick )); then main_s=20s gpu_s=45s req_s=15s f16_steps=30
else main_s=60s gpu_s=120s req_s=30s f16_steps=80
fi

if (( dry )); then
    runs=runs/gpu-check.DRY gpus=1
else
    gpus=$("${PY[@]}" -c "import torch; print(torch.cuda.device_count())") || exit 1
    if (( gpus == 0 )); then
        echo "gpu_check: PyTorch sees no CUDA GPU here; \`uv run python -m tiny_llm.device\`" \
             "says why (docs/troubleshooting.md has the fixes)" >&2
        exit 1
    fi
    mkdir -p runs && runs=$(mktemp -d runs/gpu-check.XXXX)
fi

names=() results=() seconds=() figures=()

# check NAME PATTERN EXPECT LIMIT_S -- COMMAND...: run COMMAND, record a row. The row's figure is
# the last output line matching PATTERN (grep -E). EXPECT "ok": exit status 0 passes; any other
# EXPECT is a text the output must hold with a non-zero exit (a refusal that is the right answer).
check() {
    local name=$1 pattern=$2 expect=$3 limit=$4; shift 5
    local log="$runs/$(( ${#names[@]} + 1 ))-${name//[^a-z0-9]/-}.log"
    if (( dry )); then
        printf '%-22s %s\n' "$name" "$*"
        return
    fi
    echo "=== $name: $*"
    local start=$SECONDS rc
    timeout "$limit" "$@" > "$log" 2>&1
    rc=$?
    local figure
    figure=$(grep -E "$pattern" "$log" | tail -n 1 | tr -s ' ' | cut -c1-70)
    local result=pass
    if [[ $expect == ok ]]; then
        (( rc == 0 )) || result="FAIL ($( ((rc == 124)) && echo "over ${limit}s" || echo "exit $rc"))"
    elif (( rc == 0 )) || ! grep -qF "$expect" "$log"; then
        result="FAIL (no refusal)"
    fi
    [[ $result == pass ]] || tail -n 5 "$log"
    names+=("$name") results+=("$result") seconds+=($(( SECONDS - start ))) figures+=("$figure")
}

for step in device embed attention multihead block gpt generate kvcache speed instruct; do
    check "check $step" "device|speed-up|same|equal|MFU|tokens/s|inclusion" ok 300 -- \
        "${PY[@]}" -m "tiny_llm.$step"
done
check "main job" "tokens/s|val" ok 600 -- \
    "${PY[@]}" -m tiny_llm.train --time-budget "$main_s" --out "$runs/main"
check "gpu preset" "tokens/s|val" ok 900 -- \
    "${PY[@]}" -m tiny_llm.train --preset gpu --time-budget "$gpu_s" --out "$runs/gpu"
check "generate" "." ok 120 -- \
    "${PY[@]}" -m tiny_llm.generate --checkpoint "$runs/gpu/ckpt.pt" --seed 1
check "evaluate" "bits per byte|perplexity" ok 300 -- \
    "${PY[@]}" -m tiny_llm.evaluate --checkpoint "$runs/gpu/ckpt.pt" --max-batches 20
check "export parity" "^logits" ok 300 -- \
    "${PY[@]}" -m tiny_llm.export --checkpoint "$runs/gpu/ckpt.pt" --out "$runs/hf"
check "kv cache, gpu preset" "speed-up" ok 300 -- \
    "${PY[@]}" -m tiny_llm.kvcache --checkpoint "$runs/gpu/ckpt.pt" --max-new-tokens 400
check "decode: static+graph" "^static" ok 300 -- \
    "${PY[@]}" -m tiny_llm.speed --decode --preset gpu
check "requests" "tokens/s|val" ok 600 -- \
    "${PY[@]}" -m tiny_llm.instruct train --init-from "$runs/main/ckpt.pt" --requests derived \
    --time-budget "$req_s" --out "$runs/requests"
check "float16 + scaler" "tokens/s|val" ok 300 -- \
    "${PY[@]}" -m tiny_llm.train --preset small --dtype float16 --max-steps "$f16_steps" \
    --out "$runs/float16"
check "torchrun, 1 rank" "tokens/s|ranks" ok 300 -- \
    "${PY[@]}" -m torch.distributed.run --standalone --nproc-per-node 1 -m tiny_llm.scale \
    --preset tiny --max-steps 30 --out "$runs/ddp1"
check "torchrun, $((gpus + 1)) ranks" "ranks on this machine" "ranks on this machine but" 120 -- \
    "${PY[@]}" -m torch.distributed.run --standalone --nproc-per-node "$((gpus + 1))" \
    -m tiny_llm.scale --preset tiny --max-steps 20 --out "$runs/too-many"

(( dry )) && exit 0
echo
echo "gpu_check: $gpus GPU(s), $("${PY[@]}" -c "import torch; print(torch.cuda.get_device_name())")," \
     "outputs in $runs/"
printf '%-22s %-18s %6s  %s\n' row result seconds "last figure"
failed=0
for i in "${!names[@]}"; do
    printf '%-22s %-18s %6s  %s\n' "${names[i]}" "${results[i]}" "${seconds[i]}" "${figures[i]}"
    [[ ${results[i]} == pass ]] || failed=$((failed + 1))
done
echo "$failed of ${#names[@]} rows failed"
(( failed == 0 ))
