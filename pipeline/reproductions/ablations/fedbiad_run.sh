#!/usr/bin/env bash
# FedBIAD ablations of issue 29 §3 (docs/reproductions/audit/fedbiad.md): one build per seed,
# every arm of the comparison in it.
#
#   bash pipeline/reproductions/ablations/fedbiad_run.sh X SEED...  (from the project root)
#
# pipeline/per_seed.sh on pipeline/reproductions/ablations/fedbiad_X.yaml, builds
# abl_fedbiad_X_sSEED (the partition seed follows the seed; rerun to resume,
# KEEP_CODE=1 when the code changed since), one torch thread per build and nice 5 unless
# OMP_NUM_THREADS / NICE say otherwise; ROUNDS=n is a cost probe. Each finished seed's curves
# and params are committed under docs/reproductions/data/; a claim reads the seeds together
# with a glob (`curves: data/abl_fedbiad_X_s*.csv`), so no merged file is needed.
set -euo pipefail
x=${1:?usage: fedbiad_run.sh X SEED...}
shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} NICE=${NICE:-5}
exec bash pipeline/per_seed.sh "pipeline/reproductions/ablations/fedbiad_$x.yaml" "abl_fedbiad_$x" "$@"
