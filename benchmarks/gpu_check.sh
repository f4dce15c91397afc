#!/usr/bin/env bash
# One-command GPU check: the CuPy/CUDA test subset, then benchmarks/gpu_report.py.
# Results go to $OUT when it is set (else to ./gpu_check): the pytest log, the report's
# JSON and its printed table, with the device name and the commit measured.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check}"
mkdir -p "$out"
py="${PYTHON:-python}"
{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
} | tee "$out/device.txt"
TILTLAB_FULL_MATRIX=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 900 "$py" -m pytest -q -p no:cacheprovider \
  tests -k "cupy or cuda" -rfE 2>&1 | tee "$out/pytest_cupy.txt" | tail -25
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 1200 "$py" benchmarks/gpu_report.py \
  --no-tests --json "$out/gpu_report.json" 2>&1 | tee "$out/gpu_report.txt"
