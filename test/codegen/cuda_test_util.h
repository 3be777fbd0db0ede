// What the cuda backend's tests share (cuda_render_test.cpp, cuda_emulator_test.cpp,
// cuda_compile_test.cpp, cuda_training_test.cpp): the skip macros that say why a test
// cannot run here, the dtype lists, and kernels built by hand that cover every op, dtype
// and reduction strategy of the renderer.
#pragma once

#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "kernel_builder.h"
#include "support/cuda_emu.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace tcap::test::cuda_kernels {

using kir::DType;
using kir::OpCode;
namespace cuda = tcap::codegen::cuda;
namespace cuda_emu = tcap::testing::cuda_emu;

#define SKIP_WITHOUT_NVRTC()                                                    \
  do {                                                                          \
    std::string why_;                                                           \
    if (!cuda::nvrtc_available(&why_)) GTEST_SKIP() << "no NVRTC here: " << why_; \
  } while (0)

#define SKIP_WITHOUT_CUDA_DEVICE()                                                          \
  do {                                                                                      \
    std::string why_;                                                                       \
    if (!cuda::cuda_available(&why_)) GTEST_SKIP() << "needs a CUDA device: " << why_;      \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device: LibTorch sees none"; \
  } while (0)

#define SKIP_WITHOUT_EMULATOR()                                                                  \
  do {                                                                                           \
    std::string why_;                                                                            \
    if (!cuda_emu::available(&why_)) GTEST_SKIP() << "no CUDA host emulation here: " << why_;    \
  } while (0)

inline const std::vector<DType> kFloats = {DType::F32, DType::F64, DType::F16, DType::BF16};
inline const std::vector<DType> kInts = {DType::U8, DType::I8, DType::I16, DType::I32, DType::I64};
inline const std::vector<DType> kAll = {DType::Bool, DType::U8, DType::I8, DType::I16, DType::I32,
                                 DType::I64,  DType::F16, DType::BF16, DType::F32, DType::F64};

inline DType compute(DType t) { return t == DType::F16 || t == DType::BF16 ? DType::F32 : t; }

// One pointwise kernel that uses every floating op on dtype t (computing in t itself, as
// kir allows, and in float for the 16-bit types), every comparison and every cast.
inline tcap::kir::Kernel every_float_op(DType t) {
  KernelBuilder kb(std::string("floats_") + tcap::kir::to_string(t), {5, 7});
  const int32_t ia = kb.input(t), ib = kb.input(t), out = kb.output(t), mask = kb.output(DType::Bool);
  const int32_t a = kb.load(ia, {7, 1}), b = kb.load(ib, {0, 1});
  int32_t acc = a;
  for (OpCode o : {OpCode::Neg, OpCode::Abs, OpCode::Exp, OpCode::Log, OpCode::Log1p, OpCode::Expm1, OpCode::Sin,
                   OpCode::Cos, OpCode::Tan, OpCode::Tanh, OpCode::Erf, OpCode::Sqrt, OpCode::Rsqrt, OpCode::Recip,
                   OpCode::Floor, OpCode::Ceil, OpCode::Round, OpCode::Trunc}) {
    acc = kb.bin(OpCode::Add, acc, kb.un(o, a));
  }
  for (OpCode o : {OpCode::Add, OpCode::Sub, OpCode::Mul, OpCode::Div, OpCode::Pow, OpCode::Max, OpCode::Min}) {
    acc = kb.bin(OpCode::Add, acc, kb.bin(o, a, b));
  }
  for (double p : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7}) acc = kb.bin(OpCode::Add, acc, kb.bin(OpCode::Pow, a, kb.fconst(t, p)));
  int32_t m = kb.un(OpCode::IsNan, acc);
  for (OpCode o : {OpCode::Lt, OpCode::Le, OpCode::Gt, OpCode::Ge, OpCode::Eq, OpCode::Ne}) {
    m = kb.bin(OpCode::Or, m, kb.bin(o, a, b));
  }
  m = kb.bin(OpCode::And, kb.un(OpCode::Not, m), kb.bin(OpCode::Lt, a, kb.fconst(t, 0.25)));
  acc = kb.where(m, acc, b);
  for (DType to : kAll) {
    if (to == t) continue;
    acc = kb.bin(OpCode::Add, acc, kb.cast(kb.cast(acc, to), t));
  }
  kb.store(acc, out, {7, 1});
  kb.store(m, mask, {7, 1});
  return kb.k;
}

inline tcap::kir::Kernel every_int_op(DType t) {
  KernelBuilder kb(std::string("ints_") + tcap::kir::to_string(t), {9, 4});
  const int32_t ia = kb.input(t), ib = kb.input(t), out = kb.output(t);
  const int32_t a = kb.load(ia, {1, 9}), b = kb.load(ib, {4, 1});
  int32_t acc = kb.un(OpCode::Abs, kb.un(OpCode::Neg, a));
  for (OpCode o : {OpCode::Add, OpCode::Sub, OpCode::Mul, OpCode::Div, OpCode::Max, OpCode::Min}) {
    acc = kb.bin(OpCode::Add, acc, kb.bin(o, a, b));
  }
  acc = kb.where(kb.bin(OpCode::Ge, a, kb.iconst(t, 3)), acc, kb.iconst(t, -1));
  for (DType to : kAll) {
    if (to != t) acc = kb.bin(OpCode::Sub, acc, kb.cast(kb.cast(acc, to), t));
  }
  kb.store(acc, out, {4, 1});
  return kb.k;
}

inline tcap::kir::Kernel bool_ops() {
  KernelBuilder kb("bools", {13});
  const int32_t ia = kb.input(DType::Bool), out = kb.output(DType::Bool), f = kb.output(DType::F32);
  const int32_t a = kb.load(ia, {1}), b = kb.load(ia, {0});
  int32_t x = kb.bin(OpCode::Add, a, b);
  x = kb.bin(OpCode::Mul, x, kb.un(OpCode::Not, b));
  x = kb.bin(OpCode::Max, x, kb.bin(OpCode::Min, a, b));
  x = kb.bin(OpCode::Ne, x, kb.bin(OpCode::Eq, a, b));
  kb.store(x, out, {1});
  kb.store(kb.cast(x, DType::F32), f, {1});
  return kb.k;
}

// Sum, max and min over rows of dtype t, accumulating in the compute dtype.
inline tcap::kir::Kernel reductions(DType t, std::vector<int64_t> sizes, int nr, std::vector<int64_t> strides) {
  KernelBuilder kb(std::string("reduce_") + tcap::kir::to_string(t), sizes, nr);
  const int32_t in = kb.input(t);
  const int32_t os = kb.output(t), omax = kb.output(t), omin = kb.output(t);
  const DType c = t == DType::Bool ? DType::Bool : compute(t);
  const int32_t x = kb.cast(kb.load(in, strides), c);
  std::vector<int64_t> ostr(sizes.size(), 0);
  int64_t s = 1;
  for (int d = static_cast<int>(sizes.size()) - nr - 1; d >= 0; --d) {
    ostr[static_cast<size_t>(d)] = s;
    s *= sizes[static_cast<size_t>(d)];
  }
  if (t != DType::Bool) kb.store(kb.cast(kb.reduce(OpCode::ReduceSum, x), t), os, ostr);
  kb.store(kb.cast(kb.reduce(OpCode::ReduceMax, x), t), omax, ostr);
  kb.store(kb.cast(kb.reduce(OpCode::ReduceMin, x), t), omin, ostr);
  if (t == DType::Bool) kb.k.buffers.erase(kb.k.buffers.begin() + 1);  // no sum output
  if (t == DType::Bool) {
    for (auto& st : kb.k.stores) --st.buffer;
  }
  return kb.k;
}

// softmax over the last dim of [rows, cols] (contiguous): three passes.
inline tcap::kir::Kernel softmax(DType t, int64_t rows, int64_t cols) {
  KernelBuilder kb("softmax", {rows, cols}, 1);
  const int32_t in = kb.input(t), out = kb.output(t);
  const int32_t x = kb.cast(kb.load(in, {cols, 1}), compute(t));
  const int32_t m = kb.reduce(OpCode::ReduceMax, x);
  const int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, x, m));
  const int32_t y = kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e));
  kb.store(kb.cast(y, t), out, {cols, 1});
  return kb.k;
}

// Softmax over dim 0 of [rows, cols] (contiguous): a column reduction with three passes.
inline tcap::kir::Kernel column_softmax(int64_t rows, int64_t cols) {
  KernelBuilder kb("column_softmax", {cols, rows}, 1);
  const int32_t in = kb.input(DType::F32), out = kb.output(DType::F32);
  const int32_t x = kb.load(in, {1, cols});
  const int32_t m = kb.reduce(OpCode::ReduceMax, x);
  const int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, x, m));
  const int32_t s = kb.reduce(OpCode::ReduceSum, e);
  kb.store(kb.bin(OpCode::Div, e, s), out, {1, cols});
  return kb.k;
}

// A bias gradient through a ReLU: the masked gradient stored per element, its column sums
// per column, and a per-column load in the epilogue (the sums scaled by a per-column value).
inline tcap::kir::Kernel bias_grad(DType t, int64_t rows, int64_t cols) {
  KernelBuilder kb(std::string("bias_grad_") + tcap::kir::to_string(t), {cols, rows}, 1);
  const int32_t grad = kb.input(t), act = kb.input(t), scale = kb.input(t);
  const int32_t masked = kb.output(t), sums = kb.output(t);
  const DType c = compute(t);
  const int32_t g = kb.cast(kb.load(grad, {1, cols}), c);
  const int32_t a = kb.cast(kb.load(act, {1, cols}), c);
  const int32_t zero = kb.fconst(c, 0.0);
  const int32_t m = kb.where(kb.bin(OpCode::Gt, a, zero), g, zero);
  kb.store(kb.cast(m, t), masked, {1, cols});
  const int32_t sum = kb.reduce(OpCode::ReduceSum, m);
  const int32_t s = kb.bin(OpCode::Mul, sum, kb.cast(kb.load(scale, {1, 0}), c));
  kb.store(kb.cast(s, t), sums, {1, 0});
  return kb.k;
}

// Layer norm's weight and bias gradients: column sums of g * (x - mean) * rstd and of g,
// with the per-row mean and rstd read with stride 0 along the columns.
inline tcap::kir::Kernel ln_param_grads(DType t, int64_t rows, int64_t cols) {
  KernelBuilder kb(std::string("ln_param_grads_") + tcap::kir::to_string(t), {cols, rows}, 1);
  const int32_t grad = kb.input(t), x = kb.input(t), mean = kb.input(DType::F32), rstd = kb.input(DType::F32);
  const int32_t wgrad = kb.output(t), bgrad = kb.output(t);
  const DType c = compute(t);
  const int32_t g = kb.cast(kb.load(grad, {1, cols}), c);
  const int32_t xv = kb.cast(kb.load(x, {1, cols}), c);
  const int32_t centred = kb.bin(OpCode::Sub, xv, kb.cast(kb.load(mean, {0, 1}), c));
  const int32_t xhat = kb.bin(OpCode::Mul, centred, kb.cast(kb.load(rstd, {0, 1}), c));
  const int32_t wsum = kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, g, xhat));
  kb.store(kb.cast(wsum, t), wgrad, {1, 0});
  kb.store(kb.cast(kb.reduce(OpCode::ReduceSum, g), t), bgrad, {1, 0});
  return kb.k;
}

// Every op of every dtype, one kernel per dtype: where the renderer's tests over ops start.
inline std::vector<tcap::kir::Kernel> every_op_kernels() {
  std::vector<tcap::kir::Kernel> kernels;
  for (DType t : kFloats) kernels.push_back(every_float_op(t));
  for (DType t : kInts) kernels.push_back(every_int_op(t));
  kernels.push_back(bool_ops());
  return kernels;
}

}  // namespace tcap::test::cuda_kernels
