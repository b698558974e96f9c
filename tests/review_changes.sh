#!/usr/bin/env bash
# issue 24's four review changes (tests must catch them): apply each to a scratch worktree of HEAD,
# run the fast tests named, print the change and the tests that fail.  Usage: tests/review_changes.sh [out-file]
set -u
WT=$(mktemp -d /tmp/review_changes.XXXXXX); rmdir "$WT"  # a scratch worktree of HEAD (plus the working tree's tests)
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/dev/stdout}
: > "$OUT"
run_case() {  # name file python-old python-new tests...
  local name=$1 file=$2 old=$3 new=$4; shift 4
  rm -rf "$WT" && git -C "$SRC" worktree remove --force "$WT" 2>/dev/null; git -C "$SRC" worktree add -q --detach "$WT" HEAD
  cp "$SRC"/tests/*.py "$WT"/tests/ 2>/dev/null
  (cd "$WT" && python3 - "$file" "$old" "$new") <<'PY'
import sys
p, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
s = open(p).read(); assert s.count(old) == 1, (p, old, s.count(old)); open(p, "w").write(s.replace(old, new))
PY
  (cd "$WT" && git diff --stat | tail -1; git diff | grep '^[-+] ' ) >> "$OUT"
  (cd "$WT" && PYTHONPATH="$WT"/src HF_HUB_OFFLINE=1 timeout 900 "$SRC"/.venv/bin/python -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "^FAILED|passed|failed" | head -12) >> "$OUT"
  echo "== $name done" >> "$OUT"
}
run_case "AdaFedSelecKD lambda -> 1-lambda" src/fedrepro/papers/adafedseleckd/methods.py \
  "selective_kd_loss(student, teacher, labels, hp.lam, tau" "selective_kd_loss(student, teacher, labels, 1 - hp.lam, tau" \
  tests/test_step_adafedseleckd.py
run_case "FedSum L_pm detached" src/fedrepro/papers/fedsum/algorithm.py \
  "loss = loss + pm" "loss = loss + pm.detach()" tests/test_step_fedsum.py
run_case "FedSum j/tau dropped" src/fedrepro/papers/fedsum/algorithm.py \
  "return (t / total_rounds) * (e / epochs) * (j / tau)" "return (t / total_rounds) * (e / epochs)" \
  tests/test_step_fedsum.py tests/test_fedsum_exact.py
run_case "FedSUMM data_loss.backward" src/fedrepro/papers/fedsumm/algorithm.py \
  "                total.backward()" "                data_loss.backward()" tests/test_step_fedsumm.py
git -C "$SRC" worktree remove --force "$WT"
git -C "$SRC" worktree prune
