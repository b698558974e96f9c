#!/usr/bin/env bash
# bench/gpu_check.sh -- the project's GPU check as one prepared script, for a short lease on an
# offline GPU machine (x86-64, CPython 3.12 with its own CUDA torch; no network):
#   1. the benchmarks at the paper models' true size, each under its own time limit:
#      kd_step (AdaFedSelecKD, bart-large at the paper's batch 16 and 1,024/256 tokens):
#      fp32 / tf32 / bf16-mixed / bf16-mixed + bf16 frozen backbone side by side, with model FLOPs
#      and MFU; round_overhead at 8 steps per client-round -- each alone on the GPU;
#   2. the paper-scale rehearsal on CUDA (../shared/gpu/rehearse.sh, copied to .gpu/ by
#      bundle.sh) for the time that is left, with kd_step on LED-large beside it (FedSUMM's round
#      at N = 10 is the rehearsal's FedSUMM rows: round and step times in its report).
# Before: `bash ../shared/gpu/bundle.sh` here (writes .gpu/whl.tar.xz and .gpu/rehearse.sh; let
# .gpu travel with the checkout).  Run from the project's root:
#     GPU_CHECK_BUDGET_S=540 OUT=./gpu_out bash bench/gpu_check.sh
# What comes back in $OUT (8 files at most): bench_quiet.tar.gz and bench_beside.tar.gz (the bench
# JSONs and logs, this script's log) and rehearsal/ (report.md, report.json, snakemake_tail.log,
# failed_logs.tar.gz, gpu_mon.csv, run.log).
# Env: GPU_CHECK_BUDGET_S (default 540: the script ends within about that; give the command 30 s
#      more), GPU_CHECK_SKIP_BENCH=1 (the quiet benchmarks), GPU_CHECK_SKIP_REHEARSAL=1,
#      GPU_CHECK_BESIDE=led|fedsumm|none (the benchmark beside the rehearsal), REHEARSE_* (passed on),
#      GPU_CHECK_FEDSUMM_PROFILE=N (FedSUMM's round at N clients, alone, with a profile; regimes
#      GPU_CHECK_FEDSUMM_REGIMES, default FedAvg,FedSUMM; GPU_CHECK_FEDSUMM_STORAGE=memory|disk: the
#      server state's storage, default the paper config's disk; the JSON records the page cache's
#      Dirty/Writeback per round).
set -u
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-540}
OUT=${OUT:-./gpu_out}
PY=${PY:-python3}
SITE=${REHEARSE_SITE:-/tmp/site}
mkdir -p "$OUT/bench" && OUT=$(cd "$OUT" && pwd -P)
B=$OUT/bench
LOG=$B/gpu_check.log
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }

say "host $(hostname) cpus $(nproc); budget ${BUDGET}s"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG"

# -- the wheel bundle -> $SITE (as rehearse.sh does; never torch/numpy/nvidia/triton/ray) ----------
if [ -f .gpu/whl.tar.xz ] && [ "${REHEARSE_SKIP_INSTALL:-0}" != 1 ]; then
  rm -rf "$SITE" /tmp/gpu_check_whl && mkdir -p /tmp/gpu_check_whl
  tar -xJf .gpu/whl.tar.xz -C /tmp/gpu_check_whl
  timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" /tmp/gpu_check_whl/whl/*.whl >>"$LOG" 2>&1 || say "WARNING: pip install failed"
  for p in "$SITE"/*; do
    case "$(basename "$p" | tr A-Z a-z)" in
      torch|torch-*|numpy|numpy-*|nvidia|nvidia_*|triton|triton-*|ray|ray-*) rm -rf "$p";;
    esac
  done
  rm -rf /tmp/gpu_check_whl
  say "installed $(ls -d "$SITE"/*.dist-info 2>/dev/null | wc -l) distributions into $SITE"
fi
# byte-code once for every process: the GPU machine does not write .pyc files (pip --no-compile,
# and its Python compiled ~10,000 sources, 6-9 s, in every cell process of the first runs)
timeout 120 "$PY" -m compileall -q -j 0 "$SITE" src >/dev/null 2>&1 || true
say "byte-compiled $SITE and src"
export PYTHONPATH="$SITE:$PWD/src" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '', 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"

bench() {  # bench NAME LIMIT_S CMD...: one benchmark under its own limit, never beyond the budget
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  [ "$limit" -gt $(( l - 60 )) ] && limit=$(( l - 60 ))
  if [ "$limit" -lt 20 ]; then say "SKIP $name: ${l}s left"; return; fi
  say "START $name (limit ${limit}s)"
  timeout "$limit" "$@" >"$B/$name.log" 2>&1
  say "END $name rc=$?"
}

# the measurements that need a quiet GPU first, alone; then the rehearsal, with the secondary
# benchmarks beside it (their step-time ratios are interleaved within one process, so sharing
# the GPU slows both variants alike; their absolute times and MFU are then lower bounds)
if [ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 ]; then
  bench kd_step_bart_large 110 "$PY" bench/kd_step.py --backbone bart-large --device cuda \
    --batch-size 16 --source-length 1024 --target-length 256 --batches 2 --steps 8 --warmup 2 \
    --precisions fp32,tf32,bf16-mixed,bf16-mixed+frozen-bf16 --no-cache --threads 4 \
    --out "$B/kd_step_bart_large_h100_precisions.json"
  bench round_overhead_8steps 90 "$PY" bench/round_overhead.py --engines inprocess --device cuda \
    --steps 8 --rounds 3 --batch-size 8 --source-len 1024 --target-len 256 --threads 8 \
    --work-dir /tmp/ro --out "$B/round_overhead_h100_8steps.json"
fi
if [ -n "${GPU_CHECK_FEDSUMM_PROFILE:-}" ]; then  # N: FedSUMM's round at N clients, alone, profiled
  bench fedsumm_round_profile 240 "$PY" bench/fedsumm_round_overhead.py --device cuda \
    --regimes "${GPU_CHECK_FEDSUMM_REGIMES:-FedAvg,FedSUMM}" --clients "$GPU_CHECK_FEDSUMM_PROFILE" \
    --rounds 2 --threads "${GPU_CHECK_REHEARSE_THREADS:-4}" --profile --work-dir /tmp/fso \
    ${GPU_CHECK_FEDSUMM_STORAGE:+--storage "$GPU_CHECK_FEDSUMM_STORAGE"} \
    --out "$B/fedsumm_round_overhead_h100_n${GPU_CHECK_FEDSUMM_PROFILE}${GPU_CHECK_FEDSUMM_STORAGE:+_$GPU_CHECK_FEDSUMM_STORAGE}.json"
fi
say "quiet benchmarks done; $(left)s left"
tar -czf "$OUT/bench_quiet.tar.gz" -C "$OUT" bench && rm -rf "$B" && mkdir -p "$B"

# rehearse.sh runs 4 cells at a time (--resources gpu=4, 4 threads a cell); with
# GPU_CHECK_REHEARSE_THREADS=T and GPU_CHECK_REHEARSE_GPU_MEM_MB=M a patched copy runs 16/T cells
# at a time, packed onto the GPU by their declared memory (rehearsal_settings.gpu_mem_mb = M,
# --resources gpu_mem_mb = the GPU's memory; docs/cluster.md "GPU slots").  Either way the copy
# trains FedSum on every setting (config/rehearsal.yaml's fedsum_settings: first is this CPU's).
REHEARSE=/tmp/rehearse_patched.sh
RSET="fedsum_settings: every"
SUBST=()
if [ -n "${GPU_CHECK_REHEARSE_THREADS:-}" ] && [ -n "${GPU_CHECK_REHEARSE_GPU_MEM_MB:-}" ]; then
  TOTAL_MB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  TOTAL_MB=${TOTAL_MB:-80000}
  RSET="$RSET, gpu_mem_mb: $GPU_CHECK_REHEARSE_GPU_MEM_MB"
  SUBST=(-e "s/threads_per_cell: 4/threads_per_cell: $GPU_CHECK_REHEARSE_THREADS/g"
         -e "s/--resources gpu=4/--resources gpu_mem_mb=$TOTAL_MB/"
         -e "s/4 threads a cell, --cores 16/$GPU_CHECK_REHEARSE_THREADS threads a cell, --cores 16/"
         -e "s/(4 GPU jobs at a time)/(cells packed on the GPU by their declared $GPU_CHECK_REHEARSE_GPU_MEM_MB MB)/")
  say "rehearsal packed: $GPU_CHECK_REHEARSE_THREADS threads a cell, ${GPU_CHECK_REHEARSE_GPU_MEM_MB} MB declared of ${TOTAL_MB} MB"
fi
sed "${SUBST[@]}" -e "s/^fedsumm: {threads_per_cell: \(.*\)\$/&\nrehearsal_settings: {$RSET}/" \
  .gpu/rehearse.sh > "$REHEARSE"
grep -q "^rehearsal_settings: {$RSET}" "$REHEARSE" || say "WARNING: the rehearsal overlay patch did not apply ($RSET)"
REH_PID=
if [ "${GPU_CHECK_SKIP_REHEARSAL:-0}" != 1 ] && [ "$(left)" -gt 120 ]; then
  REHEARSE_SKIP_INSTALL=1 REHEARSE_SITE="$SITE" REHEARSE_BUDGET_S=$(( $(left) - 15 )) \
    OUT="$OUT/rehearsal" bash "$REHEARSE" >"$B/rehearse_stdout.log" 2>&1 &
  REH_PID=$!
  say "rehearsal started (pid $REH_PID)"
fi
case "${GPU_CHECK_BESIDE:-led}" in
  led)
    sleep 5
    bench kd_step_led_large_beside_rehearsal 120 "$PY" bench/kd_step.py --backbone led-large \
      --device cuda --batch-size 16 --source-length 1024 --target-length 256 --batches 2 --steps 5 \
      --warmup 2 --precisions fp32,bf16-mixed --no-cache --threads 2 \
      --out "$B/kd_step_led_large_h100_precisions_beside_rehearsal.json";;
  fedsumm)  # FedSUMM's round at N = 10 with a profile (where the time beyond the steps goes)
    sleep 5
    bench fedsumm_round_beside_rehearsal 170 "$PY" bench/fedsumm_round_overhead.py --device cuda \
      --regimes FedAvg --clients 10 --rounds 1 --threads 4 --profile \
      --out "$B/fedsumm_round_overhead_h100_beside_rehearsal.json";;
  none) ;;
esac
if [ -n "$REH_PID" ]; then
  wait "$REH_PID"; say "rehearse.sh rc=$?"
fi
say "done; $(left)s left"
tar -czf "$OUT/bench_beside.tar.gz" -C "$OUT" bench && rm -rf "$B"
echo "[gpu_check] done after $(( $(date +%s) - T0 ))s"
