#!/usr/bin/env bash
# The C accelerator under AddressSanitizer and UBSan: builds an instrumented _scan into a copy of the
# package (the source tree is untouched) and runs the tests that drive it (contract, readers,
# diagnose, fuzz). Any memory error or undefined behaviour aborts the run.
#   scripts/sanitize_scan.sh [pytest args...]      (default: the tests below)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r exporter/sglang_tuning_exporter "$tmp/"
rm -f "$tmp"/sglang_tuning_exporter/sources/_scan*.so
inc=$($PYTHON -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$($PYTHON -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# the digest setup.py builds in, by accel's own rule (the copy has no _scan module to load yet)
digest=$(PYTHONPATH="$tmp" $PYTHON -c 'from sglang_tuning_exporter.sources.accel import source_digest; print(source_digest())')
gcc -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -shared -fPIC \
    -DSCAN_SOURCE="\"$digest\"" -I"$inc" exporter/sglang_tuning_exporter/sources/_scan.c -o "$tmp/sglang_tuning_exporter/sources/_scan$suffix"
preload=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(tests/sources/test_scan_accel.py tests/sources/test_logfiles.py tests/sources/test_logreader.py
         tests/offline/test_diagnose.py tests/sources/test_parser_fuzz.py tests/pipeline/test_signals.py)
fi
# The copy comes first on the path; the check below proves the instrumented module is the one loaded.
PYTHONPATH="$tmp" LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
  $PYTHON -c "import sglang_tuning_exporter.sources._scan as s, sys; assert s.__file__.startswith('$tmp'), s.__file__"
PYTHONPATH="$tmp" LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
  $PYTHON -m pytest -q -p no:cacheprovider "${tests[@]}"
