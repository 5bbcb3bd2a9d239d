#!/usr/bin/env bash
# Runs one pytest file of tests/python against the kiln package in <build>/python (ctest registers one test per
# file). Exits 4 (ctest: Skipped) with a SKIPPED line when the module was not built or the interpreter lacks pytest
# or NumPy: setup.sh installs pybind11-dev, python3-numpy and python3-pytest.
#   run_pytest.sh SOURCE_DIR BUILD_DIR PYTHON TEST_FILE [WHY_SKIPPED]
# WHY_SKIPPED: set by CMake where this build does not make the module (a sanitized build), printed as the reason.
set -uo pipefail
src="$1" build="$2" py="${3:-}" file="$4" why="${5:-}"
[ -n "$py" ] || py=python3
if [ -n "$why" ]; then
  echo "SKIPPED: $why"
  exit 4
fi
if ! ls "$build"/python/kiln/_kiln*.so >/dev/null 2>&1; then
  echo "SKIPPED: the Python module was not built (no pybind11 or Python headers when CMake ran; Debian: apt-get install pybind11-dev python3-dev, then reconfigure)"
  exit 4
fi
if ! "$py" -c "import pytest, numpy" 2>/dev/null; then
  echo "SKIPPED: $py has no pytest or NumPy (Debian: apt-get install python3-pytest python3-numpy)"
  exit 4
fi
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" KILN_SOURCE_DIR="$src" KILN_APP="$build/bin/kiln" PYTHONDONTWRITEBYTECODE=1
# Runs leave nothing in the source tree: pytest's cache and every run directory go under the test's tmp dirs.
exec "$py" -m pytest -v -p no:cacheprovider "$src/tests/python/$file"
