// cpu_llvm's loop planner (LLVM-free): coalescing, loop mode, vector width, unroll,
// passes and grain, as golden one-line plans for fixed targets.
#include "codegen/cpu_llvm/plan.h"
#include "kernel_builder.h"

#include <algorithm>

namespace tcap::test {
namespace {

#if TCAP_HAVE_LLVM

using codegen::cpu_llvm::KernelPlan;
using codegen::cpu_llvm::TargetInfo;

TargetInfo target(int bits) {
  TargetInfo t;
  t.triple = "x86_64-pc-linux-gnu";
  t.cpu = "test";
  t.vector_bits = bits;
  t.x86 = true;
  t.has_avx2 = bits >= 256;
  t.has_avx512f = bits >= 512;
  t.has_fma = bits >= 256;
  t.libmvec = true;
  return t;
}

std::string plan(const KernelBuilder& kb, int bits = 256) {
  return codegen::cpu_llvm::to_string(codegen::cpu_llvm::make_plan(kb.k, target(bits)));
}

KernelBuilder unary(std::vector<int64_t> sizes, std::vector<int64_t> in_strides, std::vector<int64_t> out_strides,
                    DType t = DType::F32) {
  KernelBuilder kb("plan", std::move(sizes));
  int32_t bx = kb.input(t), bo = kb.output(t);
  kb.store(kb.un(OpCode::Neg, kb.load(bx, std::move(in_strides))), bo, std::move(out_strides));
  return kb;
}

TEST(CpuPlan, PointwiseCoalescingAndWidth) {
  // Contiguous dims merge into one; size-1 dims drop out.
  EXPECT_EQ(plan(unary({64, 128}, {128, 1}, {128, 1})),
            "mode=pointwise vf=8 unroll=1 lane_dim=0 sizes=[8192] outer_dims=1 passes=0 grain=32768");
  EXPECT_EQ(plan(unary({1, 64, 1, 3}, {0, 3, 7, 1}, {192, 3, 3, 1})),
            "mode=pointwise vf=8 unroll=1 lane_dim=0 sizes=[192] outer_dims=1 passes=0 grain=32768");
  // A transposed input or a broadcast row keeps two dims.
  EXPECT_EQ(plan(unary({64, 128}, {1, 64}, {128, 1})),
            "mode=pointwise vf=8 unroll=1 lane_dim=1 sizes=[64, 128] outer_dims=2 passes=0 grain=32768");
  EXPECT_EQ(plan(unary({64, 128}, {0, 1}, {128, 1})),
            "mode=pointwise vf=8 unroll=1 lane_dim=1 sizes=[64, 128] outer_dims=2 passes=0 grain=32768");
  // Vector width by register and element size; too short rows stay scalar.
  EXPECT_EQ(plan(unary({1000}, {1}, {1}, DType::F64)),
            "mode=pointwise vf=4 unroll=1 lane_dim=0 sizes=[1000] outer_dims=1 passes=0 grain=32768");
  EXPECT_EQ(plan(unary({1000}, {1}, {1}), 512),
            "mode=pointwise vf=16 unroll=1 lane_dim=0 sizes=[1000] outer_dims=1 passes=0 grain=32768");
  EXPECT_EQ(plan(unary({1000}, {1}, {1}), 128),
            "mode=pointwise vf=4 unroll=1 lane_dim=0 sizes=[1000] outer_dims=1 passes=0 grain=32768");
  EXPECT_EQ(plan(unary({3}, {1}, {1})),
            "mode=pointwise vf=1 unroll=1 lane_dim=-1 sizes=[3] outer_dims=1 passes=0 grain=32768");
  EXPECT_EQ(plan(unary({}, {}, {})),
            "mode=pointwise vf=1 unroll=1 lane_dim=-1 sizes=[1] outer_dims=1 passes=0 grain=32768");
}

// Note [Streaming stores]: which stores stream. A vector store of at least
// PlanOptions::stream_bytes into a buffer the kernel does not read, on x86, with its sizes
// built in; a reduction's element-level stores too, not its per-row results.
TEST(CpuPlan, LargeStoresStream) {
  auto streams = [](const KernelPlan& p) { return std::count(p.stream.begin(), p.stream.end(), true); };
  const int64_t n = (int64_t{32} << 20) / 4;  // 32 MiB of f32
  EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(unary({n}, {1}, {1}).k, target(512))), 1);
  EXPECT_EQ(plan(unary({n}, {1}, {1}), 512),
            "mode=pointwise vf=16 unroll=1 lane_dim=0 sizes=[8388608] outer_dims=1 passes=0 grain=32768 streaming_stores=1");
  EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(unary({n - 1}, {1}, {1}).k, target(512))), 0);  // below
  EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(unary({n / 2}, {1}, {1}, DType::F64).k, target(256))), 1);
  EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(unary({n}, {1}, {1}, DType::BF16).k, target(512))), 0);  // 16 MiB
  // A transposed store (lanes along a strided dim: scatters) does not.
  EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(unary({4096, 2048}, {2048, 1}, {1, 4096}).k, target(512))), 0);
  // Not on other targets.
  TargetInfo arm = target(128);
  arm.x86 = false;
  EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(unary({n}, {1}, {1}).k, arm)), 0);
  // In place (the kernel reads the buffer it writes): the lines are in the cache already.
  {
    KernelBuilder kb("inplace", {n});
    int32_t bx = kb.output(DType::F32);
    kb.store(kb.un(OpCode::Neg, kb.load(bx, {1})), bx, {1});
    EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(kb.k, target(512))), 0);
  }
  // A softmax over [4096, 4096]: its output streams, its row sums (one per row) do not.
  {
    KernelBuilder kb("softmax", {4096, 4096}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32), bs = kb.output(DType::F32);
    int32_t lx = kb.load(bx, {4096, 1});
    int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, kb.reduce(OpCode::ReduceMax, lx)));
    int32_t s = kb.reduce(OpCode::ReduceSum, e);
    kb.store(kb.bin(OpCode::Div, e, s), bo, {4096, 1});
    kb.store(s, bs, {1, 0});
    const KernelPlan p = codegen::cpu_llvm::make_plan(kb.k, target(512));
    EXPECT_EQ(p.stream, (std::vector<bool>{true, false}));
  }
  // Code that reads its sizes at launch serves small sizes too: it stores normally.
  {
    const KernelBuilder kb = unary({n}, {1}, {1});
    const auto slots = codegen::cpu_llvm::number_slots(kb.k, codegen::cpu_llvm::make_plan(kb.k, target(512)));
    std::vector<bool> varying(static_cast<size_t>(slots.count), false);
    varying[0] = true;
    EXPECT_EQ(streams(codegen::cpu_llvm::make_plan(kb.k, target(512), {}, &varying)), 0);
  }
}

// Note [Prefetching the next row]: a ReduceInner kernel of several passes over rows that fit
// the cache, reading at least PlanOptions::prefetch_min_bytes in all.
TEST(CpuPlan, SeveralPassesOverRowsPrefetchTheNextRow) {
  auto softmax = [](int64_t rows, int64_t cols) {
    KernelBuilder kb("softmax", {rows, cols}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    int32_t lx = kb.load(bx, {cols, 1});
    int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, kb.reduce(OpCode::ReduceMax, lx)));
    kb.store(kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e)), bo, {cols, 1});
    return codegen::cpu_llvm::make_plan(kb.k, target(512));
  };
  EXPECT_TRUE(softmax(4096, 4096).prefetch_next_row);     // 64 MiB in rows of 16 KiB
  EXPECT_FALSE(softmax(511, 4096).prefetch_next_row);     // 8 MiB less a row: the caches hold it
  EXPECT_TRUE(softmax(512, 4096).prefetch_next_row);      // 8 MiB
  EXPECT_FALSE(softmax(16, 1 << 17).prefetch_next_row);   // rows of 512 KiB
  // One pass (a row sum) has nothing to overlap.
  KernelBuilder kb("rowsum", {4096, 4096}, 1);
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, {4096, 1})), bo, {1, 0});
  EXPECT_FALSE(codegen::cpu_llvm::make_plan(kb.k, target(512)).prefetch_next_row);
}

TEST(CpuPlan, ReductionModesAndPasses) {
  // softmax over rows: lanes on the reduce dim, 4 accumulators, 3 passes.
  {
    KernelBuilder kb("softmax", {512, 1000}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    int32_t lx = kb.load(bx, {1000, 1});
    int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, kb.reduce(OpCode::ReduceMax, lx)));
    kb.store(kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e)), bo, {1000, 1});
    EXPECT_EQ(plan(kb), "mode=reduce_inner vf=8 unroll=4 lane_dim=1 sizes=[512, 1000] outer_dims=1 passes=3 grain=32");
  }
  // Sum over dim 0 of a row-major [4096, 1024]: lanes on the outer dim.
  {
    KernelBuilder kb("colsum", {1024, 4096}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, {1, 1024})), bo, {1, 0});
    EXPECT_EQ(plan(kb), "mode=reduce_outer vf=8 unroll=4 lane_dim=0 sizes=[1024, 4096] outer_dims=1 passes=1 grain=8");
  }
  // Two contiguous reduce dims merge; outer dims of a [4, 6, 32, 32] tensor too.
  {
    KernelBuilder kb("sum23", {4, 6, 32, 32}, 2);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, {6144, 1024, 32, 1})), bo, {6, 1, 0, 0});
    EXPECT_EQ(plan(kb), "mode=reduce_inner vf=8 unroll=4 lane_dim=1 sizes=[24, 1024] outer_dims=1 passes=1 grain=32");
  }
  // Short rows and short columns: scalar.
  {
    KernelBuilder kb("tiny", {3, 5}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.reduce(OpCode::ReduceMax, kb.load(bx, {5, 1})), bo, {1, 0});
    EXPECT_EQ(plan(kb), "mode=reduce_inner vf=1 unroll=1 lane_dim=-1 sizes=[3, 5] outer_dims=1 passes=1 grain=6553");
  }
  // Only outer-level stores (a broadcast load): no pass at all.
  {
    KernelBuilder kb("no_pass", {16, 8}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.load(bx, {1, 0}), bo, {1, 0});
    EXPECT_EQ(plan(kb), "mode=reduce_inner vf=8 unroll=1 lane_dim=1 sizes=[16, 8] outer_dims=1 passes=0 grain=4096");
  }
}

#endif  // TCAP_HAVE_LLVM

}  // namespace
}  // namespace tcap::test
