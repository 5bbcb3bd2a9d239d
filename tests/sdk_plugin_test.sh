#!/usr/bin/env bash
# Installs Kiln's SDK to a temporary prefix, builds samples/third_party_plugin against it with find_package(kiln),
# and trains a run that uses the plugin's layer and data stage.
set -euo pipefail
src=$1 bin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$bin" --prefix "$work/prefix" >/dev/null
# The plugin is built with Kiln's C++ compiler: Kiln refuses a plugin from another toolchain (the asan preset is clang).
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$bin/CMakeCache.txt")
cmake -S "$src/samples/third_party_plugin" -B "$work/plugin" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" ${cxx:+-DCMAKE_CXX_COMPILER="$cxx"} >/dev/null
cmake --build "$work/plugin" >/dev/null
out=$("$work/prefix/bin/kiln" --plugin-dir "$work/plugin" train "$src/samples/third_party_plugin/example.toml" \
  --set train.output_dir="\"$work/run\"" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | tail -3
echo "$out" | grep -q "test accuracy" || { echo "no evaluation line"; exit 1; }
"$work/prefix/bin/kiln" --plugin-dir "$work/plugin" plugins | grep -q "layer residual_dense" || { echo "plugin not listed"; exit 1; }
"$work/prefix/bin/kiln" --plugin-dir "$work/plugin" plugins | grep -q "op swish" || { echo "the plugin's op is not listed"; exit 1; }
# The plugin's op passes conformance on every backend it has a kernel for, with its gradient rule checked.
for backend in cpu vulkan; do
  if [ "$backend" = vulkan ] && ! "$work/prefix/bin/kiln" devices 2>/dev/null | grep -q "^ *vulkan:0"; then
    echo "sdk plugin test: no vulkan device, vulkan conformance of swish not run"; continue
  fi
  for op in swish swish_backward; do
    extra=""; [ "$backend" = vulkan ] && extra="--validation"
    conf=$("$work/prefix/bin/kiln" --plugin-dir "$work/plugin" conformance --backend "$backend" --op "$op" $extra 2>&1) ||
      { echo "$conf"; echo "conformance of $op on $backend failed"; exit 1; }
    echo "$conf" | grep -q "^PASS $backend:0 $op/1000" || { echo "$conf"; echo "no $op case ran on $backend"; exit 1; }
    if [ "$op" = swish ]; then
      echo "$conf" | grep -q "^PASS reference gradient/swish/grad.40" || { echo "$conf"; echo "swish's gradient rule was not checked"; exit 1; }
    fi
    echo "$backend $op: $(echo "$conf" | grep "^== $backend:" | tail -1)"
  done
done
echo "sdk plugin test: ok"
