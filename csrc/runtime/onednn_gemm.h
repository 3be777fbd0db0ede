// Matrix products through oneDNN (Note [GEMMs through oneDNN] in onednn_gemm.cpp): the
// `tcap::onednn_mm(Tensor self, Tensor mat2, Tensor? bias, str activation="none") -> Tensor`
// operator (activation "none" or "relu"), and the measurements that decide, per shape,
// whether it is faster than ATen's mm/addmm, and whether a ReLU goes inside it.
#pragma once

#include <cstdint>
#include <vector>

namespace tcap::runtime {

// A float32 CPU product a [m, k] @ b [k, n] (+ bias [n]) as the graph records it.
struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
  std::vector<int64_t> a_strides, b_strides;
  bool bias = false;
};

// Whether LibTorch has oneDNN's linear (mkldnn::_linear_pointwise; not in a build without
// oneDNN).
bool onednn_gemm_available();

// Whether tcap::onednn_mm computes `s` in at most kOneDnnMargin of ATen's time on this
// machine at the current thread count: measured (a warm-up and the best of two runs of
// each, with inputs of s's sizes and strides) for the first product of its class (k, n,
// the operands' layouts, m rounded up to a power of two, the thread count), remembered
// for the process and used for the class's later products. `aten_ms` and `onednn_ms`
// (when given) receive the class's two times.
bool onednn_gemm_is_faster(const GemmShape& s, double* aten_ms = nullptr, double* onednn_ms = nullptr);
constexpr double kOneDnnMargin = 0.8;

// Note [ReLU inside the product]: whether oneDNN's product `s` with a ReLU as its post-op
// is no slower than its product followed by ATen's ReLU; measured and remembered as above
// (`apart_ms`, `inside_ms` receive the two times).
bool onednn_relu_inside_is_faster(const GemmShape& s, double* apart_ms = nullptr, double* inside_ms = nullptr);

}  // namespace tcap::runtime
