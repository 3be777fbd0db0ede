// Kernels larger than the caches (codegen/cpu_llvm/render.cpp).
// Note [Streaming stores]: kernels that write at least PlanOptions::stream_bytes stream
// their vector stores where aligned. Their results are compared bitwise with the same
// computation in ATen (negation and a pointwise product are exact) over layouts where every
// vector is aligned, none is (a base pointer 4 bytes off) and some are (rows of odd
// length), with the range split at odd points over threads, and a softmax's rows against
// eager's.
// Note [Prefetching the next row]: row kernels of several passes prefetch the next row in
// their second pass; a softmax and a layer norm with a broadcast weight (not prefetched:
// every row reads the same) against eager, at one and two threads.
#include "codegen/cpu_llvm/jit.h"
#include "codegen/cpu_llvm/plan.h"
#include "kernel_builder.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <thread>

namespace tcap::test {
namespace {

#if TCAP_HAVE_LLVM

// 2^23 + 2^21 floats (40 MiB): beyond PlanOptions::stream_bytes.
constexpr int64_t kElements = (int64_t{1} << 23) + (int64_t{1} << 21);

codegen::cpu_llvm::KernelPlan host_plan_of(const KernelBuilder& kb) {
  return codegen::cpu_llvm::make_plan(kb.k, codegen::cpu_llvm::CpuJit::get(nullptr)->target());
}
bool has_streaming_store(const KernelBuilder& kb) {
  const auto p = host_plan_of(kb);
  return std::count(p.stream.begin(), p.stream.end(), true) > 0;
}

// Runs ck over [0, range) as `pieces` calls split at odd points, on two threads.
void run_in_odd_pieces(const codegen::cpu_llvm::CpuKernel& ck, const std::vector<at::Tensor>& bufs, int64_t pieces) {
  std::vector<void*> args = args_of(bufs);
  const int64_t r = ck.range;
  std::vector<int64_t> cut{0};
  for (int64_t i = 1; i < pieces; ++i) cut.push_back(r * i / pieces + 3);
  cut.push_back(r);
  std::vector<std::thread> threads;
  for (int half = 0; half < 2; ++half) {
    threads.emplace_back([&, half] {
      for (size_t i = static_cast<size_t>(half); i + 1 < cut.size(); i += 2) ck.run(args.data(), cut[i], cut[i + 1]);
    });
  }
  for (auto& t : threads) t.join();
}

// Runs ck over its range with at::parallel_for at one and two threads, `out` filled with
// NaN before each, and compares `out` with `ref`.
void expect_at_one_and_two_threads(const codegen::cpu_llvm::CpuKernel& ck, const std::vector<at::Tensor>& bufs,
                                   at::Tensor out, const at::Tensor& ref, double rtol, double atol, const kir::Kernel& k) {
  std::vector<void*> args = args_of(bufs);
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    out.fill_(kNaN);
    at::parallel_for(0, ck.range, ck.grain, [&](int64_t b, int64_t end) { ck.run(args.data(), b, end); });
    EXPECT_TRUE(close(out, ref, rtol, atol, k)) << threads << " threads";
  }
  at::set_num_threads(saved);
}

TEST(StreamingStores, PointwiseResultsAreExactInEveryAlignment) {
  if (!codegen::cpu_llvm::cpu_llvm_available()) GTEST_SKIP() << "LLVM backend not available";
  const at::Tensor x = at::randn({kElements + 16}), w = at::randn({kElements + 16});
  struct Layout {
    const char* name;
    std::vector<int64_t> sizes;
    int64_t offset;  // elements of the output's base pointer past a 64-byte boundary
  };
  for (const Layout& l : {Layout{"aligned", {kElements}, 0}, Layout{"base_off_by_4_bytes", {kElements}, 1},
                          Layout{"rows_of_odd_length", {kElements / 2049, 2049}, 0}}) {
    SCOPED_TRACE(l.name);
    int64_t n = 1;
    for (int64_t s : l.sizes) n *= s;
    const int64_t cols = l.sizes.back();
    KernelBuilder kb("stream_mul", l.sizes);
    const int32_t bx = kb.input(DType::F32), bw = kb.input(DType::F32), bo = kb.output(DType::F32);
    std::vector<int64_t> st = l.sizes.size() == 1 ? std::vector<int64_t>{1} : std::vector<int64_t>{cols, 1};
    kb.store(kb.un(OpCode::Neg, kb.bin(OpCode::Mul, kb.load(bx, st), kb.load(bw, st))), bo, st);
    ASSERT_TRUE(has_streaming_store(kb)) << codegen::cpu_llvm::to_string(host_plan_of(kb));
    const std::string ir = codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k);
    EXPECT_NE(ir.find("!nontemporal"), std::string::npos);
    EXPECT_NE(ir.find("llvm.x86.sse.sfence"), std::string::npos);
    auto ck = compile(kb);
    const at::Tensor xs = x.narrow(0, 0, n), ws = w.narrow(0, 0, n);
    // The output inside a larger buffer, `offset` elements past its (64-byte aligned) start.
    at::Tensor buf = at::full({n + 16}, kNaN);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(buf.data_ptr()) % 64, 0u);
    at::Tensor out = buf.narrow(0, l.offset, n);
    run_in_odd_pieces(*ck, {xs, ws, out}, 7);
    EXPECT_TRUE(at::equal(out, -(xs * ws)));
    // The memory around the output is untouched.
    EXPECT_TRUE(buf.narrow(0, 0, l.offset).isnan().all().item<bool>());
    EXPECT_TRUE(buf.narrow(0, l.offset + n, 16 - l.offset).isnan().all().item<bool>());
  }
}

// A row kernel whose last pass streams (a softmax over [2560, 4096]: 40 MiB), at the
// thread counts of at::parallel_for, against eager.
TEST(StreamingStores, SoftmaxRowsMatchEager) {
  if (!codegen::cpu_llvm::cpu_llvm_available()) GTEST_SKIP() << "LLVM backend not available";
  const int64_t rows = 2560, cols = 4096;
  KernelBuilder kb("stream_softmax", {rows, cols}, 1);
  const int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  const int32_t lx = kb.load(bx, {cols, 1});
  const int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, kb.reduce(OpCode::ReduceMax, lx)));
  kb.store(kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e)), bo, {cols, 1});
  ASSERT_TRUE(has_streaming_store(kb));
  ASSERT_TRUE(host_plan_of(kb).prefetch_next_row);
  EXPECT_NE(codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k).find("llvm.prefetch"), std::string::npos);
  auto ck = compile(kb);
  const at::Tensor x = at::randn({rows, cols}) * 4;
  const at::Tensor ref = at::softmax(x, 1);
  at::Tensor out = at::full({rows, cols}, kNaN);
  expect_at_one_and_two_threads(*ck, {x, out}, out, ref, 1e-5, 1e-7, kb.k);
}

// (x - mean) * rstd * w over rows of 3000 (not a multiple of a vector: each row's second
// pass ends in a scalar tail, and the next row starts mid-vector) with w broadcast.
TEST(PrefetchNextRow, LayerNormRowsMatchEager) {
  if (!codegen::cpu_llvm::cpu_llvm_available()) GTEST_SKIP() << "LLVM backend not available";
  const int64_t rows = 1000, cols = 3000;
  KernelBuilder kb("prefetch_norm", {rows, cols}, 1);
  const int32_t bx = kb.input(DType::F32), bw = kb.input(DType::F32), bo = kb.output(DType::F32);
  const int32_t lx = kb.load(bx, {cols, 1}), lw = kb.load(bw, {0, 1});
  const int32_t n = kb.fconst(DType::F32, static_cast<double>(cols));
  const int32_t d = kb.bin(OpCode::Sub, lx, kb.bin(OpCode::Div, kb.reduce(OpCode::ReduceSum, lx), n));
  const int32_t var = kb.bin(OpCode::Div, kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, d, d)), n);
  const int32_t rstd = kb.un(OpCode::Rsqrt, kb.bin(OpCode::Add, var, kb.fconst(DType::F32, 1e-5)));
  kb.store(kb.bin(OpCode::Mul, kb.bin(OpCode::Mul, d, rstd), lw), bo, {cols, 1});
  ASSERT_TRUE(host_plan_of(kb).prefetch_next_row);
  auto ck = compile(kb);
  const at::Tensor x = at::randn({rows, cols}) * 3 + 1, w = at::randn({cols});
  const at::Tensor ref = at::layer_norm(x, {cols}, w, {}, 1e-5);
  at::Tensor out = at::full({rows, cols}, kNaN);
  expect_at_one_and_two_threads(*ck, {x, w, out}, out, ref, 1e-4, 1e-4, kb.k);
}

#endif

}  // namespace
}  // namespace tcap::test
