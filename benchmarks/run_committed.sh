#!/usr/bin/env bash
# Run benchmark scripts on a committed tree while the working tree is being edited.
#
# `flwr run .` packages the app folder as it is, so a benchmark started in a working tree that others edit
# runs whatever half-made change is there when each run starts.  This exports the app code of a commit
# (default HEAD) to a folder of its own, lays the working tree's benchmarks package (its modules and
# benchmarks/reporting/: the benchmark plumbing, not the app) over it, stamps the commit into `.pflower-commit`
# (each raw record names it), and runs each argument as one benchmark command there (`python -m
# benchmarks.<script> <args>`), one after another, raw records going to this checkout's benchmarks/raw/.  Run
# folders stay in the export's benchmarks/out/runs.
#
#   benchmarks/run_committed.sh [--commit REV] "baselines --grid clean" "fedcac" ...
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rev=HEAD
if [[ "${1:-}" == "--commit" ]]; then rev=$2; shift 2; fi
commit=$(git -C "$repo" rev-parse "$rev")
tree=${PFLOWER_BENCH_TREE:-/tmp/pflower-bench-${commit:0:12}}
if [[ ! -f "$tree/.pflower-commit" ]]; then
  mkdir -p "$tree"
  git -C "$repo" archive "$commit" | tar -x -C "$tree"
  echo "$commit" > "$tree/.pflower-commit"
fi
# the benchmarks package, replaced as a whole (the scripts print their tables with benchmarks/reporting/)
rm -rf "$tree/benchmarks/reporting" "$tree"/benchmarks/*.py
mkdir -p "$tree/benchmarks/reporting"
cp "$repo"/benchmarks/*.py "$tree/benchmarks/"
cp "$repo"/benchmarks/reporting/*.py "$tree/benchmarks/reporting/"
cd "$tree"
for cmd in "$@"; do
  echo "=== $(date '+%F %T') python -m benchmarks.$cmd (code $commit)"
  # shellcheck disable=SC2086
  python -m benchmarks.$cmd --raw-dir "$repo/benchmarks/raw"
done
echo "=== $(date '+%F %T') done"
