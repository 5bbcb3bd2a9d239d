#!/usr/bin/env bash
# Kiln as a Conan 2 package: `conan create conan/` builds and packages Kiln against the system's libraries, then
# conan/test_package builds a plugin against the package with find_package(kiln) and the packaged `kiln` app must
# list it and train one epoch with its layer. Everything Conan writes stays in <build>/conan-package-test (its
# CONAN_HOME included; the user's ~/.conan2 is never read or written), wiped at the start of each run.
#
# Conan: $KILN_CONAN, else <source>/.venv-tools/bin/conan (./setup.sh test creates it), else `conan` on PATH, else
# it is installed with pip into <build>/conan-venv. Exits 4 (CTest: Skipped) with the reason when there is no Conan 2
# and it cannot be installed (no python3 venv module, no network). The package builds without the Vulkan and CUDA
# backends unless KILN_CONAN_OPTIONS says otherwise (e.g. "-o kiln/*:with_vulkan=auto").
# usage: conan_package_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd) bin=$(cd "$2" && pwd)
work="$bin/conan-package-test"

skipping=0
skip() {
  skipping=1
  echo "KILN-SKIPPED: conan package test: $*"
  exit 4
}
# Only skip() may exit with CTest's skip code; any other command failing with 4 is a failure.
trap 'rc=$?; if [ "$rc" = 4 ] && [ "$skipping" = 0 ]; then exit 1; fi' EXIT

is_conan2() { [ -n "$1" ] && [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q "^Conan version 2\."; }

conan=""
for c in "${KILN_CONAN:-}" "$src/.venv-tools/bin/conan" "$bin/conan-venv/bin/conan" "$(command -v conan || true)"; do
  if is_conan2 "$c"; then conan=$c; break; fi
done
if [ -z "$conan" ]; then
  command -v python3 >/dev/null || skip "no Conan 2 and no python3 to install it with"
  echo "== installing Conan 2 with pip into $bin/conan-venv"
  rm -rf "$bin/conan-venv"
  python3 -m venv "$bin/conan-venv" >"$bin/conan-venv.log" 2>&1 ||
    skip "no Conan 2, and python3 -m venv failed (Debian: apt-get install python3-venv); see $bin/conan-venv.log"
  if ! "$bin/conan-venv/bin/pip" install --retries 1 --timeout 30 'conan>=2,<3' >>"$bin/conan-venv.log" 2>&1; then
    rm -rf "$bin/conan-venv"
    skip "no Conan 2, and pip could not install it (no network?); ./setup.sh test installs it into .venv-tools"
  fi
  conan="$bin/conan-venv/bin/conan"
fi
echo "== $("$conan" --version) ($conan)"

rm -rf "$work"
mkdir -p "$work"
export CONAN_HOME="$work/home"
unset CONAN_DEFAULT_PROFILE CONAN_DEFAULT_BUILD_PROFILE
# Kiln requires nothing from ConanCenter: without the remote, a recipe that asked for a package would fail here.
"$conan" remote remove conancenter >/dev/null 2>&1 || true

# The repository's profile when the compiler is GCC 12 (Debian 12's), else the one Conan detects, with C++20.
profile=(--profile:all "$src/conan/profiles/debian12-gcc12")
if ! "${CXX:-c++}" -v 2>&1 | grep -q "^gcc version 12\."; then
  "$conan" profile detect >/dev/null
  profile=(-s:a compiler.cppstd=20)
fi
# shellcheck disable=SC2206
options=(-o "kiln/*:with_vulkan=False" -o "kiln/*:with_cuda=False" ${KILN_CONAN_OPTIONS:-})
conf=(-c tools.cmake.cmaketoolchain:generator=Ninja)

# test_package runs from a copy, so neither its build tree nor CMakeUserPresets.json lands in the source tree.
mkdir -p "$work/test_package"
(cd "$src/conan/test_package" && cp CMakeLists.txt conanfile.py ./*.cpp ./*.toml "$work/test_package/")

t0=$(date +%s)
"$conan" create "$src/conan" "${profile[@]}" "${options[@]}" "${conf[@]}" --test-folder="" >"$work/create.log" 2>&1 ||
  { tail -60 "$work/create.log"; echo "conan create failed; full log: $work/create.log"; exit 1; }
t1=$(date +%s)
grep -E "^-- Kiln: (Vulkan|CUDA) backend" "$work/create.log" || true
"$conan" test "$work/test_package" kiln/0.1.0 "${profile[@]}" "${options[@]}" "${conf[@]}" >"$work/test.log" 2>&1 ||
  { tail -60 "$work/test.log"; echo "test_package failed; full log: $work/test.log"; exit 1; }
t2=$(date +%s)
grep -E "^(conan_check|    layer conan_dense|epoch 1/1|done:)" "$work/test.log" || true
grep -q "test_package: the packaged kiln loaded the plugin and trained with its layer" "$work/test.log" ||
  { tail -60 "$work/test.log"; echo "test_package did not report success"; exit 1; }
echo "conan package test: ok (conan create $((t1 - t0)) s, test_package $((t2 - t1)) s)"
