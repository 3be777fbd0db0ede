// cpu_llvm: pointwise kernels built by hand, run on ATen tensors and compared with eager
// ATen (bit-identical where ATen computes the same correctly rounded operations).
#include "codegen/cpu_llvm/testing.h"
#include "kernel_builder.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <limits>
#include <sstream>
#include <thread>

namespace tcap::test {
namespace {

using codegen::cpu_llvm::CpuKernel;


#if !TCAP_HAVE_LLVM
TEST(CpuLlvm, UnavailableWithoutLlvm) {
  std::string why;
  EXPECT_FALSE(codegen::cpu_llvm::cpu_llvm_available(&why));
  EXPECT_NE(why.find("without LLVM"), std::string::npos) << why;
  KernelBuilder kb("k", {4});
  EXPECT_THROW(codegen::cpu_llvm::compile_cpu_kernel(kb.k), c10::Error);
}
#else

TEST(CpuLlvm, Available) {
  std::string why;
  ASSERT_TRUE(codegen::cpu_llvm::cpu_llvm_available(&why)) << why;
  const std::string desc = codegen::cpu_llvm::cpu_target_description();
  std::cout << "[ target   ] " << desc << "\n";
  EXPECT_NE(desc.find("vf32="), std::string::npos);
}

// out = x (op) y over a contiguous 1-D domain of n elements.
struct SizeDtype {
  int64_t n;
  at::ScalarType dtype;
};

class Pointwise : public ::testing::TestWithParam<SizeDtype> {};

TEST_P(Pointwise, BinaryOpsMatchAtenExactly) {
  const auto [n, st] = GetParam();
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const auto opts = at::TensorOptions().dtype(st);
  at::Tensor x = at::randn({n}, opts) * 10;
  at::Tensor y = at::randn({n}, opts) * 10;
  struct Case {
    OpCode op;
    at::Tensor ref;
  };
  const std::vector<Case> cases = {{OpCode::Add, x + y},           {OpCode::Sub, x - y},
                                   {OpCode::Mul, x * y},           {OpCode::Div, x / y},
                                   {OpCode::Max, at::maximum(x, y)}, {OpCode::Min, at::minimum(x, y)}};
  for (const Case& c : cases) {
    KernelBuilder kb(std::string("bin_") + kir::to_string(c.op), {n});
    const DType t = kir_dtype(st);
    int32_t bx = kb.input(t), by = kb.input(t), bo = kb.output(t);
    kb.store(kb.bin(c.op, kb.load(bx, {1}), kb.load(by, {1})), bo, {1});
    auto ck = compile(kb);
    at::Tensor out = at::empty({n}, opts);
    run(*ck, {x, y, out});
    EXPECT_TRUE(same(out, c.ref, kb.k));
  }
}

// Neg/Abs/Recip/Floor/Ceil/Round/Trunc are exact in both. Sqrt and Rsqrt are correctly
// rounded here, while ATen may use MKL VML's high-accuracy (< 1 ulp, not always correctly
// rounded) versions: those are checked against a double-precision reference for f32 and
// within an ulp of ATen for f64.
TEST_P(Pointwise, UnaryOpsMatchAten) {
  const auto [n, st] = GetParam();
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const auto opts = at::TensorOptions().dtype(st);
  const bool f64 = st == at::kDouble;
  at::Tensor x = at::randn({n}, opts) * 7;
  at::Tensor ax = x.abs() + 0.25;
  struct Case {
    OpCode op;
    const at::Tensor& in;
    at::Tensor ref;
    bool exact;
  };
  const at::Tensor axd = ax.to(at::kDouble);
  const std::vector<Case> cases = {
      {OpCode::Neg, x, -x, true},
      {OpCode::Abs, x, x.abs(), true},
      {OpCode::Sqrt, ax, f64 ? ax.sqrt() : axd.sqrt().to(st), !f64},
      {OpCode::Rsqrt, ax, f64 ? ax.rsqrt() : (1.0 / axd.sqrt().to(st).to(at::kDouble)).to(st), !f64},
      {OpCode::Recip, x, x.reciprocal(), true},
      {OpCode::Floor, x, x.floor(), true},
      {OpCode::Ceil, x, x.ceil(), true},
      {OpCode::Round, x, x.round(), true},
      {OpCode::Trunc, x, x.trunc(), true}};
  for (const Case& c : cases) {
    KernelBuilder kb(std::string("un_") + kir::to_string(c.op), {n});
    const DType t = kir_dtype(st);
    int32_t bx = kb.input(t), bo = kb.output(t);
    kb.store(kb.un(c.op, kb.load(bx, {1})), bo, {1});
    auto ck = compile(kb);
    at::Tensor out = at::empty({n}, opts);
    run(*ck, {c.in, out});
    if (c.exact) {
      EXPECT_TRUE(same(out, c.ref, kb.k));
    } else {
      EXPECT_TRUE(close(out, c.ref, 2.3e-16, 0, kb.k));
    }
  }
}

// (x * y + 1.5) / sqrt(|x| + 2): no contraction into FMAs; equal to eager up to the
// last ulp of ATen's sqrt (see UnaryOpsMatchAten).
TEST_P(Pointwise, FusedExpressionMatchesEager) {
  const auto [n, st] = GetParam();
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const auto opts = at::TensorOptions().dtype(st);
  at::Tensor x = at::randn({n}, opts), y = at::randn({n}, opts);
  const DType t = kir_dtype(st);
  KernelBuilder kb("fused", {n});
  int32_t bx = kb.input(t), by = kb.input(t), bo = kb.output(t);
  int32_t lx = kb.load(bx, {1}), ly = kb.load(by, {1});
  int32_t num = kb.bin(OpCode::Add, kb.bin(OpCode::Mul, lx, ly), kb.fconst(t, 1.5));
  int32_t den = kb.un(OpCode::Sqrt, kb.bin(OpCode::Add, kb.un(OpCode::Abs, lx), kb.fconst(t, 2.0)));
  kb.store(kb.bin(OpCode::Div, num, den), bo, {1});
  auto ck = compile(kb);
  at::Tensor out = at::empty({n}, opts);
  run(*ck, {x, y, out});
  const double eps = st == at::kDouble ? 2.3e-16 : 1.2e-7;
  EXPECT_TRUE(close(out, (x * y + 1.5) / (x.abs() + 2).sqrt(), 2 * eps, 0, kb.k));
}

INSTANTIATE_TEST_SUITE_P(Sizes, Pointwise,
                         ::testing::Values(SizeDtype{1, at::kFloat}, SizeDtype{3, at::kFloat},
                                           SizeDtype{1023, at::kFloat}, SizeDtype{4097, at::kFloat},
                                           SizeDtype{3, at::kDouble}, SizeDtype{1023, at::kDouble},
                                           SizeDtype{4097, at::kDouble}),
                         [](const auto& info) {
                           return std::string(info.param.dtype == at::kFloat ? "f32_" : "f64_") +
                                  std::to_string(info.param.n);
                         });

// Transposed (stride != 1), broadcast (stride 0) and offset loads, transposed stores.
TEST(CpuLlvmPointwise, StridedAndBroadcastAccesses) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (auto [m, n] : std::vector<std::pair<int64_t, int64_t>>{{37, 1023}, {5, 3}, {130, 17}}) {
    at::Tensor base = at::randn({n + 2, m});
    at::Tensor xt = base.slice(0, 1, n + 1).t();  // [m, n], strides [1, m], offset m elements
    at::Tensor row = at::randn({n});              // broadcast over rows
    at::Tensor col = at::randn({m, 1});           // broadcast over columns
    KernelBuilder kb("strided", {m, n});
    int32_t bx = kb.input(DType::F32), br = kb.input(DType::F32), bc = kb.input(DType::F32);
    int32_t bo = kb.output(DType::F32), bt = kb.output(DType::F32);
    int32_t v = kb.bin(OpCode::Mul, kb.bin(OpCode::Add, kb.load(bx, strides_of(xt)), kb.load(br, {0, 1})),
                       kb.load(bc, {1, 0}));
    kb.store(v, bo, {n, 1});
    at::Tensor out_t = at::empty({n, m});  // written transposed: strides [1, m] over the domain
    kb.store(v, bt, {1, m});
    auto ck = compile(kb);
    at::Tensor out = at::empty({m, n});
    run(*ck, {xt, row, col, out, out_t});
    at::Tensor ref = (xt + row) * col;
    EXPECT_TRUE(same(out, ref, kb.k));
    EXPECT_TRUE(same(out_t.t(), ref, kb.k));
  }
}

// Every pair of special values: max/min propagate NaN, comparisons are ordered except ne.
TEST(CpuLlvmPointwise, NanAndInfinityPropagation) {
  const std::vector<double> specials = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 2.5, 1e30, -3e-39};
  const int64_t n = static_cast<int64_t>(specials.size());
  for (at::ScalarType st : {at::kFloat, at::kDouble}) {
    at::Tensor v = at::tensor(specials, at::TensorOptions().dtype(at::kDouble)).to(st);
    const DType t = kir_dtype(st);
    at::Tensor a = v.view({n, 1}).expand({n, n}), b = v.view({1, n}).expand({n, n});
    struct Case {
      OpCode op;
      at::Tensor ref;
    };
    const std::vector<Case> cases = {
        {OpCode::Max, at::maximum(a, b)}, {OpCode::Min, at::minimum(a, b)}, {OpCode::Lt, a < b},
        {OpCode::Le, a <= b},             {OpCode::Gt, a > b},              {OpCode::Ge, a >= b},
        {OpCode::Eq, a == b},             {OpCode::Ne, a != b},             {OpCode::Add, a + b},
        {OpCode::Mul, a * b},             {OpCode::Div, a / b}};
    for (const Case& c : cases) {
      KernelBuilder kb(std::string("special_") + kir::to_string(c.op), {n, n});
      int32_t bv = kb.input(t);
      const bool cmp = kir::is_comparison(c.op);
      int32_t bo = kb.output(cmp ? DType::Bool : t);
      kb.store(kb.bin(c.op, kb.load(bv, {1, 0}), kb.load(bv, {0, 1})), bo, {n, 1});
      auto ck = compile(kb);
      at::Tensor out = at::empty({n, n}, at::TensorOptions().dtype(cmp ? at::kBool : st));
      run(*ck, {v, out});
      EXPECT_TRUE(same(out, c.ref, kb.k));
    }
    // where(isnan(a) | a > b, a, b), and exp/log on the specials
    KernelBuilder kb("special_where", {n, n});
    int32_t bv = kb.input(t), bo = kb.output(t), be = kb.output(t), bl = kb.output(t), bn = kb.output(DType::Bool);
    int32_t la = kb.load(bv, {1, 0}), lb = kb.load(bv, {0, 1});
    int32_t nan_a = kb.un(OpCode::IsNan, la);
    kb.store(kb.where(kb.bin(OpCode::Or, nan_a, kb.bin(OpCode::Gt, la, lb)), la, lb), bo, {n, 1});
    kb.store(kb.un(OpCode::Exp, la), be, {n, 1});
    kb.store(kb.un(OpCode::Log, la), bl, {n, 1});
    kb.store(kb.un(OpCode::Not, nan_a), bn, {n, 1});
    auto ck = compile(kb);
    const auto opts = at::TensorOptions().dtype(st);
    at::Tensor out = at::empty({n, n}, opts), e = at::empty({n, n}, opts), l = at::empty({n, n}, opts);
    at::Tensor notnan = at::empty({n, n}, at::kBool);
    run(*ck, {v, out, e, l, notnan});
    EXPECT_TRUE(same(out, at::where(a.isnan() | (a > b), a, b), kb.k));
    EXPECT_TRUE(close(e, a.exp(), 1e-6, 0, kb.k));
    EXPECT_TRUE(close(l, a.log(), 1e-6, 0, kb.k));
    EXPECT_TRUE(same(notnan, a.isnan().logical_not(), kb.k));
  }
}

// Casts between every pair that matters, on values where C++ defines the result.
TEST(CpuLlvmPointwise, CastsMatchAten) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t n = 1031;
  at::Tensor f = at::randn({n}) * 100;
  f[0] = -0.0;
  f[1] = 0.0;
  f[2] = 0.5;
  f[3] = -2.5;
  at::Tensor special = at::tensor({kNaN, kInf, -kInf, 0.0, -0.0, 1e-40, 3.3895313892515355e38, 1.00390625,
                                   1.01171875, -1.00390625},
                                  at::kDouble);
  struct Case {
    at::Tensor in;
    at::ScalarType to;
  };
  const std::vector<Case> cases = {
      {f, at::kInt},
      {f, at::kLong},
      {f.clamp(-128, 127), at::kChar},
      {f.clamp(-300, 300), at::kByte},
      {f, at::kDouble},
      {f.to(at::kDouble), at::kFloat},
      {f, at::kBool},
      {special.to(at::kFloat), at::kBool},
      {special.to(at::kFloat), at::kBFloat16},
      {special.to(at::kFloat), at::kHalf},
      {special, at::kBFloat16},
      {f, at::kBFloat16},
      {f.to(at::kBFloat16), at::kFloat},
      {f.to(at::kBFloat16), at::kDouble},
      {f, at::kHalf},
      {f.to(at::kHalf), at::kFloat},
      {f.to(at::kInt), at::kFloat},
      {f.to(at::kInt), at::kChar},
      {f.to(at::kLong) * 1000003, at::kInt},
      {f.to(at::kInt), at::kBFloat16},
      {f.clamp(0, 255).to(at::kByte), at::kInt},
      {f.clamp(0, 255).to(at::kByte), at::kFloat},
      {f.clamp(-128, 127).to(at::kChar), at::kLong},
      {f > 0, at::kFloat},
      {f > 0, at::kInt},
      {f.to(at::kInt), at::kBool},
  };
  for (const Case& c : cases) {
    const int64_t len = c.in.numel();
    KernelBuilder kb(std::string("cast_") + std::string(c10::toString(c.in.scalar_type())) + "_" + c10::toString(c.to),
                     {len});
    int32_t bi = kb.input(kir_dtype(c.in.scalar_type())), bo = kb.output(kir_dtype(c.to));
    kb.store(kb.cast(kb.load(bi, {1}), kir_dtype(c.to)), bo, {1});
    auto ck = compile(kb);
    at::Tensor out = at::empty({len}, at::TensorOptions().dtype(c.to));
    run(*ck, {c.in.contiguous(), out});
    EXPECT_TRUE(same(out, c.in.to(c.to), kb.k));
  }
}

// Bool values (i1 in registers, one byte in memory) through comparisons, logic and where.
TEST(CpuLlvmPointwise, BoolLoadsAndStores) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (int64_t n : {1, 7, 1029}) {
    at::Tensor x = at::randn({n}), y = at::randn({n});
    at::Tensor m = at::rand({n}) > 0.5;
    KernelBuilder kb("bools", {n});
    int32_t bx = kb.input(DType::F32), by = kb.input(DType::F32), bm = kb.input(DType::Bool);
    int32_t bo = kb.output(DType::Bool), bw = kb.output(DType::F32);
    int32_t lx = kb.load(bx, {1}), ly = kb.load(by, {1}), lm = kb.load(bm, {1});
    int32_t c = kb.bin(OpCode::And, kb.bin(OpCode::Lt, lx, ly), kb.un(OpCode::Not, lm));
    kb.store(kb.bin(OpCode::Or, c, kb.bin(OpCode::Eq, lm, kb.iconst(DType::Bool, 1))), bo, {1});
    kb.store(kb.where(lm, lx, ly), bw, {1});
    auto ck = compile(kb);
    at::Tensor out = at::empty({n}, at::kBool), w = at::empty({n});
    run(*ck, {x, y, m, out, w});
    EXPECT_TRUE(same(out, ((x < y) & m.logical_not()) | m, kb.k));
    EXPECT_TRUE(same(w, at::where(m, x, y), kb.k));
    // Stored bytes are exactly 0 or 1.
    EXPECT_TRUE(out.view(at::kByte).le(1).all().item<bool>());
  }
}

TEST(CpuLlvmPointwise, IntegerOps) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t n = 1027;
  for (at::ScalarType st : {at::kInt, at::kLong, at::kByte, at::kShort}) {
    const auto opts = at::TensorOptions().dtype(st);
    const bool u8 = st == at::kByte;
    at::Tensor x = at::randint(u8 ? 0 : -1000, u8 ? 256 : 1000, {n}, opts);
    at::Tensor y = at::randint(1, u8 ? 256 : 1000, {n}, opts);
    if (!u8) y = y * ((at::rand({n}) > 0.5).to(st) * 2 - 1);
    struct Case {
      OpCode op;
      at::Tensor ref;
    };
    std::vector<Case> cases = {{OpCode::Add, x + y},
                               {OpCode::Sub, x - y},
                               {OpCode::Mul, x * y},
                               {OpCode::Div, at::div(x, y, "trunc")},
                               {OpCode::Max, at::maximum(x, y)},
                               {OpCode::Min, at::minimum(x, y)},
                               {OpCode::Lt, x < y},
                               {OpCode::Ge, x >= y},
                               {OpCode::Ne, x != y}};
    for (const Case& c : cases) {
      KernelBuilder kb(std::string("int_") + kir::to_string(c.op), {n});
      const DType t = kir_dtype(st);
      int32_t bx = kb.input(t), by = kb.input(t), bo = kb.output(kir_dtype(c.ref.scalar_type()));
      kb.store(kb.bin(c.op, kb.load(bx, {1}), kb.load(by, {1})), bo, {1});
      auto ck = compile(kb);
      at::Tensor out = at::empty({n}, c.ref.options());
      run(*ck, {x, y, out});
      EXPECT_TRUE(same(out, c.ref, kb.k));
    }
    if (!u8) {
      KernelBuilder kb("int_abs_neg", {n});
      const DType t = kir_dtype(st);
      int32_t bx = kb.input(t), ba = kb.output(t), bn = kb.output(t);
      int32_t lx = kb.load(bx, {1});
      kb.store(kb.un(OpCode::Abs, lx), ba, {1});
      kb.store(kb.un(OpCode::Neg, lx), bn, {1});
      auto ck = compile(kb);
      at::Tensor a = at::empty({n}, opts), ng = at::empty({n}, opts);
      run(*ck, {x, a, ng});
      EXPECT_TRUE(same(a, x.abs(), kb.k));
      EXPECT_TRUE(same(ng, -x, kb.k));
    }
  }
  // Division by zero and INT_MIN / -1 do not trap (ATen raises; kernels give 0 / wrap).
  KernelBuilder kb("int_div_edge", {4});
  int32_t bx = kb.input(DType::I32), by = kb.input(DType::I32), bo = kb.output(DType::I32);
  kb.store(kb.bin(OpCode::Div, kb.load(bx, {1}), kb.load(by, {1})), bo, {1});
  auto ck = compile(kb);
  at::Tensor x = at::tensor({7, std::numeric_limits<int32_t>::min(), -7, 0}, at::kInt);
  at::Tensor y = at::tensor({0, -1, 2, 0}, at::kInt);
  at::Tensor out = at::empty({4}, at::kInt);
  run(*ck, {x, y, out});
  EXPECT_TRUE(same(out, at::tensor({0, std::numeric_limits<int32_t>::min(), -3, 0}, at::kInt), kb.k));
}

// BF16/F16 storage with F32 arithmetic (what the lowering emits), and arithmetic directly
// in the half types (widened to f32 and rounded back per op, as ATen does).
TEST(CpuLlvmPointwise, HalfTypes) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (at::ScalarType st : {at::kBFloat16, at::kHalf}) {
    for (int64_t n : {3, 1023, 4097}) {
      const auto opts = at::TensorOptions().dtype(st);
      at::Tensor x = (at::randn({n}) * 4).to(st), y = (at::randn({n}) * 4).to(st);
      const DType t = kir_dtype(st);
      KernelBuilder kb("half_types", {n});
      int32_t bx = kb.input(t), by = kb.input(t), bs = kb.output(t), be = kb.output(t), bd = kb.output(t);
      int32_t lx = kb.load(bx, {1}), ly = kb.load(by, {1});
      int32_t fx = kb.cast(lx, DType::F32), fy = kb.cast(ly, DType::F32);
      kb.store(kb.cast(kb.bin(OpCode::Add, fx, fy), t), bs, {1});
      kb.store(kb.cast(kb.un(OpCode::Exp, fx), t), be, {1});
      kb.store(kb.bin(OpCode::Mul, kb.bin(OpCode::Add, lx, ly), lx), bd, {1});
      auto ck = compile(kb);
      at::Tensor s = at::empty({n}, opts), e = at::empty({n}, opts), d = at::empty({n}, opts);
      run(*ck, {x, y, s, e, d});
      EXPECT_TRUE(same(s, x + y, kb.k));
      EXPECT_TRUE(same(d, (x + y) * x, kb.k));
      // exp: tcap's inline exp and ATen's Sleef may differ by an f32 ulp, i.e. one half-type ulp after rounding.
      EXPECT_TRUE(close(e, x.exp(), st == at::kBFloat16 ? 8e-3 : 1e-3, 0, kb.k));
    }
  }
}

TEST(CpuLlvmPointwise, TinyAndEmptyKernels) {
  // A rank-0 kernel: one element.
  {
    KernelBuilder kb("scalar", {});
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.bin(OpCode::Add, kb.bin(OpCode::Mul, kb.load(bx, {}), kb.fconst(DType::F32, 2)),
                    kb.fconst(DType::F32, 1)),
             bo, {});
    auto ck = compile(kb);
    EXPECT_EQ(ck->range, 1);
    at::Tensor x = at::randn({}), out = at::empty({});
    run(*ck, {x, out});
    EXPECT_TRUE(same(out, x * 2 + 1, kb.k));
  }
  // A one-element 1-D kernel.
  {
    KernelBuilder kb("one", {1});
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.un(OpCode::Exp, kb.load(bx, {1})), bo, {1});
    auto ck = compile(kb);
    at::Tensor x = at::randn({1}), out = at::empty({1});
    run(*ck, {x, out});
    EXPECT_TRUE(close(out, x.exp(), 1e-6, 0, kb.k));
  }
  // Zero elements: nothing is read or written (null pointers are fine).
  for (auto sizes : std::vector<std::vector<int64_t>>{{0}, {5, 0}, {0, 7}}) {
    KernelBuilder kb("empty", sizes);
    std::vector<int64_t> strides(sizes.size(), 1);
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.un(OpCode::Neg, kb.load(bx, strides)), bo, strides);
    auto ck = compile(kb);
    EXPECT_EQ(ck->range, 0);
    void* args[2] = {nullptr, nullptr};
    ck->run(args, 0, ck->range);
  }
}

TEST(CpuLlvmPointwise, UnsupportedKernelsGiveClearErrors) {
  {
    KernelBuilder kb("int_pow_kernel", {8});
    int32_t bx = kb.input(DType::I32), bo = kb.output(DType::I32);
    int32_t lx = kb.load(bx, {1});
    kb.store(kb.bin(OpCode::Pow, lx, lx), bo, {1});
    try {
      codegen::cpu_llvm::compile_cpu_kernel(kb.k);
      ADD_FAILURE() << "integer pow compiled";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("int_pow_kernel"), std::string::npos) << msg;
      EXPECT_NE(msg.find("integer pow"), std::string::npos) << msg;
    }
  }
  {
    KernelBuilder kb("bad_strides", {8, 8});
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.load(bx, {1}), bo, {8, 1});
    try {
      codegen::cpu_llvm::compile_cpu_kernel(kb.k);
      ADD_FAILURE() << "malformed kernel compiled";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("one stride per domain dim"), std::string::npos);
    }
  }
}

// Disjoint ranges on two threads, and through at::parallel_for with 1 and 2 threads.
TEST(CpuLlvmPointwise, ParallelSplits) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t m = 301, n = 333;  // rows of 333: splits fall inside rows
  at::Tensor x = at::randn({m, n}), b = at::randn({n});
  KernelBuilder kb("parallel_pointwise", {m, n});
  int32_t bx = kb.input(DType::F32), bb = kb.input(DType::F32), bo = kb.output(DType::F32);
  kb.store(kb.un(OpCode::Tanh, kb.bin(OpCode::Add, kb.load(bx, {n, 1}), kb.load(bb, {0, 1}))), bo, {n, 1});
  auto ck = compile(kb);
  const at::Tensor ref = (x + b).tanh();
  at::Tensor out = at::full({m, n}, kNaN);
  std::vector<void*> args = args_of({x, b, out});
  const int64_t r = ck->range;
  std::thread t1([&] { ck->run(args.data(), 0, r / 2); });
  std::thread t2([&] { ck->run(args.data(), r / 2, r); });
  t1.join();
  t2.join();
  EXPECT_TRUE(close(out, ref, 1e-5, 1e-6, kb.k));
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    out.fill_(kNaN);
    at::parallel_for(0, r, 1000, [&](int64_t begin, int64_t end) { ck->run(args.data(), begin, end); });
    EXPECT_TRUE(close(out, ref, 1e-5, 1e-6, kb.k)) << threads << " threads";
  }
  at::set_num_threads(saved);
  EXPECT_GE(ck->grain, 1024);
}

// The SSE (128-bit) and fully scalar (32-bit "vectors") renderings compute the same.
TEST(CpuLlvmPointwise, NarrowVectorWidths) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  for (int bits : {128, 32}) {
    codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(bits);
    for (at::ScalarType st : {at::kFloat, at::kDouble}) {
      const int64_t n = 1029;
      at::Tensor x = at::randn({n}, at::TensorOptions().dtype(st));
      KernelBuilder kb("narrow", {n});
      const DType t = kir_dtype(st);
      int32_t bx = kb.input(t), bo = kb.output(t), bc = kb.output(DType::Bool);
      int32_t lx = kb.load(bx, {1});
      kb.store(kb.bin(OpCode::Max, kb.un(OpCode::Exp, lx), kb.un(OpCode::Sin, lx)), bo, {1});
      kb.store(kb.bin(OpCode::Gt, lx, kb.fconst(t, 0.1)), bc, {1});
      auto ck = compile(kb);
      at::Tensor out = at::empty({n}, x.options()), c = at::empty({n}, at::kBool);
      run(*ck, {x, out, c});
      EXPECT_TRUE(close(out, at::maximum(x.exp(), x.sin()), 1e-6, 1e-7, kb.k)) << bits << " bits";
      EXPECT_TRUE(same(c, x > 0.1, kb.k)) << bits << " bits";
    }
  }
  codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(0);
}

// The IR shows the explicit vectors and libmvec calls (AVX-512 rendered as IR only).
TEST(CpuLlvmPointwise, LlvmIrShowsVectorMath) {
  KernelBuilder kb("ir_log", {4096});
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  kb.store(kb.un(OpCode::Log, kb.load(bx, {1})), bo, {1});
  const std::string desc = codegen::cpu_llvm::cpu_target_description();
  const std::string ir = codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k);
  EXPECT_NE(ir.find("define void @tcap_k_"), std::string::npos) << ir;
  if (desc.find("+avx512f") != std::string::npos) {
    EXPECT_NE(ir.find("_ZGVeN16v_logf"), std::string::npos) << ir;
  } else if (desc.find("+avx2") != std::string::npos) {
    EXPECT_NE(ir.find("_ZGVdN8v_logf"), std::string::npos) << ir;
    EXPECT_NE(ir.find("<8 x float>"), std::string::npos) << ir;
  }
  codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(512);
  const std::string ir512 = codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k);
  codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(0);
  EXPECT_NE(ir512.find("_ZGVeN16v_logf"), std::string::npos) << ir512;
  EXPECT_NE(ir512.find("\"min-legal-vector-width\"=\"512\""), std::string::npos) << ir512;
  codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(128);
  const std::string ir128 = codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k);
  codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(0);
  EXPECT_NE(ir128.find("_ZGVbN4v_logf"), std::string::npos) << ir128;
}

// f32 exp is inline on FMA targets (Note [CPU exp and erf]): no library call, and a
// branch for vectors with a lane beyond +-87 (or NaN).
TEST(CpuLlvmPointwise, ExpF32IsInline) {
  KernelBuilder kb("ir_exp", {4096});
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  kb.store(kb.un(OpCode::Exp, kb.load(bx, {1})), bo, {1});
  if (codegen::cpu_llvm::cpu_target_description().find("+fma") == std::string::npos) GTEST_SKIP() << "no FMA on this CPU";
  const std::string ir = codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k);
  EXPECT_EQ(ir.find("expf"), std::string::npos) << ir;
  EXPECT_NE(ir.find("exp.range"), std::string::npos) << ir;
}

// f32 sin and cos are inline (Note [CPU sin and cos]); the library is only called for
// lanes beyond the fast range, and the sin of a cos, whose argument lies in [-1, 1], needs
// neither a range test nor a reduction. sin(x) and cos(x) of one x share their reduction.
TEST(CpuLlvmPointwise, SinOfCosNeedsNoRangeCheck) {
  const int64_t n = 4099;
  KernelBuilder kb("sin_cos", {n});
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32), bp = kb.output(DType::F32);
  int32_t x = kb.load(bx, {1});
  int32_t c = kb.un(OpCode::Cos, x);
  kb.store(kb.un(OpCode::Sin, c), bo, {1});
  kb.store(kb.bin(OpCode::Mul, kb.un(OpCode::Sin, x), c), bp, {1});
  const std::string ir = codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k);
  auto count = [&](const std::string& s, bool at_start) {  // lines containing (or starting with) s
    size_t k = 0;
    std::istringstream lines(ir);
    for (std::string line; std::getline(lines, line);) k += at_start ? line.rfind(s, 0) == 0 : line.find(s) != std::string::npos;
    return k;
  };
  if (codegen::cpu_llvm::cpu_target_description().find("+fma") != std::string::npos) {
    // The vector body and the scalar tail: one library branch each for cos(x) and for
    // sin(x), none for sin(cos(x)); one reduction (a multiply by 2/pi) per x.
    EXPECT_EQ(count("cos.large", true), 2u) << ir;  // block labels
    EXPECT_EQ(count("sin.large", true), 2u) << ir;
    EXPECT_EQ(count("0x3FE45F3060000000", false), 2u) << ir;  // 2/pi: x's reduction, body and tail
  }
  at::manual_seed(fresh_seed());
  at::Tensor in = (at::rand({n}) - 0.5) * 100;
  in[0] = 3e5;  // one lane beyond the fast range
  at::Tensor out = at::empty({n}), prod = at::empty({n});
  run(*compile(kb), {in, out, prod});
  EXPECT_TRUE(close(out, in.cos().sin(), 3e-7, 1e-7, kb.k));
  EXPECT_TRUE(close(prod, in.sin() * in.cos(), 3e-7, 1e-7, kb.k));
}

#endif  // TCAP_HAVE_LLVM

}  // namespace
}  // namespace tcap::test
