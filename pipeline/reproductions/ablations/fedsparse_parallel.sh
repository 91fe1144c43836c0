#!/usr/bin/env bash
# Train the arms of FedSparse ablation builds side by side (issue 29 §3), for a shared CPU where
# `dvc repro`, which runs a build's train stages one after the other, would not finish in time.
#
#   bash pipeline/reproductions/ablations/fedsparse_parallel.sh JOBS BUILD...   (from the project root)
#   bash pipeline/reproductions/ablations/fedsparse_parallel.sh commit BUILD... (the last step only)
#
# Each BUILD (build/<name>, made by run_fedsparse.sh: `make reproduce` copies the code and the
# profile into it) gets its partition stage, then every (run, seed) of its params.yaml is trained
# by the train stage's own command (`python stages/train.py --run R --seed S`, in the build, with
# the build's code), JOBS at a time over all builds, the longest (most rounds, FedSparse before
# FedAvg) first; an interrupted one resumes from its checkpoint when rerun. Then `dvc commit`
# records the finished stages in the build's dvc.lock, so that rerunning
#   KEEP_CODE=1 bash pipeline/reproductions/ablations/run_fedsparse.sh X SEED
# finds them done and runs only evaluate and summarize (and copies and commits the curves).
# The numbers are those of `dvc repro`: the same commands on the same inputs, one process each.
set -euo pipefail

jobs=${1:?usage: fedsparse_parallel.sh JOBS|commit BUILD...}
shift
[[ $jobs =~ ^([1-9][0-9]*|commit)$ ]] || { echo "error: JOBS: '$jobs' (allowed: a positive integer, or commit)" >&2; exit 2; }
root=$PWD
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} FEDCOMM_PROJECT_ROOT=$root PATH=$root/.venv/bin:$PATH

stage() {  # $1: build, rest: the stage's command
  local build=$1
  shift
  (cd "$build" && PYTHONPATH=$root/$build/src nice -n 5 python "$@")
}
export -f stage
export root

queue=()
[[ $jobs == commit ]] || for build in "$@"; do
  [[ -f $build/params.yaml && -f $build/dvc.yaml ]] || { echo "error: $build: not a build" >&2; exit 2; }
  grep -q '^  partition:' "$build/dvc.lock" 2>/dev/null || stage "$build" stages/partition.py
  while read -r cost run seed; do
    queue+=("$cost $build $run $seed")
  done < <(python - "$build/params.yaml" <<'PY'
import sys

import yaml

p = yaml.safe_load(open(sys.argv[1]))
rounds = p["train"]["rounds"]
for run in p["experiment"]["runs"]:
    heavy = 3 if p["algorithms"][run]["name"] == "fedsparse" else 1  # CPU per round, roughly
    for seed in p["experiment"]["seeds"]:
        print(rounds * heavy, run, seed)
PY
  )
done
[[ $jobs == commit ]] || printf '%s\n' "${queue[@]}" | sort -k1,1nr | cut -d' ' -f2- |
  xargs -P "$jobs" -L 1 bash -c 'stage "$0" stages/train.py --run "$1" --seed "$2" > "$0/.train_$1-s$2.log" 2>&1 && echo "done $0 $1 s$2 ($(date -u +%H:%M:%S))" || echo "FAILED $0 $1 s$2: see $0/.train_$1-s$2.log"'
for build in "$@"; do  # record what finished in the build's dvc.lock
  (
    cd "$build"
    export PYTHONPATH=$root/$build/src
    dvc commit -f -q partition
    python -c "
import yaml; p = yaml.safe_load(open('params.yaml'))
print('\\n'.join(f'{r} {s}' for r in p['experiment']['runs'] for s in p['experiment']['seeds']))" |
      while read -r run seed; do
        if [[ -f runs/$run-s$seed/train/run.json ]]; then dvc commit -f -q "train@$run-$seed"; fi
      done
  ) || echo "warning: $build: dvc commit failed" >&2
done
