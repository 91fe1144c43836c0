#!/usr/bin/env bash
# The GPU check's launcher (benchmarks/README.md, "gpu_check").
#
#   bash benchmarks/gpu_check.sh [gpu_check.py options]   (make gpu-check)
#       on the GPU machine: install what its Python lacks from .gpu-wheels/ into a throwaway
#       folder (its own torch, the CUDA build, stays the one used), then run
#       benchmarks/gpu_check.py with the options given (--device, --budget-s, --dry-run, ...);
#       nothing is installed when every package is already importable (the CPU dry run in CI)
#   bash benchmarks/gpu_check.sh --fetch-wheels            (make gpu-wheels)
#       here, with network: download those wheels for Python $GPU_PYTHON_VERSION (3.12) on
#       manylinux x86_64 into .gpu-wheels/, add scikit-learn's digits file (the contract tests'
#       dataset, without scikit-learn), and print what would travel (must stay under 64 MiB)
#
# Environment: GPU_CHECK_PYTHON (the Python with torch; default python3, else python),
# GPU_WHEELS (default .gpu-wheels), GPU_CHECK_TIMEOUT (seconds, installation included, after
# which the check is stopped; default 470, under the 8 minutes it may take on one H100),
# GPU_PYTHON_VERSION (3.12).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=${GPU_WHEELS:-.gpu-wheels}
LIMIT_MIB=64
# what fedcomm.simulation, fedcomm.config, benchmarks/backends.py and the contract tests import
# beyond torch and the standard library (module:requirement); polars 1.20 is one 33 MB wheel,
# 1.3x and later add a 54 MB runtime wheel that would not fit in the 64 MiB that travel
REQUIREMENTS=(
  "pydantic:pydantic>=2.7"
  "polars:polars>=1.20,<1.21"
  "numpy:numpy>=2.0"
  "yaml:pyyaml>=6"
  "rich:rich>=13"
  "pytest:pytest>=8"
)

die() { echo "gpu_check.sh: $*" >&2; exit 2; }

specs() { local r; for r in "${REQUIREMENTS[@]}"; do echo "${r#*:}"; done; }

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

fetch_wheels() {
  local pyv=${GPU_PYTHON_VERSION:-3.12} py=${PIP_PYTHON:-}
  [ -n "$py" ] || { [ -x .venv/bin/python ] && py=.venv/bin/python || py=python3; }
  mkdir -p "$WHEELS"
  rm -f "$WHEELS"/*.whl "$WHEELS"/digits.csv.gz
  # binary wheels only, for the GPU machine's Python, not this one's
  mapfile -t reqs < <(specs)
  "$py" -m pip download --quiet --only-binary=:all: --python-version "$pyv" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --dest "$WHEELS" "${reqs[@]}"
  # the contract tests' dataset is scikit-learn's digits; scikit-learn itself (with SciPy) is
  # far too big to travel, so its data file goes alone (gpu_check.py reads it as it would)
  local digits
  digits=$("$py" -c 'import importlib.resources as r; print(r.files("sklearn.datasets") / "data" / "digits.csv.gz")') \
    || die "scikit-learn is not importable by $py: its digits.csv.gz cannot be copied"
  cp "$digits" "$WHEELS/digits.csv.gz"
  report_size
}

report_size() {
  local wheels repo untracked total
  wheels=$(du -cb "$WHEELS"/* | tail -1 | cut -f1)
  repo=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  untracked=$(git ls-files -z -o --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
  untracked=${untracked:-0}
  total=$((wheels + repo + untracked))
  ls -l "$WHEELS"
  echo "travels: wheels $(mib "$wheels") MiB + tracked files $(mib "$repo") MiB +" \
    "untracked files $(mib "$untracked") MiB = $(mib "$total") MiB (limit $LIMIT_MIB MiB)"
  [ "$total" -lt $((LIMIT_MIB * 1048576)) ] || die "more than $LIMIT_MIB MiB would travel"
}

pick_python() {
  local c
  for c in ${GPU_CHECK_PYTHON:-} python3 python; do
    if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then echo "$c"; return; fi
  done
  die "no Python with torch found (set GPU_CHECK_PYTHON)"
}

missing_specs() {  # the requirements $1 lacks: a module it cannot find, or one older than asked
  "$1" - "${REQUIREMENTS[@]}" <<'PY'
import importlib.metadata as md, importlib.util, re, sys

def version(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])

for entry in sys.argv[1:]:
    module, spec = entry.split(":", 1)
    dist = re.match(r"[A-Za-z0-9_.-]+", spec).group(0)
    low = re.search(r">=([\d.]+)", spec)  # (an upper bound only picks the wheel to download)
    try:
        ok = importlib.util.find_spec(module) is not None
        ok = ok and (low is None or version(md.version(dist)) >= version(low.group(1)))
    except (ImportError, md.PackageNotFoundError):
        ok = False
    if not ok:
        print(spec)
PY
}

install_missing() {  # $1 python, $2 target folder, the rest: requirement specs
  local py=$1 target=$2; shift 2
  [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1 \
    || die "$* missing and no wheels in $WHEELS/ (run make gpu-wheels where there is network, carry $WHEELS)"
  echo "gpu_check.sh: installing $* from $WHEELS/ into $target" >&2
  if ! "$py" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$target" \
      --disable-pip-version-check "$@"; then
    # no pip, or a pip that refuses: a wheel is a zip of the installed files; unpack every one
    # whose distribution this Python does not have
    echo "gpu_check.sh: pip could not install them; unpacking the wheels $py lacks" >&2
    rm -rf "${target:?}"/*
    "$py" - "$WHEELS" "$target" <<'PY'
import importlib.metadata as md, pathlib, re, sys, zipfile
wheels, target = pathlib.Path(sys.argv[1]), sys.argv[2]
for whl in sorted(wheels.glob("*.whl")):
    dist = re.split(r"-\d", whl.name, maxsplit=1)[0]
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        zipfile.ZipFile(whl).extractall(target)
PY
  fi
}

if [ "${1:-}" = "--fetch-wheels" ]; then
  fetch_wheels
  exit 0
fi

PY=$(pick_python)
mapfile -t MISSING < <(missing_specs "$PY")
PYPATH=src
if [ "${#MISSING[@]}" -gt 0 ]; then
  TARGET=$(mktemp -d "${TMPDIR:-/tmp}/fedcomm-gpu-check.XXXXXX")
  trap 'rm -rf "$TARGET"' EXIT
  install_missing "$PY" "$TARGET" "${MISSING[@]}"
  PYPATH="$TARGET:src"
fi
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}"
LEFT=$(( ${GPU_CHECK_TIMEOUT:-470} - SECONDS ))  # (SECONDS: since this script started)
if command -v timeout >/dev/null; then
  # a safety net only: the check keeps its own budget (--budget-s) and writes as it goes
  timeout --kill-after=10 "$(( LEFT > 30 ? LEFT : 30 ))" "$PY" benchmarks/gpu_check.py "$@"
else
  "$PY" benchmarks/gpu_check.py "$@"
fi
