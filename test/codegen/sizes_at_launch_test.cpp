// Note [Sizes at launch] (codegen/cpu_llvm/cpu_llvm.h): a kernel structure met at a second
// set of numbers is compiled once more with those numbers read at launch, and that code
// serves every later size. Each case runs kernels of one structure at many sizes (odd,
// small, below and above a vector width, sizes that come back), each checked against
// ATen, and counts the code built.
#include "kernel_builder.h"

#include "codegen/cpu_llvm/testing.h"

#include <ATen/Parallel.h>

#include <gtest/gtest.h>

#include <array>
#include <functional>

namespace tcap::test {
namespace {

namespace cl = codegen::cpu_llvm;

// Code built (compiled, or loaded from the disk cache) since `before`.
int built_since(const cl::CpuLlvmStats& before) {
  const cl::CpuLlvmStats now = cl::cpu_llvm_stats();
  return (now.compiled - before.compiled) + (now.disk_hits - before.disk_hits);
}

// Runs ck over its range split in chunks of `grain` on the intra-op threads, as the
// runtime does.
void run_split(const cl::CpuKernel& ck, const std::vector<at::Tensor>& bufs, int64_t grain) {
  std::vector<void*> args = args_of(bufs);
  at::parallel_for(0, ck.range, grain, [&](int64_t b, int64_t e) { ck.run(args.data(), b, e); });
}

// y[b, h] = max(x[b, h] * x[b, h] + bias[h], 0) * 0.5 over b rows; x is read through its
// strides (transposed storage when `transposed`).
KernelBuilder bias_relu(int64_t b, int64_t h, const at::Tensor& x, const at::Tensor& bias) {
  KernelBuilder kb("bias_relu", {b, h});
  const int32_t bx = kb.input(DType::F32), bb = kb.input(DType::F32), by = kb.output(DType::F32);
  const int32_t lx = kb.load(bx, strides_of(x));
  const int32_t lb = kb.load(bb, {0, bias.stride(0)});
  const int32_t s = kb.bin(OpCode::Add, kb.bin(OpCode::Mul, lx, lx), lb);
  const int32_t r = kb.bin(OpCode::Max, s, kb.fconst(DType::F32, 0.0));
  kb.store(kb.bin(OpCode::Mul, r, kb.fconst(DType::F32, 0.5)), by, {h, 1});
  return kb;
}

TEST(SizesAtLaunch, PointwiseWithBroadcastServesEveryBatch) {
  for (const bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "x transposed" : "x contiguous");
    const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
    const int64_t h = 37;
    int served = 0;
    for (int64_t b : {5, 17, 64, 3, 100, 33, 17, 2, 9}) {
      SCOPED_TRACE("b=" + std::to_string(b));
      const at::Tensor x = transposed ? at::randn({h, b}).t() : at::randn({b, h});
      const at::Tensor bias = at::randn({h});
      const KernelBuilder kb = bias_relu(b, h, x, bias);
      auto ck = compile(kb);
      served += ck->numbers_at_launch > 0;
      at::Tensor y = at::empty({b, h});
      run_split(*ck, {x, bias, y}, 64);
      EXPECT_TRUE(close(y, at::relu(x * x + bias) * 0.5, 1e-6, 1e-6, kb.k));
    }
    // The first size's code, then one that reads the batch at launch for all others.
    EXPECT_EQ(built_since(before), 2);
    EXPECT_EQ(served, 8);
  }
}

// Per row r of x[r, n]: mean and variance over n (two passes; the mean's 1/n is a
// constant of the kernel, read at launch once n varies), and x - mean stored per element.
KernelBuilder row_stats(int64_t r, int64_t n) {
  KernelBuilder kb("row_stats", {r, n}, 1);
  const int32_t bx = kb.input(DType::F32), bm = kb.output(DType::F32), bv = kb.output(DType::F32),
                bc = kb.output(DType::F32);
  const int32_t lx = kb.load(bx, {n, 1});
  const int32_t inv = kb.fconst(DType::F32, 1.0 / static_cast<double>(n));
  const int32_t mean = kb.bin(OpCode::Mul, kb.reduce(OpCode::ReduceSum, lx), inv);
  const int32_t d = kb.bin(OpCode::Sub, lx, mean);
  const int32_t var = kb.bin(OpCode::Mul, kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, d, d)), inv);
  kb.store(mean, bm, {1, 0});
  kb.store(var, bv, {1, 0});
  kb.store(d, bc, {n, 1});
  return kb;
}

TEST(SizesAtLaunch, RowReductionsReadTheirLengthAndItsReciprocal) {
  const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
  for (int64_t r : {3, 10}) {
    for (int64_t n : {7, 64, 129, 5, 300, 1000, 8, 64}) {
      SCOPED_TRACE("r=" + std::to_string(r) + " n=" + std::to_string(n));
      const KernelBuilder kb = row_stats(r, n);
      auto ck = compile(kb);
      const at::Tensor x = at::randn({r, n}) + 3;
      at::Tensor mean = at::empty({r}), var = at::empty({r}), cen = at::empty({r, n});
      run_split(*ck, {x, mean, var, cen}, 1);
      const at::Tensor want_mean = x.mean(1);
      EXPECT_TRUE(close(mean, want_mean, 1e-5, 1e-5, kb.k));
      EXPECT_TRUE(close(var, x.var(1, /*unbiased=*/false), 1e-4, 1e-5, kb.k));
      EXPECT_TRUE(close(cen, x - want_mean.unsqueeze(1), 1e-5, 1e-5, kb.k));
    }
  }
  // The first code, then one that reads n, the row strides and 1/n at launch; then the row
  // count varies too (it had stayed 3): one more code reading both, which serves the rest.
  EXPECT_EQ(built_since(before), 3);
}

// Column sums of x[n, c] over its n rows (ReduceOuter: lanes along the columns).
KernelBuilder column_sum(int64_t n, int64_t c) {
  KernelBuilder kb("column_sum", {c, n}, 1);
  const int32_t bx = kb.input(DType::F64), by = kb.output(DType::F64);
  kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, {1, c})), by, {1, 0});
  return kb;
}

TEST(SizesAtLaunch, ColumnReductionsOverAVaryingNumberOfRows) {
  const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
  for (int64_t n : {1, 2, 31, 64, 7, 500}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const int64_t c = 19;
    const KernelBuilder kb = column_sum(n, c);
    auto ck = compile(kb);
    const at::Tensor x = at::randn({n, c}, at::kDouble);
    at::Tensor y = at::empty({c}, at::kDouble);
    run_split(*ck, {x, y}, 4);
    EXPECT_TRUE(close(y, x.sum(0), 1e-12, 1e-12, kb.k));
  }
  // n == 1 is a size-1 reduce dim, which coalesces away: a structure of its own.
  EXPECT_EQ(built_since(before), 3);
}

// out = x * k for an integer constant k: integer constants are built in, so each value is
// code of its own (correct, never shared).
TEST(SizesAtLaunch, IntegerConstantsStayBuiltIn) {
  const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
  for (int64_t k : {3, 5, 3}) {
    KernelBuilder kb("int_scale", {41});
    const int32_t bx = kb.input(DType::I64), by = kb.output(DType::I64);
    kb.store(kb.bin(OpCode::Mul, kb.load(bx, {1}), kb.iconst(DType::I64, k)), by, {1});
    auto ck = compile(kb);
    EXPECT_EQ(ck->numbers_at_launch, 0);
    const at::Tensor x = at::randint(-100, 100, {41}, at::kLong);
    at::Tensor y = at::empty({41}, at::kLong);
    run(*ck, {x, y});
    EXPECT_TRUE(same(y, x * k, kb.k));
  }
  EXPECT_EQ(built_since(before), 2);
}

// A constant that is a special exponent at the first size (pow(x, 2) is x * x) must not be
// taken as one by code that reads it at launch.
TEST(SizesAtLaunch, ExponentsReadAtLaunchAreNotSpecialCased) {
  for (double p : {2.0, 3.0, 0.5, 1.7, 2.0, -1.0}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    KernelBuilder kb("pow_by", {29});
    const int32_t bx = kb.input(DType::F32), by = kb.output(DType::F32);
    kb.store(kb.bin(OpCode::Pow, kb.load(bx, {1}), kb.fconst(DType::F32, p)), by, {1});
    auto ck = compile(kb);
    const at::Tensor x = at::rand({29}) + 0.5;
    at::Tensor y = at::empty({29});
    run(*ck, {x, y});
    EXPECT_TRUE(close(y, at::pow(x, p), 1e-5, 1e-6, kb.k));
  }
}

TEST(SizesAtLaunch, OffsetsAndStridesOfViewsAreRead) {
  // y = x[:, off : off + w] of a row-major [r, cols] x, for varying column windows.
  const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
  for (auto [r, cols, off, w] : std::vector<std::array<int64_t, 4>>{{4, 50, 3, 20}, {6, 80, 10, 33}, {5, 11, 1, 9},
                                                                      {4, 50, 3, 20}, {9, 300, 150, 101}}) {
    const at::Tensor x = at::randn({r, cols});
    const at::Tensor view = x.narrow(1, off, w);
    KernelBuilder kb("window_neg", {r, w});
    const int32_t bx = kb.input(DType::F32), by = kb.output(DType::F32);
    kb.store(kb.un(OpCode::Neg, kb.load(bx, strides_of(view), view.storage_offset())), by, {w, 1});
    auto ck = compile(kb);
    at::Tensor y = at::empty({r, w});
    run_split(*ck, {x, y}, 16);
    EXPECT_TRUE(same(y, -view, kb.k));
  }
  EXPECT_EQ(built_since(before), 2);
}

// Sums over the last dim of a permuted x[a, b, n] (stored [b, a, n]): two outer dims that do
// not merge, so each outer index is decomposed by sizes read at launch; and a rank-3
// pointwise kernel with a broadcast middle dim, split over threads mid-row.
TEST(SizesAtLaunch, SeveralOuterDimsDecomposedAtLaunch) {
  const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
  for (auto [a, b, n] : std::vector<std::array<int64_t, 3>>{{3, 4, 5}, {2, 7, 33}, {5, 3, 9}, {4, 4, 64}, {7, 2, 3}}) {
    SCOPED_TRACE("a=" + std::to_string(a) + " b=" + std::to_string(b) + " n=" + std::to_string(n));
    const at::Tensor x = at::randn({b, a, n}).permute({1, 0, 2});
    {
      KernelBuilder kb("perm_rowsum", {a, b, n}, 1);
      const int32_t bx = kb.input(DType::F32), by = kb.output(DType::F32);
      kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, strides_of(x))), by, {b, 1, 0});
      auto ck = compile(kb);
      at::Tensor y = at::empty({a, b});
      run_split(*ck, {x, y}, 1);
      EXPECT_TRUE(close(y, x.sum(2), 1e-5, 1e-5, kb.k));
    }
    {
      const at::Tensor mid = at::randn({b});
      KernelBuilder kb("perm_scale", {a, b, n});
      const int32_t bx = kb.input(DType::F32), bm = kb.input(DType::F32), by = kb.output(DType::F32);
      kb.store(kb.bin(OpCode::Mul, kb.load(bx, strides_of(x)), kb.load(bm, {0, 1, 0})), by, {b * n, n, 1});
      auto ck = compile(kb);
      at::Tensor y = at::empty({a, b, n});
      run_split(*ck, {x, mid, y}, 7);
      EXPECT_TRUE(same(y, x * mid.view({1, b, 1}), kb.k));
    }
  }
  // Each structure: its first code and one that reads its sizes at launch.
  EXPECT_EQ(built_since(before), 4);
}

// Other vector widths (scalar code, SSE-wide vectors): the plan's vector body and unroll
// for sizes that vary, the tails at sizes below a vector, a softmax's two passes.
TEST(SizesAtLaunch, EveryVectorWidth) {
  for (int bits : {32, 128, 256}) {
    SCOPED_TRACE("vector bits " + std::to_string(bits));
    cl::cpu_llvm_set_vector_bits_for_testing(bits);
    const cl::CpuLlvmStats before = cl::cpu_llvm_stats();
    for (int64_t n : {3, 40, 1, 17, 250, 8}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const int64_t r = 5;
      KernelBuilder kb("softmax_rows", {r, n}, 1);
      const int32_t bx = kb.input(DType::F32), by = kb.output(DType::F32);
      const int32_t lx = kb.load(bx, {n, 1});
      const int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, kb.reduce(OpCode::ReduceMax, lx)));
      kb.store(kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e)), by, {n, 1});
      auto ck = compile(kb);
      const at::Tensor x = at::randn({r, n});
      at::Tensor y = at::empty({r, n});
      run_split(*ck, {x, y}, 2);
      EXPECT_TRUE(close(y, x.softmax(1), 1e-5, 1e-6, kb.k));
    }
    // n == 1 coalesces away (a structure of its own); the others: two codes.
    EXPECT_EQ(built_since(before), 3);
  }
  cl::cpu_llvm_set_vector_bits_for_testing(0);
}

}  // namespace
}  // namespace tcap::test
