// cpu_llvm's loop planner (LLVM-free): coalescing, loop mode, vector width, unroll,
// passes and grain, as golden one-line plans for fixed targets.
#include "codegen/cpu_llvm/plan.h"
#include "kernel_builder.h"

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
