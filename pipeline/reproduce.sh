#!/usr/bin/env bash
# `make reproduce`: run one params file as its own DVC pipeline in build/<name>/, and resume it.
#
#   bash pipeline/reproduce.sh NAME PROFILE [FRESH] [KEEP_CODE]      (run from the project root)
#
# First call: the pipeline's code (CODE below) and PROFILE (as params.yaml) are copied into a
# staging folder, committed in a git repository there, and the folder is renamed build/NAME (a
# crash during the copy leaves no half-made build), then `dvc repro` runs in it.
# Later calls resume: DVC skips the stages that finished (their deps and params are unchanged) and
# an interrupted train stage continues from its checkpoint (build/NAME/.fedcomm/checkpoints/, not a
# DVC out, so DVC never deletes it), ending with the numbers of an uninterrupted run.
#   - PROFILE changed since: it is taken, and DVC reruns exactly the stages whose params changed.
#   - the project's code changed since: refused (exit 2), because one build never mixes results of
#     two code versions; FRESH=1 starts afresh with the current code, KEEP_CODE=1 finishes with
#     the code the build started with.
#   - FRESH=1: the build is set aside and a new one made; the MLflow runs its interrupted train
#     stages left RUNNING are marked FAILED.
set -euo pipefail

name=${1-} profile=${2-} fresh=${3-} keep_code=${4-}
# everything the build runs (its code): copied on the first call, compared on the later ones
CODE=(dvc.yaml .dvcignore .dvc/config .dvc/.gitignore stages src/fedcomm pipeline/plots)
root=$PWD
build=build/$name

die() {
  echo "error: $*" >&2
  exit 2
}

[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
  die "NAME: '$name' is not a build name (allowed: letters, digits, '.', '_', '-')"
if [[ ! -f $profile ]]; then
  known=$(find pipeline/reproductions -maxdepth 1 -name '*.yaml' 2>/dev/null |
    sed 's|.*/||; s|\.yaml$||' | LC_ALL=C sort | paste -sd' ' -) || true
  die "PROFILE: $profile: no such file (NAME=x runs pipeline/reproductions/x.yaml, x one of:" \
    "${known:-none}; PROFILE= names any params file)"
fi
for flag in "FRESH=$fresh" "KEEP_CODE=$keep_code"; do
  [[ ${flag#*=} =~ ^(|0|1)$ ]] || die "${flag%%=*}: '${flag#*=}' (allowed: 1, 0 or unset)"
done
[[ $fresh != 1 || $keep_code != 1 ]] || die "FRESH=1 and KEEP_CODE=1 exclude each other"

mkdir -p build
exec 9>"build/.$name.lock"  # held until this script ends (a kill releases it too)
if command -v flock >/dev/null; then
  flock -n 9 || die "build/$name: another \`make reproduce NAME=$name\` is running"
fi
rm -rf "build/.$name.new" "build/.$name.old"  # left by a crash during a copy or FRESH=1

git_() { git -C "$build" -c user.email=repro@fedcomm -c user.name=fedcomm "$@" 9>&-; }

SHA256=(sha256sum)
command -v sha256sum >/dev/null || SHA256=(shasum -a 256)
code_sums() {  # "<sha256>  <path>" of every code file under $1, sorted
  (cd "$1" && find "${CODE[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
    2>/dev/null | LC_ALL=C sort -z | xargs -0 -r "${SHA256[@]}")
}

mark_abandoned() {  # $1: a build; the MLflow runs of its interrupted train stages -> FAILED
  local sidecars
  sidecars=$(cd "$1" && find .fedcomm/checkpoints -name mlflow_run_id 2>/dev/null) || true
  [[ -n $sidecars ]] || return 0
  # shellcheck disable=SC2086  # (one sidecar path per word)
  (cd "$1" && FEDCOMM_PROJECT_ROOT=$root python - $sidecars <<'PY'
import sys
from pathlib import Path

from fedcomm.config import load_params
from fedcomm.tracking.mlflow import fail_if_running

uri = load_params(Path("params.yaml")).tracking.uri
for sidecar in sys.argv[1:]:
    reason = "abandoned: `make reproduce FRESH=1` started the build afresh"
    if fail_if_running(uri, Path(sidecar).read_text().strip(), reason):
        print(f"marked the MLflow run of the interrupted {Path(sidecar).parent.name} FAILED")
PY
  ) || echo "warning: could not mark the MLflow runs of $1's interrupted stages FAILED" >&2
}

clear_stale_dvc_lock() {  # DVC's rwlock lists the dvc processes working in the build. A killed
  # one stays listed, and DVC refuses to run while its PID looks alive: not yet reaped (a zombie),
  # or reused by another process after a reboot. Refused only if a live dvc works in the build.
  [[ -f $build/.dvc/tmp/rwlock ]] || return 0
  python - "$build/.dvc/tmp/rwlock" "$build" <<'PY' || exit 2
import json
import os
import sys

import psutil

lock, build = sys.argv[1], os.path.realpath(sys.argv[2])
try:
    with open(lock) as f:
        modes = json.load(f)
    entries = [e for m in ("read", "write") for e in modes.get(m, {}).values()]
    pids = sorted({int(i["pid"]) for e in entries for i in (e if isinstance(e, list) else [e])})
except (OSError, ValueError, KeyError, TypeError, AttributeError):
    pids = []  # unreadable: DVC would refuse it too; nothing can be running from it
for pid in pids:
    try:
        proc = psutil.Process(pid)
        live = proc.status() != psutil.STATUS_ZOMBIE and os.path.realpath(proc.cwd()) == build
    except psutil.Error:
        live = False
    if live:
        sys.exit(f"error: {sys.argv[2]}: dvc (PID {pid}) is running in it; wait for it or stop it")
os.remove(lock)
if pids:
    print(f"cleared DVC's lock left by the killed dvc process(es) {', '.join(map(str, pids))}")
PY
}

if [[ -d $build && $fresh == 1 ]]; then
  mv "$build" "build/.$name.old"
  mark_abandoned "build/.$name.old"
  echo "FRESH=1: starting build/$name afresh"
fi

if [[ -d $build ]]; then
  [[ -d $build/.git && -f $build/params.yaml && -f $build/dvc.yaml ]] ||
    die "build/$name: not a \`make reproduce\` build (no .git, params.yaml or dvc.yaml);" \
      "move it away, or rerun with FRESH=1 to replace it"
  rm -f "$build/.git/index.lock"  # left by a kill during a git command (this script holds the lock)
  clear_stale_dvc_lock
  changed=$(diff <(code_sums .) <(code_sums "$build") | sed -n 's/^[<>] [0-9a-f]*  //p' |
    LC_ALL=C sort -u) || true
  if [[ -n $changed ]]; then
    count=$(wc -l <<<"$changed")
    listed=$(head -n 4 <<<"$changed" | paste -sd, - | sed 's/,/, /g')
    ((count <= 4)) || listed+=", ... ($count files)"
    [[ $keep_code == 1 ]] || die "build/$name was started with other code (changed since:" \
      "$listed): rerun with FRESH=1 to start afresh with this code, or with KEEP_CODE=1 to" \
      "finish with the code it started with"
    echo "KEEP_CODE=1: finishing build/$name with the code it started with (changed since:" \
      "$listed)"
  fi
  if ! cmp -s "$profile" "$build/params.yaml"; then
    cp "$profile" "$build/.params.yaml.new" && mv "$build/.params.yaml.new" "$build/params.yaml"
    echo "$profile changed since build/$name started: DVC reruns the stages whose params changed"
  fi
  git_ diff --quiet HEAD -- params.yaml || git_ commit -qm "$name: $profile changed" -- params.yaml
  echo "resuming build/$name: finished stages are kept, an interrupted train stage continues" \
    "from its checkpoint (FRESH=1 starts afresh)"
else
  stage=build/.$name.new
  for path in "${CODE[@]}"; do
    mkdir -p "$(dirname "$stage/$path")"
    cp -R "$path" "$stage/$path"
  done
  find "$stage" -name __pycache__ -prune -exec rm -rf {} +
  cp "$profile" "$stage/params.yaml"
  git -C "$stage" init -q
  git -C "$stage" add -A
  git -C "$stage" -c user.email=repro@fedcomm -c user.name=fedcomm commit -qm "$name: $profile"
  mv "$stage" "$build"
fi
rm -rf "build/.$name.old"

cd "$build"
# 9>&-: the lock stays with this script; nothing dvc starts (its detached updater or analytics
# daemon outlives a kill of make's process group) may hold it and refuse the rerun.
PYTHONPATH=$root/$build/src FEDCOMM_PROJECT_ROOT=$root dvc repro 9>&-
echo "report: $build/reports/summary.md (MLflow: $root/mlflow.db)"
