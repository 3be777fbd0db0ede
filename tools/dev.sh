#!/usr/bin/env bash
# The README's two commands:  tools/dev.sh demo  |  tools/dev.sh test
# Installs what is missing (tools/bootstrap.sh), configures build/ with Ninja, builds,
# then runs the demo or the whole test suite through CTest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
what=${1:-}
case "$what" in demo|test|build) ;; *) echo "usage: tools/dev.sh demo|test|build" >&2; exit 2 ;; esac

prefix=$(bash "$root/tools/bootstrap.sh" | tail -n 1)
# ccache keyed on paths relative to the checkout, so every clone on this machine shares it.
export CCACHE_DIR="${TCAP_CACHE_DIR:-$HOME/.cache/tcap}/ccache" CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$root/build/build.ninja" ]; then
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >&2
fi
cmake --build "$root/build" -j "$(nproc)"

case "$what" in
  demo) "$root/build/examples/tcap-demo" --out "$root/tcap-out" ;;
  test) ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" ;;
  build) ;;
esac
