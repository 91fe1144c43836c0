#!/usr/bin/env bash
# FedSparse ablations of issue 29 §3 (docs/reproductions/audit/fedsparse.md): one build per seed,
# every arm of the comparison in it.
#
#   bash pipeline/reproductions/ablations/run_fedsparse.sh X SEED...  (from the project root)
#
# pipeline/per_seed.sh on pipeline/reproductions/ablations/fedsparse_X.yaml, builds
# abl_fedsparse_X_sSEED (the partition seed follows the seed; rerun to resume,
# KEEP_CODE=1 when the code changed since), one torch thread per build and nice 5 unless
# OMP_NUM_THREADS / NICE say otherwise; ROUNDS=n is a cost probe. Each finished
# seed's curves and params are committed under docs/reproductions/data/.
set -euo pipefail
x=${1:?usage: run_fedsparse.sh X SEED...}
shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} NICE=${NICE:-5}
exec bash pipeline/per_seed.sh "pipeline/reproductions/ablations/fedsparse_$x.yaml" "abl_fedsparse_$x" "$@"
