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
// tcap::onednn_mm(a, b, bias, activation) = mkldnn::_linear_pointwise(a, b.t(), bias,
// activation): oneDNN reads the weight [n, k] through its strides, so neither operand is
// copied by tcap.
//
// Note [ReLU inside the product]
// oneDNN applies an activation to each output block while it is still in registers (a
// post-op), where a ReLU after the product is otherwise a kernel of its own that reads and
// writes the whole result again. So before fusion, the llvm backend gives a product that
// goes through oneDNN (measured as above) the ReLU that is the only reader of its result
// (also through a view and a bias add: a Linear over a 3-d input is mm, _unsafe_view and
// add_ of the bias), when oneDNN's product with
// the ReLU inside measures no slower than the product and then ATen's ReLU (another
// measurement per class). The values are the same bits (max(0, x) of the same product).
// The ReLU's result is what the backward saves (threshold_backward reads it), so this
// holds in training; an activation whose backward reads its input (GELU, SiLU) would need
// the product kept as well, and stays a kernel after the product.

namespace {

const c10::OperatorHandle* linear_pointwise() {
  static const c10::OperatorHandle* op = [] {
    auto h = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    return h ? new c10::OperatorHandle(*h) : nullptr;
  }();
  return op;
}

at::Tensor onednn_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     c10::string_view activation) {
  const c10::OperatorHandle* op = linear_pointwise();
  TORCH_CHECK(op, "tcap::onednn_mm: this LibTorch has no mkldnn::_linear_pointwise");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "tcap::onednn_mm: sizes ", a.sizes(), " and ",
              b.sizes(), " cannot be multiplied");
  TORCH_CHECK(activation == "none" || activation == "relu", "tcap::onednn_mm: activation '", activation,
              "' is not one of none, relu");
  std::vector<c10::IValue> stack{a, b.t(), bias ? c10::IValue(*bias) : c10::IValue(), c10::IValue(std::string(activation)),
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

namespace {

// What a measurement compares: ATen's product against oneDNN's, or oneDNN's product then a
// ReLU against oneDNN's product with the ReLU as its post-op.
enum class Compared : int { AtenOrOneDnn = 0, ReluApartOrInside = 1 };

struct Times {
  double first = 0, second = 0;
};

// The two times of s's class for `what`: measured for its first product (a warm-up and
// the best of two runs of each), remembered for the process.
Times measured(const GemmShape& s, Compared what) {
  using Key = std::tuple<int, int64_t, int64_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, bool, int>;
  static std::mutex mu;
  static std::map<Key, Times> seen;
  // Rows by their power-of-two class: a product whose rows vary with the batch or the
  // sequence (a dynamic entry's every new size) is measured once per class, not per size.
  int64_t rows = 1;
  while (rows < s.m) rows *= 2;
  const Key key{static_cast<int>(what), rows, s.k, s.n, stride_classes(s.a_strides), stride_classes(s.b_strides),
                s.bias, at::get_num_threads()};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = seen.find(key);
    if (it != seen.end()) return it->second;
  }
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
  const std::optional<at::Tensor> opt_bias = s.bias ? std::optional<at::Tensor>(bias) : std::nullopt;
  Times t;
  if (what == Compared::AtenOrOneDnn) {
    t.first = best_ms([&] { return s.bias ? at::addmm(bias, a, b) : at::mm(a, b); });
    t.second = best_ms([&] { return onednn_mm(a, b, opt_bias, "none"); });
  } else {
    t.first = best_ms([&] { return at::relu(onednn_mm(a, b, opt_bias, "none")); });
    t.second = best_ms([&] { return onednn_mm(a, b, opt_bias, "relu"); });
  }
  std::lock_guard<std::mutex> lock(mu);
  seen.emplace(key, t);
  return t;
}

}  // namespace

bool onednn_gemm_is_faster(const GemmShape& s, double* aten_ms, double* onednn_ms) {
  if (!onednn_gemm_available()) return false;
  const Times t = measured(s, Compared::AtenOrOneDnn);
  if (aten_ms) *aten_ms = t.first;
  if (onednn_ms) *onednn_ms = t.second;
  return t.second <= kOneDnnMargin * t.first;
}

bool onednn_relu_inside_is_faster(const GemmShape& s, double* apart_ms, double* inside_ms) {
  if (!onednn_gemm_available()) return false;
  const Times t = measured(s, Compared::ReluApartOrInside);
  if (apart_ms) *apart_ms = t.first;
  if (inside_ms) *inside_ms = t.second;
  return t.second <= t.first;
}

}  // namespace tcap::runtime

TORCH_LIBRARY_FRAGMENT(tcap, m) {
  m.def("onednn_mm(Tensor self, Tensor mat2, Tensor? bias, str activation=\"none\") -> Tensor");
}

TORCH_LIBRARY_IMPL(tcap, CompositeExplicitAutograd, m) {
  m.impl("onednn_mm", &tcap::runtime::onednn_mm);
}
