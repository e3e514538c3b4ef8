#!/usr/bin/env bash
# README's canonical flow in a fresh clone of this repository, each command's output (every line with its seconds
# since the command started), wall time and longest silence kept:
#   dvc repro; dvc exp run -S KEY=VALUE; debias compare; git checkout params.yaml && dvc repro;
#   debias sweep --name NAME -S 'KEY=V1,V2' --seeds 0 1 2 --upstream infer_groups --jobs 2; debias compare --sweep NAME;
#   and with SEEDS > 3: debias sweep --name NAME --resume --seeds 0-(SEEDS-1); debias compare --sweep NAME --margin 2
#
#   bash benchmarks/canonical_flow.sh SCRATCH 'loss.epsilon=0.25' 'loss.epsilon=0,0.25' eps [SEEDS] > OUT.log
#
# SCRATCH: an empty folder (the clone goes there). The stages run the clone's own src/ (PYTHONPATH); tracking to the
# clone's own MLflow store; DEBIAS_THREADS as the caller sets it (unset: one thread per stage process).
set -euo pipefail
scratch=$1 experiment=$2 grid=$3 name=$4 seeds=${5:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
clone="$scratch/clone"
git clone -q "$repo" "$clone"
cd "$clone"
export PYTHONPATH="$clone/src" MLFLOW_DISABLE_TELEMETRY=true
stamp() {  # each line with the seconds since the command started; then the longest gap between lines (or to the end)
    python3 -u -c '
import sys, time
start = last = time.monotonic()
longest = 0.0
for line in sys.stdin:
    now = time.monotonic()
    longest = max(longest, now - last)
    last = now
    print(f"{now - start:7.1f} {line}", end="", flush=True)
longest = max(longest, time.monotonic() - last)
print(f"### longest silence {longest:.1f} s")'
}
step() {  # one command: its line, its output, its wall seconds
    echo "### \$ $*"
    local start=$SECONDS
    "$@" 2>&1 | stamp
    echo "### wall $((SECONDS - start)) s"
}
echo "### commit $(git rev-parse --short=12 HEAD); $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs; DEBIAS_THREADS=${DEBIAS_THREADS:-unset}"
step dvc repro
step dvc exp run -S "$experiment"
step debias compare --no-mlflow
step git checkout params.yaml
step dvc repro  # the committed params' run back from DVC's run-cache (README)
step debias sweep --name "$name" -S "$grid" --seeds 0 1 2 --upstream infer_groups --jobs 2
step debias compare --no-mlflow --sweep "$name"
if [ "$seeds" -gt 3 ]; then
    step debias sweep --name "$name" --resume --seeds "0-$((seeds - 1))"
    step debias compare --no-mlflow --sweep "$name" --margin 2
fi
step dvc metrics diff
step dvc exp show --no-pager --csv --drop '.*' --keep 'Experiment|rev|s2_worst$|s2_unbiased$|loss.epsilon'
