#!/usr/bin/env bash
# Installs tcap from BUILD_DIR into a scratch prefix and builds examples/consumer against
# it with find_package(tcap), then runs it. Usage: install_test.sh SOURCE_DIR BUILD_DIR TORCH_PREFIX
set -euo pipefail
src=$1 build=$2 torch=$3
work="$build/install-test"
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix;$torch" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/build/consumer"
echo "install_test: find_package(tcap) consumer built and ran"
