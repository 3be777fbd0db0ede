#!/usr/bin/env bash
# Runs tcap's core test suites under sanitizers (docs/reliability.md).
#
#   tools/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer: the IR,
#                            capture, interpreter, compile and thread suites, and the fuzz
#                            targets' short runs, in build-asan/
#   tools/sanitize.sh tsan   ThreadSanitizer: the thread stress suite and the capture
#                            suite's threaded tests, in build-tsan/
# Both also run the many-threads-one-model stress tests (SharedModel.*) long:
# TCAP_SANITIZE_STRESS iterations per thread (default 1000; CTest runs 25).
#   tools/sanitize.sh asan|tsan threads   the thread suites only (tcap_thread_tests and the
#                                         long stress run): builds the library and one test
#
# Builds with the system compiler and -DTCAP_SANITIZE (cmake/TcapSanitizers.cmake), only
# the targets it runs. LibTorch is a prebuilt wheel and is not instrumented: reports
# whose frames are inside LibTorch are suppressed by tools/sanitizers/*.supp (each entry
# says why); nothing of tcap's is. Prints one line per suite and the verdict, and keeps
# the full logs in build-<kind>/sanitize-logs/. Exit status 0 when every suite is clean.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kind=${1:-}
only=${2:-}
case "$only" in
  ""|threads) ;;
  *) echo "usage: tools/sanitize.sh asan|tsan [threads]" >&2; exit 2 ;;
esac
case "$kind" in
  asan) san=address ;;
  tsan) san=thread ;;
  *) echo "usage: tools/sanitize.sh asan|tsan" >&2; exit 2 ;;
esac
build="$root/build-$kind"
supp="$root/tools/sanitizers"
prefix=$(bash "$root/tools/bootstrap.sh" | tail -n 1)
export CCACHE_DIR="${TCAP_CACHE_DIR:-$HOME/.cache/tcap}/ccache" CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTCAP_SANITIZE=$san -DTCAP_BUILD_BENCH=OFF -DTCAP_BUILD_EXAMPLES=OFF "${launcher[@]}" >&2 || exit 2
fi

# suite NAME COMMAND...: what runs, by kind.
stress=${TCAP_SANITIZE_STRESS:-1000}
suites=()
if [ "$kind" = asan ]; then
  targets=(tcap_ir_tests tcap_capture_tests tcap_interp_tests tcap_compile_tests tcap_thread_tests tcap_fuzz_json
           tcap_fuzz_interp)
  corpus="$root/test/fuzz/corpus"
  suites=(
    "tcap_ir_tests|test/tcap_ir_tests"
    "tcap_capture_tests|test/tcap_capture_tests"
    "tcap_interp_tests|test/tcap_interp_tests"
    "tcap_compile_tests|test/tcap_compile_tests"
    "tcap_thread_tests|test/tcap_thread_tests"
    "SharedModel stress ($stress iterations)|TCAP_STRESS_ITERATIONS=$stress test/tcap_thread_tests --gtest_filter='*SharedModel*'"
    "tcap_fuzz_json (5000 mutants)|test/fuzz/tcap_fuzz_json -runs=5000 -seed=1 $corpus"
    "tcap_fuzz_interp (3000 mutants)|test/fuzz/tcap_fuzz_interp -runs=3000 -seed=1 $corpus"
  )
  # LibTorch's static registrations and caches live until exit: leaks inside it are its own.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
else
  targets=(tcap_thread_tests tcap_capture_tests)
  suites=(
    "tcap_thread_tests|test/tcap_thread_tests"
    "SharedModel stress ($stress iterations)|TCAP_STRESS_ITERATIONS=$stress test/tcap_thread_tests --gtest_filter='*SharedModel*'"
    "tcap_capture_tests (threads)|test/tcap_capture_tests --gtest_filter=Guard.*"
  )
  export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:report_signal_unsafe=0:suppressions=$supp/tsan.supp"
  # LibTorch's OpenMP runtime is not instrumented: its barriers look like races.
  export OMP_NUM_THREADS=1
fi

if [ "$only" = threads ]; then
  targets=(tcap_thread_tests)
  kept=()
  for entry in "${suites[@]}"; do
    case "$entry" in tcap_thread_tests*|SharedModel*) kept+=("$entry") ;; esac
  done
  suites=("${kept[@]}")
fi

cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >&2 || { echo "sanitize: build failed" >&2; exit 2; }

logs="$build/sanitize-logs"
mkdir -p "$logs"
status=0
summary="$build/sanitize-result.txt"
{
  echo "tools/sanitize.sh $kind${only:+ $only}, $(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (with local changes)')"
} >"$summary"
for entry in "${suites[@]}"; do
  name=${entry%%|*}
  cmd=${entry#*|}
  log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9_\n' '_').log"
  start=$(date +%s)
  (cd "$build" && eval "$cmd") >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  reports=$(grep -cE '^(==[0-9]+==ERROR|WARNING: ThreadSanitizer|SUMMARY: [A-Za-z]+Sanitizer)|runtime error:' "$log")
  suppressed=$(grep -oE 'ThreadSanitizer: reported [0-9]+ warnings|Suppressions used' "$log" | head -n 1)
  if [ "$rc" -eq 0 ] && [ "$reports" -eq 0 ]; then
    verdict=clean
  else
    verdict="FAILED (exit $rc, $reports sanitizer reports; see $log)"
    status=1
  fi
  line="$name: $verdict, ${secs}s"
  echo "$line" | tee -a "$summary"
done
[ $status -eq 0 ] && echo "sanitize $kind: all clean" | tee -a "$summary" || echo "sanitize $kind: FAILED" | tee -a "$summary"
exit $status
