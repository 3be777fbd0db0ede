// cpu_llvm: reduction kernels (sum/max/min over the last, a non-last and two dims,
// multi-pass softmax, outer-level stores) against ATen.
#include "codegen/cpu_llvm/testing.h"
#include "kernel_builder.h"

#include <ATen/Parallel.h>

#include <limits>
#include <thread>

namespace tcap::test {
namespace {

#if TCAP_HAVE_LLVM


// Sums are reassociated (Note [CPU summation order]): compare with a tolerance that
// scales with sqrt(reduce size) ulps.
double sum_rtol(at::ScalarType st) { return st == at::kDouble ? 1e-12 : 2e-5; }

struct RowsCols {
  int64_t m, n;
};

class ReduceLastDim : public ::testing::TestWithParam<RowsCols> {};

// out[i] = reduce_j x[i, j] for sum, max, min, in f32 and f64, with a NaN row.
TEST_P(ReduceLastDim, SumMaxMin) {
  const auto [m, n] = GetParam();
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (at::ScalarType st : {at::kFloat, at::kDouble}) {
    const auto opts = at::TensorOptions().dtype(st);
    at::Tensor x = at::randn({m, n}, opts) + 0.5;
    if (m > 2) x[1][n / 2] = kNaN;  // max/min must propagate it, sum too
    const DType t = kir_dtype(st);
    KernelBuilder kb("reduce_last", {m, n}, 1);
    int32_t bx = kb.input(t), bs = kb.output(t), bmax = kb.output(t), bmin = kb.output(t);
    int32_t lx = kb.load(bx, {n, 1});
    kb.store(kb.reduce(OpCode::ReduceSum, lx), bs, {1, 0});
    kb.store(kb.reduce(OpCode::ReduceMax, lx), bmax, {1, 0});
    kb.store(kb.reduce(OpCode::ReduceMin, lx), bmin, {1, 0});
    auto ck = compile(kb);
    EXPECT_EQ(ck->range, m);
    at::Tensor s = at::empty({m}, opts), mx = at::empty({m}, opts), mn = at::empty({m}, opts);
    run(*ck, {x, s, mx, mn});
    EXPECT_TRUE(close(s, x.sum(1), sum_rtol(st), sum_rtol(st) * std::sqrt(double(n)), kb.k));
    EXPECT_TRUE(same(mx, std::get<0>(x.max(1)), kb.k));
    EXPECT_TRUE(same(mn, std::get<0>(x.min(1)), kb.k));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReduceLastDim,
                         ::testing::Values(RowsCols{1, 1}, RowsCols{3, 7}, RowsCols{37, 1023}, RowsCols{5, 4097},
                                           RowsCols{129, 64}, RowsCols{2, 100003}),
                         [](const auto& info) {
                           return std::to_string(info.param.m) + "x" + std::to_string(info.param.n);
                         });

// Sum over dim 0 of a row-major [m, n] matrix (domain [n, m]: lanes walk the outer dim),
// and a max over dim 1 of a transposed input (gathers).
TEST(CpuLlvmReduce, NonLastDim) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (auto [m, n] : std::vector<RowsCols>{{1023, 37}, {64, 4097}, {3, 5}, {1000, 8}}) {
    at::Tensor x = at::randn({m, n});
    KernelBuilder kb("reduce_dim0", {n, m}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32), bmax = kb.output(DType::F32);
    int32_t lx = kb.load(bx, strides_of(x, {1, 0}));
    kb.store(kb.reduce(OpCode::ReduceSum, lx), bo, {1, 0});
    kb.store(kb.reduce(OpCode::ReduceMax, lx), bmax, {1, 0});
    auto ck = compile(kb);
    at::Tensor out = at::empty({n}), mx = at::empty({n});
    run(*ck, {x, out, mx});
    EXPECT_TRUE(close(out, x.sum(0), 2e-5, 2e-5 * std::sqrt(double(m)), kb.k));
    EXPECT_TRUE(same(mx, std::get<0>(x.max(0)), kb.k));

    at::Tensor xt = at::randn({n, m}).t();  // [m, n] with strides [1, m]
    KernelBuilder kt("reduce_transposed", {m, n}, 1);
    int32_t tx = kt.input(DType::F32), to = kt.output(DType::F32);
    kt.store(kt.reduce(OpCode::ReduceMax, kt.load(tx, strides_of(xt))), to, {1, 0});
    auto ckt = compile(kt);
    at::Tensor out_t = at::empty({m});
    run(*ckt, {xt, out_t});
    EXPECT_TRUE(same(out_t, std::get<0>(xt.max(1)), kt.k));
  }
}

// x[a, b, c] reduced over (b, c) and over (a, c): two reduce dims, nested loops.
TEST(CpuLlvmReduce, TwoReduceDims) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t a = 7, b = 33, c = 65;
  at::Tensor x = at::randn({a, b, c}, at::kDouble);
  {
    KernelBuilder kb("reduce_bc", {a, b, c}, 2);
    int32_t bx = kb.input(DType::F64), bo = kb.output(DType::F64), bm = kb.output(DType::F64);
    int32_t lx = kb.load(bx, strides_of(x));
    kb.store(kb.reduce(OpCode::ReduceSum, lx), bo, {1, 0, 0});
    kb.store(kb.reduce(OpCode::ReduceMin, lx), bm, {1, 0, 0});
    auto ck = compile(kb);
    at::Tensor out = at::empty({a}, at::kDouble), mn = at::empty({a}, at::kDouble);
    run(*ck, {x, out, mn});
    EXPECT_TRUE(close(out, x.sum(at::IntArrayRef{1, 2}), 1e-12, 1e-12, kb.k));
    EXPECT_TRUE(same(mn, x.amin(at::IntArrayRef{1, 2}), kb.k));
  }
  {
    KernelBuilder kb("reduce_ac", {b, a, c}, 2);  // domain (b | a, c)
    int32_t bx = kb.input(DType::F64), bo = kb.output(DType::F64);
    kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, strides_of(x, {1, 0, 2}))), bo, {1, 0, 0});
    auto ck = compile(kb);
    at::Tensor out = at::empty({b}, at::kDouble);
    run(*ck, {x, out});
    EXPECT_TRUE(close(out, x.sum(at::IntArrayRef{0, 2}), 1e-12, 1e-12, kb.k));
  }
  {
    // A full reduction: no outer dims at all.
    KernelBuilder kb("reduce_all", {a, b, c}, 3);
    int32_t bx = kb.input(DType::F64), bo = kb.output(DType::F64);
    kb.store(kb.reduce(OpCode::ReduceMax, kb.load(bx, strides_of(x))), bo, {0, 0, 0});
    auto ck = compile(kb);
    EXPECT_EQ(ck->range, 1);
    at::Tensor out = at::empty({}, at::kDouble);
    run(*ck, {x, out});
    EXPECT_TRUE(same(out, x.max(), kb.k));
  }
}

// softmax(x) over the last dim: pass 0 max, pass 1 sum of exp(x - max), pass 2 stores
// exp(x - max) / sum. Also the log-sum-exp as an outer-level store.
TEST(CpuLlvmReduce, SoftmaxThreePasses) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (auto [m, n] : std::vector<RowsCols>{{64, 1000}, {7, 3}, {1, 4099}}) {
    for (at::ScalarType st : {at::kFloat, at::kBFloat16}) {
      at::Tensor x = (at::randn({m, n}) * 5).to(st);
      const DType t = kir_dtype(st);
      KernelBuilder kb("softmax", {m, n}, 1);
      int32_t bx = kb.input(t), bo = kb.output(t), bl = kb.output(DType::F32);
      int32_t lx = kb.cast(kb.load(bx, {n, 1}), DType::F32);
      int32_t mx = kb.reduce(OpCode::ReduceMax, lx);
      int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, mx));
      int32_t s = kb.reduce(OpCode::ReduceSum, e);
      kb.store(kb.cast(kb.bin(OpCode::Div, e, s), t), bo, {n, 1});
      kb.store(kb.bin(OpCode::Add, kb.un(OpCode::Log, s), mx), bl, {1, 0});
      const auto level = kir::reduce_level(kb.k);
      EXPECT_EQ(level[static_cast<size_t>(kb.k.stores[0].value)], 2);
      auto ck = compile(kb);
      at::Tensor out = at::empty({m, n}, x.options()), lse = at::empty({m});
      run(*ck, {x, out, lse});
      const double tol = st == at::kFloat ? 1e-5 : 8e-3;
      EXPECT_TRUE(close(out, at::softmax(x.to(at::kFloat), 1).to(st), tol, 1e-6, kb.k));
      EXPECT_TRUE(close(lse, at::logsumexp(x.to(at::kFloat), 1), 1e-5, 1e-5, kb.k));
    }
  }
}

// Element-level stores next to reductions, an outer-level load (bias per row) and an
// outer-level value derived from a Reduce (mean), stored after the last pass.
TEST(CpuLlvmReduce, OuterAndElementStores) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t m = 45, n = 777;
  at::Tensor x = at::randn({m, n}), bias = at::randn({m, 1});
  KernelBuilder kb("mixed_stores", {m, n}, 1);
  int32_t bx = kb.input(DType::F32), bb = kb.input(DType::F32);
  int32_t by = kb.output(DType::F32), bmean = kb.output(DType::F32), bc = kb.output(DType::F32);
  int32_t lx = kb.load(bx, {n, 1});
  int32_t lb = kb.load(bb, {1, 0});  // outer-level: zero reduce stride
  int32_t y = kb.bin(OpCode::Add, lx, lb);
  kb.store(y, by, {n, 1});
  int32_t mean = kb.bin(OpCode::Div, kb.reduce(OpCode::ReduceSum, y), kb.fconst(DType::F32, double(n)));
  kb.store(mean, bmean, {1, 0});
  int32_t centered = kb.bin(OpCode::Sub, y, mean);
  kb.store(kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Mul, centered, centered)), bc, {1, 0});
  auto ck = compile(kb);
  at::Tensor yo = at::empty({m, n}), mo = at::empty({m}), vo = at::empty({m});
  run(*ck, {x, bias, yo, mo, vo});
  at::Tensor yr = x + bias;
  EXPECT_TRUE(same(yo, yr, kb.k));
  EXPECT_TRUE(close(mo, yr.mean(1), 1e-5, 1e-6, kb.k));
  EXPECT_TRUE(close(vo, (yr - yr.mean(1, true)).pow(2).sum(1), 1e-4, 1e-4, kb.k));
}

// Broadcast stores (kir.h): outer-level values written at every domain point. One is
// computed from loads broadcast along the reduce dim (an expanded gradient times a
// per-row scale), one from a Reduce (each row's max, written across the row). Both loop
// modes: reduce along the contiguous dim (ReduceInner) and along the strided one
// (ReduceOuter, the reduce dim is the tensor's dim 0).
TEST(CpuLlvmReduce, BroadcastStores) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (bool columns : {false, true}) {
    SCOPED_TRACE(columns ? "reduce over dim 0" : "reduce over dim 1");
    const int64_t rows = 37, cols = 1029;
    // Domain [outer, reduce]; the tensors are [rows, cols] with rows or cols reduced.
    const int64_t outer = columns ? cols : rows, red = columns ? rows : cols;
    auto dom = [&](const at::Tensor& t) {  // strides of t in domain order
      return columns ? std::vector<int64_t>{t.stride(1), t.stride(0)} : std::vector<int64_t>{t.stride(0), t.stride(1)};
    };
    at::Tensor x = at::randn({rows, cols});
    at::Tensor scale = columns ? at::randn({1, cols}) : at::randn({rows, 1});
    KernelBuilder kb("broadcast_stores", {outer, red}, 1);
    int32_t bx = kb.input(DType::F32), bs = kb.input(DType::F32);
    int32_t bscaled = kb.output(DType::F32), bmax = kb.output(DType::F32), bsum = kb.output(DType::F32);
    int32_t ls = kb.load(bs, dom(scale.expand({rows, cols})));  // zero stride along the reduce dim
    int32_t scaled = kb.bin(OpCode::Mul, ls, kb.fconst(DType::F32, 0.5));
    at::Tensor scaled_out = at::empty({rows, cols}), max_out = at::empty({rows, cols}), sum_out = at::empty({outer});
    kb.store(scaled, bscaled, dom(scaled_out));
    int32_t lx = kb.load(bx, dom(x));
    int32_t mx = kb.reduce(OpCode::ReduceMax, kb.bin(OpCode::Mul, lx, scaled));
    kb.store(mx, bmax, dom(max_out));
    kb.store(kb.reduce(OpCode::ReduceSum, kb.bin(OpCode::Sub, lx, mx)), bsum, {1, 0});
    auto ck = compile(kb);
    run(*ck, {x, scale, scaled_out, max_out, sum_out});
    const int64_t rd = columns ? 0 : 1;
    at::Tensor want_scaled = (scale * 0.5).expand({rows, cols});
    at::Tensor want_max = std::get<0>((x * want_scaled).max(rd, /*keepdim=*/true)).expand({rows, cols});
    EXPECT_TRUE(same(scaled_out, want_scaled, kb.k));
    EXPECT_TRUE(same(max_out, want_max, kb.k));
    EXPECT_TRUE(close(sum_out, (x - want_max).sum(rd), 1e-4, 1e-3, kb.k));
  }
}

TEST(CpuLlvmReduce, IntegerBoolAndHalfReductions) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t m = 9, n = 1001;
  at::Tensor xi = at::randint(-1000, 1000, {m, n}, at::kLong);
  at::Tensor xb = at::rand({m, n}) > 0.999;
  at::Tensor xh = at::randn({m, n}).to(at::kBFloat16);
  KernelBuilder kb("int_bool_half", {m, n}, 1);
  int32_t bi = kb.input(DType::I64), bb = kb.input(DType::Bool), bh = kb.input(DType::BF16);
  int32_t bs = kb.output(DType::I64), bmx = kb.output(DType::I64), bany = kb.output(DType::Bool);
  int32_t ball = kb.output(DType::Bool), bhs = kb.output(DType::BF16);
  int32_t li = kb.load(bi, {n, 1}), lb = kb.load(bb, {n, 1}), lh = kb.load(bh, {n, 1});
  kb.store(kb.reduce(OpCode::ReduceSum, li), bs, {1, 0});
  kb.store(kb.reduce(OpCode::ReduceMax, li), bmx, {1, 0});
  kb.store(kb.reduce(OpCode::ReduceMax, lb), bany, {1, 0});
  kb.store(kb.reduce(OpCode::ReduceMin, kb.un(OpCode::Not, lb)), ball, {1, 0});
  kb.store(kb.reduce(OpCode::ReduceSum, lh), bhs, {1, 0});  // accumulates in f32
  auto ck = compile(kb);
  at::Tensor s = at::empty({m}, at::kLong), mx = at::empty({m}, at::kLong), any = at::empty({m}, at::kBool);
  at::Tensor all = at::empty({m}, at::kBool), hs = at::empty({m}, at::kBFloat16);
  run(*ck, {xi, xb, xh, s, mx, any, all, hs});
  EXPECT_TRUE(same(s, xi.sum(1), kb.k));
  EXPECT_TRUE(same(mx, std::get<0>(xi.max(1)), kb.k));
  EXPECT_TRUE(same(any, xb.any(1), kb.k));
  EXPECT_TRUE(same(all, xb.logical_not().all(1), kb.k));
  EXPECT_TRUE(close(hs, xh.sum(1), 8e-3, 0.05, kb.k));
}

// A reduce dim of size 0: sums are 0, nothing is loaded.
TEST(CpuLlvmReduce, EmptyReduceDim) {
  KernelBuilder kb("empty_reduce", {3, 0}, 1);
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  kb.store(kb.reduce(OpCode::ReduceSum, kb.load(bx, {0, 1})), bo, {1, 0});
  auto ck = compile(kb);
  at::Tensor out = at::full({3}, kNaN);
  void* args[2] = {nullptr, out.data_ptr()};
  ck->run(args, 0, ck->range);
  EXPECT_TRUE(same(out, at::zeros({3}), kb.k));
}

TEST(CpuLlvmReduce, ParallelSplits) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t m = 1001, n = 333;
  at::Tensor x = at::randn({m, n});
  for (bool transposed : {false, true}) {
    // transposed: reduce over dim 0 of x^T -> ReduceOuter plan
    at::Tensor in = transposed ? x.t().contiguous().t() : x;
    KernelBuilder kb(transposed ? "parallel_reduce_outer" : "parallel_reduce", {m, n}, 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    int32_t lx = kb.load(bx, strides_of(in));
    int32_t mx = kb.reduce(OpCode::ReduceMax, lx);
    kb.store(kb.reduce(OpCode::ReduceSum, kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, mx))), bo, {1, 0});
    auto ck = compile(kb);
    const at::Tensor ref = (x - std::get<0>(x.max(1, true))).exp().sum(1);
    at::Tensor out = at::full({m}, kNaN);
    std::vector<void*> args = args_of({in, out});
    const int64_t r = ck->range;
    std::thread t1([&] { ck->run(args.data(), 0, r / 2); });
    std::thread t2([&] { ck->run(args.data(), r / 2, r); });
    t1.join();
    t2.join();
    EXPECT_TRUE(close(out, ref, 1e-5, 1e-5, kb.k));
    const int saved = at::get_num_threads();
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      out.fill_(kNaN);
      at::parallel_for(0, r, ck->grain, [&](int64_t b, int64_t e) { ck->run(args.data(), b, e); });
      EXPECT_TRUE(close(out, ref, 1e-5, 1e-5, kb.k)) << threads << " threads";
    }
    at::set_num_threads(saved);
    EXPECT_EQ(ck->grain, 32768 / n);
  }
}

TEST(CpuLlvmReduce, NarrowVectorWidths) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (int bits : {128, 32}) {
    codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(bits);
    for (bool dim0 : {false, true}) {
      const int64_t m = 67, n = 1027;
      at::Tensor x = at::randn({m, n});
      KernelBuilder kb("narrow_softmax", dim0 ? std::vector<int64_t>{n, m} : std::vector<int64_t>{m, n}, 1);
      int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
      const std::vector<int64_t> xs = dim0 ? strides_of(x, {1, 0}) : strides_of(x);
      int32_t lx = kb.load(bx, xs);
      int32_t mx = kb.reduce(OpCode::ReduceMax, lx);
      int32_t e = kb.un(OpCode::Exp, kb.bin(OpCode::Sub, lx, mx));
      kb.store(kb.bin(OpCode::Div, e, kb.reduce(OpCode::ReduceSum, e)), bo, xs);
      auto ck = compile(kb);
      at::Tensor out = at::empty({m, n});
      run(*ck, {x, out});
      EXPECT_TRUE(close(out, at::softmax(x, dim0 ? 0 : 1), 1e-5, 1e-7, kb.k)) << bits << " bits";
    }
  }
  codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(0);
}

#endif  // TCAP_HAVE_LLVM

}  // namespace
}  // namespace tcap::test
