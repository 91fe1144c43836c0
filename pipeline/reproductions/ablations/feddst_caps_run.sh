#!/usr/bin/env bash
# FedDST Table 1 rescored (issue 29 §3, docs/reproductions/audit/feddst.md): one build per seed,
# FedAvgM and FedDST in it.
#
#   bash pipeline/reproductions/ablations/feddst_caps_run.sh SEED...  (from the project root)
#
# pipeline/per_seed.sh on pipeline/reproductions/ablations/feddst_caps.yaml, builds
# abl_feddst_caps_sSEED (the partition seed follows the seed; rerun to resume,
# KEEP_CODE=1 when the code changed since), one torch thread per build and nice 5 unless
# OMP_NUM_THREADS / NICE say otherwise; ROUNDS=n is a cost probe. Each finished
# seed's curves and params are committed under docs/reproductions/data/.
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} NICE=${NICE:-5}
exec bash pipeline/per_seed.sh "pipeline/reproductions/ablations/feddst_caps.yaml" "abl_feddst_caps" "$@"
