#!/usr/bin/env bash
# README's canonical flow in a fresh clone of this repository, each command's output and wall time kept:
#   dvc repro; dvc exp run -S KEY=VALUE; debias compare; git checkout params.yaml && dvc repro;
#   debias sweep --name NAME -S 'KEY=V1,V2' --seeds 0 1 2 --upstream infer_groups --jobs 2; debias compare --sweep NAME
#
#   bash benchmarks/canonical_flow.sh SCRATCH 'loss.epsilon=0.25' 'loss.epsilon=0,0.25' eps > OUT.log
#
# SCRATCH: an empty folder (the clone goes there). The stages run the clone's own src/ (PYTHONPATH); tracking to the
# clone's own MLflow store; DEBIAS_THREADS as the caller sets it (unset: one thread per stage process).
set -euo pipefail
scratch=$1 experiment=$2 grid=$3 name=$4
repo=$(cd "$(dirname "$0")/.." && pwd)
clone="$scratch/clone"
git clone -q "$repo" "$clone"
cd "$clone"
export PYTHONPATH="$clone/src" MLFLOW_DISABLE_TELEMETRY=true
step() {  # one command: its line, its output, its wall seconds
    echo "### \$ $*"
    local start=$SECONDS
    "$@" 2>&1
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
step dvc metrics diff
step dvc exp show --no-pager --csv --drop '.*' --keep 'Experiment|rev|s2_worst$|s2_unbiased$|loss.epsilon'
