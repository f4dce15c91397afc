#!/usr/bin/env bash
# One-command GPU check: the tests that run CuPy on the device (the `gpu` marker: the CuPy
# instances of the backend matrix and tests/test_cupy_kernels.py, every instance and the
# full products of the parameter grids; the CPU emulation and NVRTC tests run in CI, not
# here), then benchmarks/gpu_report.py.
# Results go to $OUT when it is set (else to ./gpu_check): the pytest log, the report's
# JSON and its printed table, with the device name and the commit measured.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
#
# Knobs (environment): TESTS_TIMEOUT and REPORT_TIMEOUT (seconds; 600 and 900 by default),
# PYTEST_WORKERS (pytest-xdist workers when pytest-xdist is installed; 0 runs in one
# process), REPORT_ARGS (extra arguments of gpu_report.py), TILTLAB_COMMIT (the commit to
# record where the tree is not a git checkout).
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check}"
mkdir -p "$out"
py="${PYTHON:-python}"
commit="${TILTLAB_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
export TILTLAB_COMMIT="$commit"
{
  echo "commit: $commit"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  "$py" -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" 2>&1
} | tee "$out/device.txt"
workers=()
if [ "${PYTEST_WORKERS:-0}" != 0 ] && "$py" -c "import xdist" 2>/dev/null; then
  workers=(-n "$PYTEST_WORKERS")
fi
start=$(date +%s)
TILTLAB_FULL_MATRIX=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  timeout "${TESTS_TIMEOUT:-600}" "$py" -m pytest -q -p no:cacheprovider -p no:benchmark "${workers[@]}" \
  tests -m gpu --tier full -rfE --durations=10 2>&1 | tee "$out/pytest_cupy.txt" | tail -40
echo "tests: $(( $(date +%s) - start )) s" | tee -a "$out/device.txt"
start=$(date +%s)
# shellcheck disable=SC2086
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${REPORT_TIMEOUT:-900}" "$py" \
  benchmarks/gpu_report.py --no-tests --json "$out/gpu_report.json" ${REPORT_ARGS:-} 2>&1 \
  | tee "$out/gpu_report.txt"
echo "report: $(( $(date +%s) - start )) s" | tee -a "$out/device.txt"

# The asv history: the suite run on the installed package and recorded for this commit
# under a machine profile named after the GPU (gpu-<device name>), in $out/asv-results;
# copy its machine folder into benchmarks/results/ to add the point to the history.
# Knobs: ASV_RECORD=0 skips it, ASV_BENCH (asv -b expression, default the GPU and Dask
# benchmarks and the counts), ASV_TIMEOUT (seconds, 600 by default).
if [ "${ASV_RECORD:-1}" != 0 ] && "$py" -c "import asv" 2>/dev/null; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  machine="gpu-$(printf '%s' "${gpu:-unknown}" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')"
  date_arg=()
  if ! git rev-parse HEAD >/dev/null 2>&1; then
    date_arg=(--date "${TILTLAB_COMMIT_DATE:-$(date -u +%Y-%m-%dT%H:%M:%S)}")
  fi
  start=$(date +%s)
  ASV_PYTHONPATH="$PWD" timeout "${ASV_TIMEOUT:-600}" "$py" benchmarks/asv_record.py \
    --machine "$machine" --results-dir "$out/asv-results" --commit "$commit" "${date_arg[@]}" \
    --cpu "$(nproc) CPU cores, ${gpu:-no GPU}" \
    -b "${ASV_BENCH:-Bandwidth|TiltedRisk|TiltedWeights|HierarchicalRisk|ValueAndGradient|Passes|DaskEvaluation}" \
    -- -a rounds=1 -a repeat=3 2>&1 | tee "$out/asv_run.txt" | tail -40
  echo "asv: $(( $(date +%s) - start )) s, results in $out/asv-results/$machine" \
    | tee -a "$out/device.txt"
else
  echo "asv not installed (pip install asv): no point added to the asv history" \
    | tee -a "$out/device.txt"
fi
