#!/usr/bin/env bash
# README's canonical flow (benchmarks/canonical_flow.sh) at two commits of this repository, timed in turn on one
# machine: A, B, B, A (a drift of the machine's speed over the hour weighs on both alike). Each run is a fresh clone of
# its commit with its own fork-server socket folder (XDG_RUNTIME_DIR, its servers stopped after it), bytecode written
# as on a user's machine; the commands' wall times are in each log's "### wall" lines.
#
#   bash benchmarks/canonical_flow_trees.sh SCRATCH REV_A REV_B [SEEDS]
#
# SCRATCH: an empty folder; the logs go to SCRATCH/<n>-<rev>.log (n = 1..4), each run's clone under SCRATCH/run-<n>.
set -euo pipefail
scratch=$1 a=$2 b=$3 seeds=${4:-20}
repo=$(cd "$(dirname "$0")/.." && pwd)
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true
unset PYTHONDONTWRITEBYTECODE DEBIAS_FORKSERVER
n=0
for rev in "$a" "$b" "$b" "$a"; do
    n=$((n + 1))
    source_tree="$scratch/tree-$rev"  # the commit's files, whose canonical_flow.sh clones them
    [ -d "$source_tree" ] || { git clone -q "$repo" "$source_tree" && git -C "$source_tree" checkout -q "$rev"; }
    runtime=$(mktemp -d /tmp/rtXXXXXX)  # short: a socket path holds < 108 bytes
    mkdir -p "$scratch/run-$n"
    echo "### run $n: $rev, $(date -u '+%H:%M:%S UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
    XDG_RUNTIME_DIR=$runtime bash "$source_tree/benchmarks/canonical_flow.sh" "$scratch/run-$n" \
        'loss.epsilon=0.25' 'loss.epsilon=0,0.25' eps "$seeds" > "$scratch/$n-$rev.log" 2>&1
    pkill -f "$runtime" || true
    echo "### run $n: done $(date -u '+%H:%M:%S UTC'), total $(awk '/^### wall/ {s += $3} END {print s}' "$scratch/$n-$rev.log") s"
done
