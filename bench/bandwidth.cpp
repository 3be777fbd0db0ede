// The machine's memory bandwidth, measured once per run for the bandwidth floors.
// See Note [Bandwidth floors] in harness.h. Built with -O3 (bench/CMakeLists.txt) so that
// the loops are vectorised as STREAM's are.
#include "harness.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <string>

namespace tcap::bench {

namespace {

using Clock = std::chrono::steady_clock;

// One parallel pass; returns its seconds. The same split every time (at::parallel_for
// gives each thread one contiguous chunk), so each thread touches the pages it first
// touched.
template <class F>
double timed_pass(int64_t n, const F& body) {
  const auto t0 = Clock::now();
  at::parallel_for(0, n, int64_t{1} << 16, [&](int64_t lo, int64_t hi) { body(lo, hi); });
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Bandwidth measure_bandwidth(int64_t array_bytes, int passes) {
  const int64_t n = array_bytes / static_cast<int64_t>(sizeof(float));
  std::unique_ptr<float[]> a_(new float[static_cast<size_t>(n)]);
  std::unique_ptr<float[]> b_(new float[static_cast<size_t>(n)]);
  std::unique_ptr<float[]> c_(new float[static_cast<size_t>(n)]);
  float* __restrict a = a_.get();
  float* __restrict b = b_.get();
  float* __restrict c = c_.get();
  timed_pass(n, [&](int64_t lo, int64_t hi) {  // first touch (page faults), untimed
    for (int64_t i = lo; i < hi; ++i) {
      a[i] = 1.0f;
      b[i] = 2.0f;
      c[i] = 0.0f;
    }
  });
  const float s = 3.0f;
  double copy_s = std::numeric_limits<double>::infinity();
  double triad_s = copy_s;
  for (int p = 0; p < std::max(passes, 1); ++p) {
    copy_s = std::min(copy_s, timed_pass(n, [&](int64_t lo, int64_t hi) {
                        for (int64_t i = lo; i < hi; ++i) c[i] = a[i];
                      }));
    triad_s = std::min(triad_s, timed_pass(n, [&](int64_t lo, int64_t hi) {
                         for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
                       }));
  }
  Bandwidth bw;
  bw.array_bytes = n * static_cast<int64_t>(sizeof(float));
  bw.copy_gbs = 2.0 * static_cast<double>(bw.array_bytes) / copy_s / 1e9;
  bw.triad_gbs = 3.0 * static_cast<double>(bw.array_bytes) / triad_s / 1e9;
  bw.threads = at::get_num_threads();
  bw.passes = std::max(passes, 1);
  return bw;
}

Bandwidth measure_device_bandwidth(const std::string& device, int64_t array_bytes, int passes) {
  const int64_t n = array_bytes / static_cast<int64_t>(sizeof(float));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor a = at::ones({n}, opts), b = at::full({n}, 2.0, opts), c = at::zeros({n}, opts);
  auto sync = [&] {
    if (device != "cpu") torch::cuda::synchronize();
  };
  auto timed = [&](const auto& body) {
    sync();
    const auto t0 = Clock::now();
    body();
    sync();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  timed([&] { c.copy_(a); });  // warm-up: kernels loaded, memory touched
  double copy_s = std::numeric_limits<double>::infinity();
  double triad_s = copy_s;
  for (int p = 0; p < std::max(passes, 1); ++p) {
    copy_s = std::min(copy_s, timed([&] { c.copy_(a); }));
    triad_s = std::min(triad_s, timed([&] { at::add_out(a, b, c, 3.0); }));
  }
  Bandwidth bw;
  bw.array_bytes = n * static_cast<int64_t>(sizeof(float));
  bw.copy_gbs = 2.0 * static_cast<double>(bw.array_bytes) / copy_s / 1e9;
  bw.triad_gbs = 3.0 * static_cast<double>(bw.array_bytes) / triad_s / 1e9;
  bw.threads = 0;
  bw.passes = std::max(passes, 1);
  return bw;
}

}  // namespace tcap::bench
