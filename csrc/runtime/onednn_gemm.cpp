#include "runtime/onednn_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>

namespace tcap::runtime {

// Note [GEMMs through oneDNN]
// LibTorch's float32 mm and addmm on the CPU call MKL's sgemm. LibTorch also carries
// oneDNN, whose own JIT GEMMs it uses for bfloat16 and exposes for float32 through
// mkldnn::_linear_pointwise (what Inductor's CPU backend calls for a Linear). The two are
// not equally fast everywhere: on this project's AMD EPYC machine, MKL (2024.2) runs its
// AVX2 path and oneDNN its AVX-512 one, and the linear of mlp_big ([256, 1024] @ [1024,
// 4096]) takes 11.5 ms through mm and 4.4 ms through oneDNN (bench/RESULTS.md). So the
// llvm backend measures: a float32 mm or addmm (bias of one row, beta = alpha = 1) of at
// least kMinOneDnnMacs multiply-adds in a compiled CPU graph becomes tcap::onednn_mm when
// oneDNN takes at most kOneDnnMargin of ATen's time for its shape, strides and the thread
// count (fuse/onednn_gemms.cpp; measured once per process per class of shapes: k, n, the
// layouts and m rounded up to a power of two, so that a dynamic entry's new sizes are not
// each measured). The margin keeps a shape whose two times are close on ATen's side, so
// that which one runs does not depend on the noise of one measurement. Values: the same
// product summed in another order, within float32 rounding of ATen's (tests compare with
// tolerances scaled by k).
// tcap::onednn_mm(a, b, bias) = mkldnn::_linear_pointwise(a, b.t(), bias, "none"): oneDNN
// reads the weight [n, k] through its strides, so neither operand is copied by tcap.

namespace {

const c10::OperatorHandle* linear_pointwise() {
  static const c10::OperatorHandle* op = [] {
    auto h = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    return h ? new c10::OperatorHandle(*h) : nullptr;
  }();
  return op;
}

at::Tensor onednn_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias) {
  const c10::OperatorHandle* op = linear_pointwise();
  TORCH_CHECK(op, "tcap::onednn_mm: this LibTorch has no mkldnn::_linear_pointwise");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "tcap::onednn_mm: sizes ", a.sizes(), " and ",
              b.sizes(), " cannot be multiplied");
  std::vector<c10::IValue> stack{a, b.t(), bias ? c10::IValue(*bias) : c10::IValue(), c10::IValue(std::string("none")),
                                 c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
  op->callBoxed(&stack);
  return stack.at(0).toTensor();
}

using Clock = std::chrono::steady_clock;

// Which operand dims are contiguous (1), broadcast (0) or other (2): the layout, without
// the row strides that follow the sizes.
std::vector<int64_t> stride_classes(const std::vector<int64_t>& strides) {
  std::vector<int64_t> c;
  for (int64_t st : strides) c.push_back(st == 0 ? 0 : st == 1 ? 1 : 2);
  return c;
}

template <class F>
double best_ms(F&& f) {
  f();  // warm-up: oneDNN builds its primitive, MKL its buffers
  double best = 1e300;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

bool onednn_gemm_available() { return linear_pointwise() != nullptr; }

bool onednn_gemm_is_faster(const GemmShape& s, double* aten_ms, double* onednn_ms) {
  using Key = std::tuple<int64_t, int64_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, bool, int>;
  struct Times {
    double aten = 0, onednn = 0;
  };
  static std::mutex mu;
  static std::map<Key, Times> seen;
  // Rows by their power-of-two class: a product whose rows vary with the batch or the
  // sequence (a dynamic entry's every new size) is measured once per class, not per size.
  int64_t rows = 1;
  while (rows < s.m) rows *= 2;
  const Key key{rows, s.k, s.n, stride_classes(s.a_strides), stride_classes(s.b_strides), s.bias, at::get_num_threads()};
  Times t;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = seen.find(key);
    if (it != seen.end()) t = it->second;
  }
  if (t.aten == 0) {
    if (!onednn_gemm_available()) return false;
    // With the thread's dispatch keys as a fresh thread has them (a capture alive on this
    // thread records through a key it includes) and below autograd: nothing of the
    // measurement is recorded or differentiated.
    c10::impl::ForceDispatchKeyGuard clean(c10::default_included_set,
                                           c10::default_excluded_set | c10::autograd_dispatch_keyset);
    // An operand of the product's sizes and strides, over a storage that holds every
    // element those strides reach (a slice of a wider matrix reaches past rows * cols).
    auto operand = [](int64_t rows, int64_t cols, const std::vector<int64_t>& strides) {
      const int64_t reach = 1 + (rows - 1) * strides.at(0) + (cols - 1) * strides.at(1);
      return at::randn({reach}).as_strided({rows, cols}, strides);
    };
    const at::Tensor a = operand(s.m, s.k, s.a_strides), b = operand(s.k, s.n, s.b_strides);
    const at::Tensor bias = s.bias ? at::randn({s.n}) : at::Tensor();
    t.aten = best_ms([&] { return s.bias ? at::addmm(bias, a, b) : at::mm(a, b); });
    t.onednn = best_ms([&] { return onednn_mm(a, b, s.bias ? std::optional<at::Tensor>(bias) : std::nullopt); });
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace(key, t);
  }
  if (aten_ms) *aten_ms = t.aten;
  if (onednn_ms) *onednn_ms = t.onednn;
  return t.onednn <= kOneDnnMargin * t.aten;
}

}  // namespace tcap::runtime

TORCH_LIBRARY_FRAGMENT(tcap, m) {
  m.def("onednn_mm(Tensor self, Tensor mat2, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(tcap, CompositeExplicitAutograd, m) {
  m.impl("onednn_mm", &tcap::runtime::onednn_mm);
}
