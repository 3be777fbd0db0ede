#!/usr/bin/env bash
# The README's two commands:  tools/dev.sh demo  |  tools/dev.sh test
# Installs what is missing (tools/bootstrap.sh), configures build/ with Ninja, builds what
# the command runs, then runs the demo or the whole test suite through CTest.
#   demo   the library, tcap-demo and tcap-inspect only, then the demo
#   test   everything (tests, benchmarks, examples), then CTest
#   build  everything, nothing run
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
what=${1:-}
case "$what" in
  demo)
    echo "tcap demo: installs what is missing, builds the library, tcap-demo and tcap-inspect (about 6 minutes" \
         "the first time on a 2-core machine, seconds after), then captures and compiles the seed workloads"
    targets=(tcap-demo tcap-inspect) ;;
  test)
    echo "tcap tests: installs what is missing, builds everything (about 15 minutes the first time on a 2-core" \
         "machine with the precompiled LibTorch header, seconds after), then runs the whole suite through CTest"
    targets=() ;;
  build) targets=() ;;
  *) echo "usage: tools/dev.sh demo|test|build" >&2; exit 2 ;;
esac

prefix=$(bash "$root/tools/bootstrap.sh" | tail -n 1)
# ccache keyed on paths relative to the checkout, so every clone on this machine shares it.
# The sloppiness lets it cache files compiled with the precompiled LibTorch header
# (Note [Precompiled LibTorch headers], cmake/TcapPch.cmake).
export CCACHE_DIR="${TCAP_CACHE_DIR:-$HOME/.cache/tcap}/ccache" CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$root/build/build.ninja" ]; then
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >&2
fi
cmake --build "$root/build" -j "$(nproc)" ${targets[@]+--target "${targets[@]}"}

case "$what" in
  demo) "$root/build/examples/tcap-demo" --out "$root/tcap-out" ;;
  test) ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" ;;
  build) ;;
esac
