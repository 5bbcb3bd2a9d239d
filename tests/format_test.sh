#!/usr/bin/env bash
# The house style holds itself: every C++ and CUDA file git tracks must be formatted as .clang-format says, by the
# clang-format of Debian 12 (version 14; other versions format some constructs differently, so they are not used).
# Fails naming each unformatted file and how to fix it; exits 4 (Skipped) without clang-format 14 or outside git.
set -uo pipefail
src=$1
cd "$src" || exit 1
cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null && "$c" --version | grep -q 'version 14\.'; then cf=$c; break; fi
done
if [ -z "$cf" ]; then
  echo "KILN-SKIPPED: no clang-format 14 (Debian 12's clang-format package) on this machine"
  exit 4
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "KILN-SKIPPED: $src is not a git checkout: the tracked files are not known"
  exit 4
fi
mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  "$cf" --dry-run -Werror --style=file "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "${#bad[@]} of ${#files[@]} files are not formatted as .clang-format says:"
  printf '  %s\n' "${bad[@]}"
  echo "fix: $cf -i <file> (or: git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' | xargs $cf -i)"
  exit 1
fi
echo "${#files[@]} files formatted as .clang-format says ($cf)"
