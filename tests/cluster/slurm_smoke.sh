#!/usr/bin/env bash
# The smoke grid on a real (single-node, throwaway) SLURM cluster, compared with a local run.
#
#   sudo tests/cluster/slurm_smoke.sh        # root only: installs packages, starts daemons
#
# 1. installs Debian's slurmctld slurmd slurm-client munge (apt-get; skipped when present);
# 2. starts munged (own key from `mungekey`, own socket) and a one-node SLURM 22.05 cluster whose
#    config, state, spool, pid and log files all live in a fresh /tmp/fedrepro-slurm.XXXXXX
#    folder (/etc/slurm/slurm.conf is a symlink to it: the plugin's job-step wrapper drops
#    SLURM_CONF before its inner `srun`);
# 3. runs `snakemake --profile profiles/slurm-ci adafedseleckd_table3` with config/smoke.yaml
#    (every job an sbatch job) and, side by side, the same grid locally (`--cores N`, no profile)
#    into a second work folder;
# 4. checks that both runs produced byte-identical outputs (every file under results/: table,
#    per-cell scores, predictions, adapters, train logs, data; provenance.json up to its wall
#    time), that the SLURM run really went through sbatch, and that its download job (the
#    backbone) ran on the submitting host, not through sbatch (localrules, docs/cluster.md);
# 5. always (trap EXIT): cancels leftover jobs, stops slurmd, slurmctld and munged by the PIDs in
#    their pid files, removes the /etc/slurm/slurm.conf symlink; deletes the temp folder on
#    success (kept on failure, with the daemon logs printed).
#
# Environment:
#   FEDREPRO_VENV        venv with snakemake + snakemake-executor-plugin-slurm (default <repo>/.venv,
#                        built by `make`). Jobs run as the submitting user; a non-root user's jobs
#                        need a venv they can read, e.g. `make PYTHON=/usr/bin/python3` (the default
#                        pyenv python lives under /root, mode 0700).
#   SMOKE_TIMEOUT_S      limit for each snakemake run (default 600)
#   SMOKE_SERIAL=1       the local run after the SLURM run instead of beside it (clean per-run times)
#   KEEP_TMP=1           keep the temp folder even on success
# Exit status: 0 pass, 1 failure (also: no venv / no plugin), 2 cannot run here (not root, no
# slurm/munge and no working apt, a SLURM setup or its ports already there).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${FEDREPRO_VENV:-$ROOT/.venv}
SMOKE_TIMEOUT_S=${SMOKE_TIMEOUT_S:-600}
TARGET=adafedseleckd_table3
CONF_LINK=/etc/slurm/slurm.conf
T0=$(date +%s)

say() { printf '[slurm-smoke %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { printf '[slurm-smoke] FAILED: %s\n' "$*" >&2; exit 1; }
cannot() { printf '[slurm-smoke] CANNOT RUN: %s\n' "$*" >&2; exit 2; }
lap() { local now; now=$(date +%s); TIMES+=("$1: $((now - LAP))s"); LAP=$now; }
TIMES=()
LAP=$T0
stop_pidfile() {  # stop_pidfile COMM FILE [SIGNAL]: the process in FILE, if it is still COMM:
  local comm=$1 file=$2 sig=${3:-TERM} pid i  # SIGNAL, up to 30 s, then SIGKILL
  [[ -s $file ]] || return 0
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 0
  kill -"$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || { say "stopped $comm (pid $pid, SIG$sig)"; return 0; }; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  say "killed $comm (pid $pid): still running 30 s after SIG$sig"
}
stop_daemons() {  # stop_daemons DIR: slurmd, slurmctld, munged started from DIR's pid files
  stop_pidfile slurmd "$1/run/slurmd.pid"
  stop_pidfile slurmctld "$1/run/slurmctld.pid"
  stop_pidfile munged "$1/munge/munged.pid"
}

# ---------------------------------------------------------------------------- preconditions
[[ $(id -u) -eq 0 ]] || cannot "needs root (apt-get install, slurmctld/slurmd as root); run as root or skip"
[[ -x $VENV/bin/snakemake ]] || die "no snakemake in $VENV (run \`make\` first or set FEDREPRO_VENV)"
timeout -k 5 60 "$VENV/bin/python" -c "import snakemake_executor_plugin_slurm" 2>/dev/null \
  || die "snakemake-executor-plugin-slurm is not installed in $VENV (pinned in requirements.txt; run \`make\`)"
if [[ -L $CONF_LINK && $(readlink "$CONF_LINK") == /tmp/fedrepro-slurm.*/slurm.conf ]]; then
  # left by a run of this script that was killed before its EXIT trap: stop what it started
  stale=$(dirname "$(readlink "$CONF_LINK")")
  say "a previous run left $CONF_LINK -> $stale/slurm.conf; stopping its runs and daemons"
  export SLURM_CONF=$CONF_LINK
  stop_pidfile timeout "$stale/slurm.pid" INT
  stop_pidfile timeout "$stale/local.pid" INT
  stop_daemons "$stale"
  rm -f "$CONF_LINK"
  rm -rf "$stale"
  lap stale-cleanup
fi
if [[ -e $CONF_LINK || -L $CONF_LINK ]]; then
  cannot "$CONF_LINK exists: this machine already has a SLURM setup; the test only runs on a throwaway machine"
fi
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in 6817 6818; do
  port_busy "$port" && cannot "TCP port $port (slurmctld/slurmd) is already in use on 127.0.0.1"
done

# ---------------------------------------------------------------------------- install
need=()
for bin in slurmctld slurmd sbatch squeue scontrol sinfo munged mungekey; do
  command -v "$bin" >/dev/null || need+=("$bin")
done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || cannot "missing ${need[*]} and no apt-get"
  say "installing slurmctld slurmd slurm-client munge (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  install_pkgs() {
    timeout -k 10 300 apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge >"$APT_LOG" 2>&1
  }
  APT_LOG=$(mktemp /tmp/fedrepro-slurm-apt.XXXXXX.log)
  if ! install_pkgs; then
    timeout -k 10 300 apt-get update -qq >>"$APT_LOG" 2>&1 || { tail -20 "$APT_LOG" >&2; cannot "apt-get update failed (no package mirror reachable?); log: $APT_LOG"; }
    install_pkgs || { tail -20 "$APT_LOG" >&2; cannot "apt-get install slurmctld slurmd slurm-client munge failed; log: $APT_LOG"; }
  fi
  rm -f "$APT_LOG"
else
  say "slurm and munge already installed"
fi
say "$(slurmctld -V), $(munged -V 2>&1 | head -1)"
lap install

# ---------------------------------------------------------------------------- teardown (always)
TMP=$(mktemp -d /tmp/fedrepro-slurm.XXXXXX)
chmod 755 "$TMP"   # munged refuses a socket folder others cannot traverse
OK=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  # timeout passes SIGINT on to snakemake, which then cancels its jobs (scancel / kill); on SIGTERM
  # it would wait for them to finish
  stop_pidfile timeout "$TMP/slurm.pid" INT
  stop_pidfile timeout "$TMP/local.pid" INT
  if [[ -s $TMP/run/slurmctld.pid ]]; then
    # jobs left by an interrupted snakemake: cancel them and let their steps exit before slurmd goes
    local jobs
    jobs=$(timeout -k 2 10 squeue -h -o %i 2>/dev/null)
    if [[ -n $jobs ]]; then
      say "cancelling leftover jobs: $(echo $jobs)"
      timeout -k 2 10 scancel $jobs
      for _ in $(seq 30); do [[ -z $(timeout -k 2 5 squeue -h -o %i 2>/dev/null) ]] && break; sleep 1; done
    fi
  fi
  stop_daemons "$TMP"
  [[ $(readlink "$CONF_LINK" 2>/dev/null) == "$TMP/slurm.conf" ]] && rm -f "$CONF_LINK"
  if [[ $OK == 1 && ${KEEP_TMP:-0} != 1 ]]; then
    rm -rf "$TMP"
  else
    for f in "$TMP"/log/slurmctld.log "$TMP"/log/slurmd.log "$TMP"/munge/munged.log; do
      [[ -s $f && $OK != 1 ]] && { echo "---- tail $f" >&2; tail -15 "$f" >&2; }
    done
    say "kept $TMP (config, daemon logs, both work dirs)"
  fi
  say "total wall time $(($(date +%s) - T0))s"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------- munge
mkdir -p "$TMP/munge" "$TMP/state" "$TMP/spool" "$TMP/log" "$TMP/run"
chmod 755 "$TMP/munge"
SOCK=$TMP/munge/munge.socket
timeout -k 5 30 mungekey --create --keyfile="$TMP/munge/munge.key" --bits=1024
timeout -k 5 30 munged --key-file="$TMP/munge/munge.key" --socket="$SOCK" \
  --pid-file="$TMP/munge/munged.pid" --log-file="$TMP/munge/munged.log" \
  --seed-file="$TMP/munge/munged.seed" || die "munged did not start (log: $TMP/munge/munged.log)"
timeout -k 5 20 bash -c "until [[ -S '$SOCK' ]]; do sleep 0.1; done" || die "munged socket $SOCK did not appear"
timeout -k 5 20 bash -c "munge -n -S '$SOCK' | unmunge -S '$SOCK' >/dev/null" || die "munge round trip failed on $SOCK"

# ---------------------------------------------------------------------------- slurm
NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
cat >"$TMP/slurm.conf" <<EOF
# fedrepro CI test cluster (tests/cluster/slurm_smoke.sh); everything under $TMP
ClusterName=fedrepro-ci
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$TMP/state
SlurmdSpoolDir=$TMP/spool
SlurmctldPidFile=$TMP/run/slurmctld.pid
SlurmdPidFile=$TMP/run/slurmd.pid
SlurmctldLogFile=$TMP/log/slurmctld.log
SlurmdLogFile=$TMP/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
# finished jobs stay visible to \`squeue --states=all\` this long: the status source of the
# slurm-ci profile (no slurmdbd, so no sacct)
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=ci Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
mkdir -p /etc/slurm
ln -sfn "$TMP/slurm.conf" "$CONF_LINK"
export SLURM_CONF=$CONF_LINK
timeout -k 5 30 slurmctld -i || die "slurmctld did not start (log: $TMP/log/slurmctld.log)"
timeout -k 5 30 slurmd || die "slurmd did not start (log: $TMP/log/slurmd.log)"
timeout -k 5 60 bash -c "until [[ \$(sinfo -h -n '$NODE' -o %t 2>/dev/null) == idle ]]; do sleep 0.5; done" \
  || die "node $NODE not idle after 60 s: $(sinfo -N -l 2>&1 | tail -n +2)"
say "cluster up: node $NODE, $CPUS CPUs, RealMemory=$MEM_MB MB, partition ci, config $CONF_LINK -> $TMP/slurm.conf"
lap start

# ---------------------------------------------------------------------------- the two runs
# config/config.yaml must be passed explicitly: the Snakefile's `configfile:` is relative to the
# working directory, which --directory moves. Sample folders are made absolute for the same reason.
timeout -k 5 60 "$VENV/bin/python" - "$ROOT" "$TMP/paths.yaml" <<'EOF'
import sys
from pathlib import Path

import yaml

root, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = yaml.safe_load((root / "config" / "config.yaml").read_text())
paths = {n: {"samples_dir": str(root / (d.get("samples_dir") or f"resources/samples/{n}"))}
         for n, d in cfg["data"].items()}
out.write_text(yaml.safe_dump({"data": paths}))
EOF
CONFIGS=("$ROOT/config/config.yaml" "$ROOT/config/smoke.yaml" "$TMP/paths.yaml")
export HF_HUB_OFFLINE=1
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"   # jobs import this checkout's fedrepro
export PATH="$VENV/bin:$PATH"
cd "$TMP"

# Both runs start together by default: the SLURM run leaves the CPUs idle between its status polls,
# so side by side they take about as long as the SLURM run alone (SMOKE_SERIAL=1: one after the
# other, for clean per-run times). Each run: `timeout` in the background, its PID in NAME.pid
# (stopped by the EXIT trap if still running), "exit-status seconds" in NAME.status.
start_run() {  # start_run NAME SNAKEMAKE-ARGS...
  local name=$1
  shift
  mkdir -p "$TMP/$name"
  say "$name run: snakemake $TARGET $* (log $TMP/$name.log)"
  (
    s=$(date +%s) rc=0
    timeout -s INT -k 60 "$SMOKE_TIMEOUT_S" snakemake --snakefile "$ROOT/Snakefile" --directory "$TMP/$name" \
      "$TARGET" "$@" --configfile "${CONFIGS[@]}" >"$TMP/$name.log" 2>&1 &
    echo $! >"$TMP/$name.pid"
    wait $! || rc=$?
    rm -f "$TMP/$name.pid"
    echo "$rc $(($(date +%s) - s))" >"$TMP/$name.status"
  ) &
  RUNNER[$name]=$!
}
finish_run() {  # finish_run NAME: wait for it, fail with its log's tail unless it succeeded
  local name=$1 rc secs
  while [[ ! -s $TMP/$name.status ]] && kill -0 "${RUNNER[$name]}" 2>/dev/null; do sleep 1; done
  [[ -s $TMP/$name.status ]] || die "$name run ended without a status (log: $TMP/$name.log)"
  read -r rc secs <"$TMP/$name.status"
  TIMES+=("$name-run: ${secs}s")
  if ((rc != 0)); then
    tail -40 "$TMP/$name.log" >&2
    ((rc == 124)) && die "$name run timed out after ${SMOKE_TIMEOUT_S}s (log: $TMP/$name.log)"
    die "$name run failed with exit status $rc (log: $TMP/$name.log)"
  fi
  say "$name run done in ${secs}s"
}
declare -A RUNNER=()
start_run slurm --profile "$ROOT/profiles/slurm-ci"
[[ ${SMOKE_SERIAL:-0} == 1 ]] && finish_run slurm
start_run local --cores "$CPUS"
[[ ${SMOKE_SERIAL:-0} == 1 ]] || finish_run slurm
finish_run local
wait "${RUNNER[@]}"
lap runs

# ---------------------------------------------------------------------------- checks
n_sub=$(grep -c "has been submitted with SLURM jobid" "$TMP/slurm.log" || true)
n_jobs=$(awk '/^total[[:space:]]+[0-9]+$/ {print $2; exit}' "$TMP/local.log")
# Jobs the submitting Snakemake runs itself ("localrule NAME:" in its log): the target rule (no
# output, no action) and the download rules -- here `backbone`, the hub-checkpoint rule (the smoke
# grid's data are samples: no download_* job). Compute nodes of many clusters have no internet, so
# rules/common.smk makes them localrules (config key cluster_local_downloads).
mapfile -t local_rules < <(sed -n 's/^localrule \([A-Za-z0-9_]*\):.*/\1/p' "$TMP/slurm.log" | sort -u)
n_local=$(grep -c "^localrule " "$TMP/slurm.log" || true)
[[ " ${local_rules[*]} " == *" backbone "* ]] \
  || die "the backbone (download) job did not run on the submitting host; local rules: ${local_rules[*]:-none}"
[[ " ${local_rules[*]} " == *" $TARGET "* && ${#local_rules[@]} -eq 2 ]] \
  || die "expected local rules backbone and $TARGET only, saw: ${local_rules[*]:-none}"
if grep "has been submitted with SLURM jobid" "$TMP/slurm.log" | grep -q "/rule_backbone/"; then
  die "the backbone (download) job was submitted with sbatch"
fi
((n_sub >= 1 && n_sub == n_jobs - n_local)) \
  || die "expected $((n_jobs - n_local)) sbatch submissions (local run: $n_jobs jobs incl. the target; $n_local local in the SLURM run), saw $n_sub"
[[ -z $(timeout -k 2 10 squeue -h -o %i) ]] || die "jobs still queued after the run: $(squeue)"
bad=$(grep -c "Falling back to 'sacct'" "$TMP/slurm.log" || true)
((bad == 0)) || die "the plugin fell back to sacct (MinJobAge too low?)"

cd "$TMP/local"
# every output file byte for byte, except provenance.json, which records the cell's wall time:
# those must agree on everything else
mapfile -t files < <(find results -type f ! -name provenance.json | sort)
mapfile -t provs < <(find results -type f -name provenance.json | sort)
cells=$(find results/adafedseleckd -name scores.json | wc -l)
((cells >= 1)) || die "local run wrote no scores.json"
[[ -f results/tables/$TARGET.csv ]] || die "local run wrote no results/tables/$TARGET.csv"
diffs=()
for f in "${files[@]}"; do
  [[ -f $TMP/slurm/$f ]] || { diffs+=("$f (missing from the SLURM run)"); continue; }
  cmp -s "$f" "$TMP/slurm/$f" || diffs+=("$f")
done
extra=$(cd "$TMP/slurm" && find results -type f | sort | comm -13 <(cd "$TMP/local" && find results -type f | sort) -)
[[ -z $extra ]] || diffs+=("only in the SLURM run: $(echo $extra)")
((${#diffs[@]} == 0)) || die "SLURM and local outputs differ: ${diffs[*]}"
timeout -k 5 60 "$VENV/bin/python" - "$TMP/local" "$TMP/slurm" "${provs[@]}" <<'PY' || die "provenance.json differs beyond wall_time_s and timing"
import json
import sys
from pathlib import Path

local, slurm, files = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
bad = []
for f in files:
    a, b = (json.loads((d / f).read_text()) for d in (local, slurm))
    for key in ("wall_time_s", "timing"):  # measured times and memory (fedrepro.fl.cell.run_cell)
        a.pop(key, None)
        b.pop(key, None)
    if a != b:
        bad.append(f + ": " + ", ".join(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)))
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
lap compare
say "PASS: $n_sub jobs ran through sbatch, ${local_rules[*]} on the submitting host; all ${#files[@]} output files byte-identical to the local run (incl. results/tables/$TARGET.{csv,md,tex} and $cells cells' scores.json); ${#provs[@]} provenance.json equal but for wall_time_s and timing"
say "times: ${TIMES[*]}"
OK=1
