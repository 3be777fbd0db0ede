#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU and no package registry (CUDA,
# PyTorch at /opt/torch/.venv, CMake, ninja; no LLVM, no network).
#
#   tools/gpu_check.sh pack     here, with network: copies what the build needs that such a
#                               machine lacks into .deps/ (git-ignored): nlohmann/json's
#                               headers and CMake config, GoogleTest's sources
#   tools/gpu_check.sh run      there (carry .deps): builds tcap against the machine's own
#                               PyTorch in build-gpu/, then runs, logging each step (into
#                               $OUT, default ./gpu-out: summary.txt, gpu-logs.tgz):
#                                 1. the CUDA tests (CudaDevice.*, CudaRender.*, CudaCache.*)
#                                 2. the op sweep on CUDA (tcap_op_sweep_cuda_tests)
#                                 3. the whole CTest suite, GPU present
#                                 4. tcap-bench --device cuda on the CUDA workloads, with
#                                    the torch.compile peer, JSON in $OUT/bench-cuda.json
#                               A failing step is logged and the next one still runs; the
#                               exit status is the number of failed steps.
#
# Once `tools/gpu_check.sh pack` here, then, in a copy of the checkout that includes .deps
# on the GPU machine: `OUT=<dir> tools/gpu_check.sh run` (a 16-core build takes a few
# minutes; set TCAP_GPU_STEPS=1,2,4 to choose steps, TCAP_GPU_TARGETS="tcap_codegen_tests
# tcap-bench ..." to build only those targets, TCAP_GPU_STEP_TIMEOUT=<seconds> to bound each
# step; the log archive is rewritten after every step, so a run cut short still has it).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps="$root/.deps"

pack() {
  set -e
  local json_inc=/usr/include/nlohmann json_cmake=/usr/share/cmake/nlohmann_json gtest_src=/usr/src/googletest
  if [ ! -d "$json_inc" ] || [ ! -d "$json_cmake" ] || [ ! -d "$gtest_src" ]; then
    echo "gpu_check pack: needs nlohmann-json3-dev and googletest installed here (tools/bootstrap.sh installs them)" >&2
    exit 1
  fi
  rm -rf "$deps"
  mkdir -p "$deps/prefix/include" "$deps/prefix/share/cmake"
  cp -r "$json_inc" "$deps/prefix/include/"
  cp -r "$json_cmake" "$deps/prefix/share/cmake/"
  cp -r "$gtest_src" "$deps/googletest"
  du -sh "$deps"
}

run() {
  # Three files go to $OUT, for runners that bring back only a few: the summary, the
  # bench's JSON and one archive of the step logs.
  local out=${OUT:-$root/gpu-out}
  local logs="$root/build-gpu-logs"
  mkdir -p "$out" "$logs"
  local steps=${TCAP_GPU_STEPS:-1,2,3,4,5}
  local python=${TCAP_PYTHON:-/opt/torch/.venv/bin/python3}
  local failed=0
  local jobs
  jobs=$(nproc)
  step() {  # step NAME COMMAND...: logs to $out/NAME.log, counts a failure
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$out/summary.txt"
    local t0=$SECONDS
    if timeout "${TCAP_GPU_STEP_TIMEOUT:-0}" "$@" >"$logs/$name.log" 2>&1; then
      echo "   ok ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
    else
      echo "   FAILED, status $? ($((SECONDS - t0)) s); last lines:" | tee -a "$out/summary.txt"
      tail -n 15 "$logs/$name.log" | sed 's/^/   | /' | tee -a "$out/summary.txt"
      failed=$((failed + 1))
    fi
    tar czf "$out/gpu-logs.tgz" -C "$logs" . 2>/dev/null || true
  }
  wants() { [[ ",$steps," == *",$1,"* ]]; }

  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  } >"$out/summary.txt" 2>&1
  cat "$out/summary.txt"
  [ -d "$deps/prefix" ] && [ -d "$deps/googletest" ] || { echo "gpu_check run: no .deps/ (run 'tools/gpu_check.sh pack' first and carry .deps)" | tee -a "$out/summary.txt"; return 1; }

  local torch_prefix
  torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') || return 1
  # GoogleTest is built there, outside .deps (which stays as packed: sources only).
  local gtest="$root/build-gpu-gtest"
  if [ ! -f "$gtest/prefix/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$gtest/prefix/lib64/cmake/GTest/GTestConfig.cmake" ]; then
    step gtest bash -c "cmake -S '$deps/googletest' -B '$gtest/build' -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX='$gtest/prefix' && cmake --build '$gtest/build' -j $jobs \
      && cmake --install '$gtest/build'"
  fi
  # shellcheck disable=SC2086  # TCAP_GPU_CMAKE_ARGS: extra arguments, split on spaces
  step configure cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_PREFIX_PATH=$torch_prefix;$deps/prefix;$gtest/prefix" ${TCAP_GPU_CMAKE_ARGS:-}
  # shellcheck disable=SC2086  # TCAP_GPU_TARGETS: target names, split on spaces
  step build cmake --build "$root/build-gpu" -j "$jobs" ${TCAP_GPU_TARGETS:+--target $TCAP_GPU_TARGETS}
  [ -x "$root/build-gpu/test/tcap_codegen_tests" ] || { echo "gpu_check run: the build failed" | tee -a "$out/summary.txt"; return 1; }

  local t="$root/build-gpu/test"
  # A failing CUDA test runs again with synchronous launches, so that a kernel fault is
  # reported by the launch of the kernel that made it (named in the error) rather than by
  # a later CUDA call.
  local before
  if wants 1; then
    before=$failed
    step cuda_tests "$t/tcap_codegen_tests" --gtest_filter='Cuda*'
    [ "$failed" -gt "$before" ] && step cuda_tests_blocking env CUDA_LAUNCH_BLOCKING=1 TCAP_LOGS=fusion,perf \
      "$t/tcap_codegen_tests" --gtest_filter='Cuda*'
  fi
  if wants 2; then
    before=$failed
    step op_sweep_cuda "$t/tcap_op_sweep_cuda_tests"
    [ "$failed" -gt "$before" ] && step op_sweep_cuda_blocking env CUDA_LAUNCH_BLOCKING=1 "$t/tcap_op_sweep_cuda_tests"
  fi
  wants 3 && step ctest ctest --test-dir "$root/build-gpu" -j "$jobs" --output-on-failure
  local workloads=coscos,mlp_big,softmax_ce,transformer_block,bias_relu
  wants 4 && step bench_cuda "$root/build-gpu/bench/tcap-bench" --device cuda --no-inductor \
    --filter "$workloads" --repeats 11 --json "$out/bench-cuda.json"
  wants 5 && step bench_cuda_peer "$root/build-gpu/bench/tcap-bench" --device cuda --python "$python" \
    --filter "$workloads" --variants eager,tcap_cuda,py_eager,inductor --repeats 11 --json "$out/bench-cuda-peer.json"
  tar czf "$out/gpu-logs.tgz" -C "$logs" .
  echo "gpu_check: $failed step(s) failed; summary and logs (gpu-logs.tgz) in $out" | tee -a "$out/summary.txt"
  return "$failed"
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: tools/gpu_check.sh pack|run" >&2; exit 2 ;;
esac
