// cpu_llvm: accuracy of the vectorised transcendentals (glibc libmvec, Note [CPU math
// library]) measured in ulps against a long-double reference on fresh random inputs,
// including large arguments, overflow/underflow edges and NaN-producing domains.
#include "codegen/cpu_llvm/testing.h"
#include "kernel_builder.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <iomanip>
#include <limits>
#include <random>

namespace tcap::test {
namespace {

#if TCAP_HAVE_LLVM

// glibc documents its vector math functions as accurate to 4 ulp.
constexpr double kMaxUlp = 4.0;

// |out - ref| in units of the last place of ref rounded to T; 0 when both are the same
// NaN/infinity, +inf when the classification differs.
template <typename T>
double ulp_error(T out, long double ref) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (std::isnan(ref)) return std::isnan(out) ? 0 : inf;
  if (std::isnan(out)) return inf;
  const T r = static_cast<T>(ref);
  const T a = std::fabs(r);
  if (std::isinf(r)) return out == r ? 0 : (std::fabs(out) == std::numeric_limits<T>::max() ? 1 : inf);
  if (std::isinf(out)) return inf;
  const T ulp = a == std::numeric_limits<T>::max() ? a - std::nextafter(a, T(0))
                                                   : std::nextafter(a, std::numeric_limits<T>::infinity()) - a;
  return static_cast<double>(std::fabs(static_cast<long double>(out) - ref) / static_cast<long double>(ulp));
}

struct MathCase {
  OpCode op;
  long double (*ref)(long double, long double);
  // Input generator: returns x (and y for pow) from uniform u in [0, 1).
  double (*gen_x)(std::mt19937_64&, bool f64);
  double (*gen_y)(std::mt19937_64&, bool f64);
};

double uniform(std::mt19937_64& g, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g); }
// sign * 10^U(lo_exp, hi_exp)
double log_uniform(std::mt19937_64& g, double lo_exp, double hi_exp, bool allow_negative) {
  const double m = std::pow(10.0, uniform(g, lo_exp, hi_exp));
  return allow_negative && uniform(g, 0, 1) < 0.5 ? -m : m;
}
bool coin(std::mt19937_64& g, double p) { return uniform(g, 0, 1) < p; }

const std::vector<MathCase>& cases() {
  static const std::vector<MathCase> c = {
      {OpCode::Exp, [](long double x, long double) { return std::exp(x); },
       [](std::mt19937_64& g, bool f64) { return f64 ? uniform(g, -746, 710) : uniform(g, -104, 89); }, nullptr},
      {OpCode::Log, [](long double x, long double) { return std::log(x); },
       [](std::mt19937_64& g, bool f64) {
         return coin(g, 0.02) ? -uniform(g, 0, 10) : log_uniform(g, f64 ? -307 : -37, f64 ? 307 : 38, false);
       },
       nullptr},
      {OpCode::Log1p, [](long double x, long double) { return std::log1p(x); },
       [](std::mt19937_64& g, bool f64) {
         return coin(g, 0.5) ? uniform(g, -0.999, 4) : log_uniform(g, -12, f64 ? 300 : 37, false);
       },
       nullptr},
      {OpCode::Expm1, [](long double x, long double) { return std::expm1(x); },
       [](std::mt19937_64& g, bool f64) {
         return coin(g, 0.5) ? uniform(g, -40, f64 ? 709 : 88) : log_uniform(g, -12, 0, true);
       },
       nullptr},
      {OpCode::Sin, [](long double x, long double) { return std::sin(x); },
       [](std::mt19937_64& g, bool) { return coin(g, 0.5) ? uniform(g, -10, 10) : log_uniform(g, -8, 20, true); },
       nullptr},
      {OpCode::Cos, [](long double x, long double) { return std::cos(x); },
       [](std::mt19937_64& g, bool) { return coin(g, 0.5) ? uniform(g, -10, 10) : log_uniform(g, -8, 20, true); },
       nullptr},
      {OpCode::Tan, [](long double x, long double) { return std::tan(x); },
       [](std::mt19937_64& g, bool) { return coin(g, 0.5) ? uniform(g, -10, 10) : log_uniform(g, -8, 20, true); },
       nullptr},
      {OpCode::Tanh, [](long double x, long double) { return std::tanh(x); },
       [](std::mt19937_64& g, bool) { return coin(g, 0.7) ? uniform(g, -20, 20) : log_uniform(g, -12, 0, true); },
       nullptr},
      {OpCode::Erf, [](long double x, long double) { return std::erf(x); },
       [](std::mt19937_64& g, bool) { return coin(g, 0.7) ? uniform(g, -6, 6) : log_uniform(g, -12, 0, true); },
       nullptr},
      {OpCode::Pow, [](long double x, long double y) { return std::pow(x, y); },
       [](std::mt19937_64& g, bool) {
         return coin(g, 0.05) ? -std::round(uniform(g, 1, 5)) : log_uniform(g, -3, 3, false);
       },
       [](std::mt19937_64& g, bool) { return coin(g, 0.1) ? std::round(uniform(g, -5, 5)) : uniform(g, -12, 12); }},
  };
  return c;
}

// One kernel per (op, dtype) over n elements; returns the worst ulp error and its input.
template <typename T>
void check_math(const MathCase& c, uint64_t seed) {
  constexpr bool f64 = std::is_same_v<T, double>;
  const at::ScalarType st = f64 ? at::kDouble : at::kFloat;
  const int64_t n = 100003;  // odd: the scalar tail calls libm
  std::mt19937_64 g(seed);
  at::Tensor x = at::empty({n}, at::TensorOptions().dtype(st));
  at::Tensor y = at::empty({n}, at::TensorOptions().dtype(st));
  T* xp = x.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  for (int64_t i = 0; i < n; ++i) {
    xp[i] = static_cast<T>(c.gen_x(g, f64));
    yp[i] = c.gen_y ? static_cast<T>(c.gen_y(g, f64)) : T(0);
  }
  xp[0] = std::numeric_limits<T>::quiet_NaN();
  xp[1] = std::numeric_limits<T>::infinity();
  xp[2] = -std::numeric_limits<T>::infinity();
  xp[3] = T(0);
  KernelBuilder kb(std::string("ulp_") + kir::to_string(c.op), {n});
  const DType t = f64 ? DType::F64 : DType::F32;
  int32_t bx = kb.input(t), by = kb.input(t), bo = kb.output(t);
  int32_t lx = kb.load(bx, {1});
  kb.store(c.gen_y ? kb.bin(c.op, lx, kb.load(by, {1})) : kb.un(c.op, lx), bo, {1});
  auto ck = compile(kb);
  at::Tensor out = at::empty({n}, x.options());
  run(*ck, {x, y, out});
  const T* op = out.data_ptr<T>();
  double worst = 0;
  int64_t at_i = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = ulp_error<T>(op[i], c.ref(xp[i], yp[i]));
    if (e > worst) {
      worst = e;
      at_i = i;
    }
  }
  std::cout << "[ ulp      ] " << std::setw(6) << kir::to_string(c.op) << (f64 ? ".f64" : ".f32") << " max "
            << std::setprecision(3) << worst << " ulp\n";
  EXPECT_LE(worst, kMaxUlp) << kir::to_string(c.op) << (f64 ? ".f64" : ".f32") << " at x = "
                            << std::setprecision(17) << xp[at_i] << (c.gen_y ? ", y = " + std::to_string(yp[at_i]) : "")
                            << ": got " << op[at_i] << ", want " << static_cast<double>(c.ref(xp[at_i], yp[at_i]));
}

TEST(CpuLlvmMath, TranscendentalsWithinFourUlpF32) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const MathCase& c : cases()) check_math<float>(c, seed);
}

TEST(CpuLlvmMath, TranscendentalsWithinFourUlpF64) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const MathCase& c : cases()) check_math<double>(c, seed);
}

// f32 sin and cos are inline code of our own (Note [CPU sin and cos]): at most 1.6 ulp
// on |x| <= 2^18, the library's 4 ulp beyond, the same bits in vector lanes and in the
// scalar tail, and the zero, NaN and infinity cases of eager.
constexpr double kSinCosMaxUlp = 1.6;
constexpr float kSinCosFastLimit = 262144.0f;

// clamped: sin/cos of clamp(x, -1, 1), which takes the short polynomial of arguments
// known to lie in [-1, 1] (`bounds` in ops.cpp).
std::shared_ptr<const codegen::cpu_llvm::CpuKernel> sin_cos_kernel(OpCode op, int64_t n, bool clamped = false) {
  KernelBuilder kb(op == OpCode::Sin ? "sin_f32" : "cos_f32", {n});
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  int32_t x = kb.load(bx, {1});
  if (clamped) {
    x = kb.bin(OpCode::Min, kb.bin(OpCode::Max, x, kb.fconst(DType::F32, -1.0)), kb.fconst(DType::F32, 1.0));
  }
  kb.store(kb.un(op, x), bo, {1});
  if (clamped && codegen::cpu_llvm::cpu_target_description().find("+fma") != std::string::npos) {
    EXPECT_EQ(codegen::cpu_llvm::cpu_kernel_llvm_ir(kb.k).find(".large"), std::string::npos) << "no range test expected";
  }
  return compile(kb);
}

// Worst ulp error of a sin or cos kernel's `out` over x (split at the fast limit); prints
// and checks it.
void check_sin_cos(OpCode op, const at::Tensor& x, const at::Tensor& out, const std::string& what) {
  const float* xp = x.data_ptr<float>();
  const float* op_ = out.data_ptr<float>();
  double worst[2] = {0, 0};
  int64_t at_i[2] = {0, 0};
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xd = xp[i];
    const double e = ulp_error<float>(op_[i], op == OpCode::Sin ? std::sin(static_cast<long double>(xd))
                                                                : std::cos(static_cast<long double>(xd)));
    const int big = std::fabs(xp[i]) > kSinCosFastLimit ? 1 : 0;
    if (e > worst[big]) {
      worst[big] = e;
      at_i[big] = i;
    }
  }
  std::cout << "[ ulp      ] " << kir::to_string(op) << ".f32 " << what << ": max " << std::setprecision(3) << worst[0]
            << " ulp for |x| <= 2^18, " << worst[1] << " beyond\n";
  EXPECT_LE(worst[0], kSinCosMaxUlp) << what << " at x = " << std::setprecision(9) << xp[at_i[0]] << ": got "
                                     << op_[at_i[0]];
  EXPECT_LE(worst[1], kMaxUlp) << what << " at x = " << std::setprecision(9) << xp[at_i[1]] << ": got "
                               << op_[at_i[1]];
}

// Runs a sin/cos kernel on x whose elements 0, 1 and the last are +0, -0 and -0 (the
// last one in the scalar tail) and checks eager's zeros, sign included.
at::Tensor run_with_eager_zeros(const codegen::cpu_llvm::CpuKernel& ck, OpCode op, const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
  run(ck, {x, out});
  const at::Tensor ref = op == OpCode::Sin ? x.sin() : x.cos();
  for (int64_t i : {int64_t{0}, int64_t{1}, x.numel() - 1}) {
    EXPECT_EQ(std::signbit(out[i].item<float>()), std::signbit(ref[i].item<float>())) << "x = " << x[i].item<float>();
    EXPECT_EQ(out[i].item<float>(), ref[i].item<float>()) << "x = " << x[i].item<float>();
  }
  return out;
}

TEST(CpuLlvmMath, SinCosF32OwnCodeWithinOnePointSixUlp) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 g(seed);
  std::vector<float> v;
  // Uniform over the fast range and over small arguments.
  for (int i = 0; i < 200000; ++i) v.push_back(static_cast<float>(uniform(g, -kSinCosFastLimit, kSinCosFastLimit)));
  for (int i = 0; i < 100000; ++i) v.push_back(static_cast<float>(uniform(g, -8, 8)));
  for (int i = 0; i < 50000; ++i) v.push_back(static_cast<float>(log_uniform(g, -40, 5.4, true)));
  // The hard cases of the reduction: floats next to multiples of pi/2.
  for (int i = 0; i < 50000; ++i) {
    const double k = std::round(uniform(g, -166886, 166886));  // |k pi/2| <= 2^18
    float f = static_cast<float>(k * M_PI / 2);
    for (int d = std::uniform_int_distribution<int>(0, 3)(g); d > 0; --d) f = std::nextafter(f, coin(g, 0.5) ? 1e9f : -1e9f);
    v.push_back(f);
  }
  // Around the fast limit, so that vectors mix fast and library lanes; and far beyond.
  float below = kSinCosFastLimit, above = kSinCosFastLimit;
  for (int i = 0; i < 64; ++i) {
    v.push_back(below = std::nextafter(below, 0.f));
    v.push_back(-(above = std::nextafter(above, 1e9f)));
  }
  for (int i = 0; i < 20000; ++i) v.push_back(static_cast<float>(log_uniform(g, 5.5, 38, true)));
  std::shuffle(v.begin(), v.end(), g);
  const float specials[] = {0.f, -0.f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  v.insert(v.begin(), std::begin(specials), std::end(specials));
  v.push_back(-0.f);  // in the scalar tail too (the length is odd)
  if (v.size() % 8 == 0) v.push_back(1.f);
  at::Tensor x = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kFloat).clone();
  for (OpCode op : {OpCode::Sin, OpCode::Cos}) {
    auto ck = sin_cos_kernel(op, x.numel());
    const at::Tensor out = run_with_eager_zeros(*ck, op, x);
    check_sin_cos(op, x, out, "sampled");
    for (int64_t i = 7; i <= 9; ++i) EXPECT_TRUE(std::isnan(out[i].item<float>())) << "x = " << x[i].item<float>();
    // Vector lanes and the scalar tail compute the same bits: shift the data by five so
    // every element of the tail lands in a vector (and back).
    const int64_t n = x.numel();
    at::Tensor shifted = at::roll(x, 5);
    at::Tensor out_shifted = at::empty_like(x);
    run(*ck, {shifted, out_shifted});
    EXPECT_TRUE(at::equal(at::roll(out_shifted, -5).isnan(), out.isnan()));
    EXPECT_TRUE(at::equal(at::roll(out_shifted, -5).nan_to_num(0), out.nan_to_num(0))) << n << " elements";
    // 128-bit vectors (4 lanes) give the same bits as the host's width.
    codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(128);
    auto ck128 = sin_cos_kernel(op, n);
    codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(0);
    at::Tensor out128 = at::empty_like(x);
    run(*ck128, {x, out128});
    EXPECT_TRUE(at::equal(out128.nan_to_num(0), out.nan_to_num(0)));
  }
}

// Arguments known to lie in [-1, 1] take a Taylor polynomial without reduction.
TEST(CpuLlvmMath, SinCosF32OfBoundedArguments) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 g(seed);
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, std::nextafter(1.f, 0.f), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::min(), std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i < 300000; ++i) v.push_back(static_cast<float>(uniform(g, -1, 1)));
  for (int i = 0; i < 50000; ++i) v.push_back(static_cast<float>(log_uniform(g, -40, 0, true)));
  v.push_back(-0.f);
  if (v.size() % 8 == 0) v.push_back(0.5f);
  const at::Tensor x = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kFloat).clone();
  for (OpCode op : {OpCode::Sin, OpCode::Cos}) {
    const at::Tensor out = run_with_eager_zeros(*sin_cos_kernel(op, x.numel(), /*clamped=*/true), op, x);
    check_sin_cos(op, x, out, "of clamp(x, -1, 1)");
    EXPECT_TRUE(std::isnan(out[7].item<float>()));
  }
}

// Runs `ck` (one f32 input, one f32 output) on every f32 whose bit pattern lies in
// [first, last], `chunk` at a time, and hands the worst ulp error against `ref` of each
// half chunk, with its input, to `take` (the halves are checked on two threads).
template <class Ref, class Take>
void sweep_f32_bits(const codegen::cpu_llvm::CpuKernel& ck, int64_t chunk, uint32_t first, uint32_t last, Ref ref, Take take) {
  at::Tensor x = at::empty({chunk}, at::kFloat), out = at::empty({chunk}, at::kFloat);
  for (uint64_t start = first; start <= last; start += static_cast<uint64_t>(chunk)) {
    uint32_t* xb = reinterpret_cast<uint32_t*>(x.data_ptr<float>());
    for (int64_t i = 0; i < chunk; ++i) xb[i] = static_cast<uint32_t>(std::min<uint64_t>(start + i, last));
    run(ck, {x, out});
    const float* xp = x.data_ptr<float>();
    const float* o = out.data_ptr<float>();
    double w[2] = {0, 0};
    float wx[2] = {0, 0};
    at::parallel_for(0, 2, 1, [&](int64_t b, int64_t e) {
      for (int64_t part = b; part < e; ++part) {
        for (int64_t i = part; i < chunk; i += 2) {
          const double err = ulp_error<float>(o[i], ref(static_cast<double>(xp[i])));
          if (err > w[part]) {
            w[part] = err;
            wx[part] = xp[i];
          }
        }
      }
    });
    for (int part = 0; part < 2; ++part) take(w[part], wx[part]);
  }
}

// Every f32 in [0, 2^19], and every f32 in [0, 1] through the bounded-argument path
// (negative x mirrors exactly): a few minutes, so only with TCAP_EXHAUSTIVE=1. This is
// the sweep behind the bounds in Note [CPU sin and cos].
TEST(CpuLlvmMath, SinCosF32Exhaustive) {
  const char* env = std::getenv("TCAP_EXHAUSTIVE");
  if (!env || std::string(env) != "1") {
    GTEST_SKIP() << "set TCAP_EXHAUSTIVE=1 to check every f32 in [0, 2^19] (and [0, 1] bounded)";
  }
  const float hi = 2 * kSinCosFastLimit;
  uint32_t last = 0;
  std::memcpy(&last, &hi, sizeof last);
  const int64_t chunk = int64_t{1} << 24;
  for (const auto& [op, clamped] : {std::pair{OpCode::Sin, false}, std::pair{OpCode::Cos, false},
                                    std::pair{OpCode::Sin, true}, std::pair{OpCode::Cos, true}}) {
    auto ck = sin_cos_kernel(op, chunk, clamped);
    const uint32_t last_x = clamped ? 0x3f800000u : last;  // 1.0f for the bounded path
    double worst[2] = {0, 0};
    float worst_x[2] = {0, 0};
    const OpCode fn = op;  // (a structured binding cannot be captured in C++17)
    sweep_f32_bits(
        *ck, chunk, 0u, last_x, [fn](double x) { return fn == OpCode::Sin ? std::sin(x) : std::cos(x); },
        [&](double w, float x) {
          const int big = std::fabs(x) > kSinCosFastLimit ? 1 : 0;
          if (w > worst[big]) {
            worst[big] = w;
            worst_x[big] = x;
          }
        });
    std::cout << "[ ulp      ] " << kir::to_string(op) << ".f32 every x in "
              << (clamped ? "[0, 1] (bounded path)" : "[0, 2^19]") << ": max " << std::setprecision(4) << worst[0] << " ulp at " << std::setprecision(9) << worst_x[0] << " (|x| <= 2^18), "
              << std::setprecision(4) << worst[1] << " beyond\n";
    EXPECT_LE(worst[0], kSinCosMaxUlp);
    EXPECT_LE(worst[1], kMaxUlp);
  }
}

// f32 exp and erf are inline code of our own too (Note [CPU exp and erf]): at most 1.1 ulp
// everywhere (the exhaustive sweep below measured 1.02 and 1.03), the same bits in vector
// lanes, in the scalar tail and at 128-bit width, and eager's edge cases.
constexpr double kExpErfMaxUlp = 1.1;

std::shared_ptr<const codegen::cpu_llvm::CpuKernel> unary_f32_kernel(OpCode op, int64_t n) {
  KernelBuilder kb(std::string(kir::to_string(op)) + "_f32", {n});
  int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
  kb.store(kb.un(op, kb.load(bx, {1})), bo, {1});
  return compile(kb);
}

long double exp_or_erf(OpCode op, long double x) { return op == OpCode::Exp ? std::exp(x) : std::erf(x); }

TEST(CpuLlvmMath, ExpErfF32OwnCodeWithinOnePointOneUlp) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 g(seed);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.f, -0.f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()};
  for (OpCode op : {OpCode::Exp, OpCode::Erf}) {
    std::vector<float> v(std::begin(specials), std::end(specials));
    if (op == OpCode::Exp) {
      for (int i = 0; i < 200000; ++i) v.push_back(static_cast<float>(uniform(g, -87, 87)));
      // Subnormal results, overflow, and lanes on both sides of the +-87 range branch.
      for (int i = 0; i < 50000; ++i) v.push_back(static_cast<float>(uniform(g, -110, -86)));
      for (int i = 0; i < 50000; ++i) v.push_back(static_cast<float>(uniform(g, 86, 90)));
      for (float edge : {88.7228394f, 88.7228317f, -87.3365479f, -103.972084f, -103.278931f, 87.0f, -87.0f}) {
        v.push_back(edge);
        v.push_back(std::nextafter(edge, inf));
        v.push_back(std::nextafter(edge, -inf));
      }
    } else {
      for (int i = 0; i < 200000; ++i) v.push_back(static_cast<float>(uniform(g, -5, 5)));
      for (int i = 0; i < 50000; ++i) v.push_back(static_cast<float>(log_uniform(g, -40, 1.5, true)));
      for (float edge : {0.927734375f, -0.927734375f, 4.0f, 3.9193f}) {
        v.push_back(edge);
        v.push_back(std::nextafter(edge, inf));
        v.push_back(std::nextafter(edge, -inf));
      }
    }
    for (int i = 0; i < 20000; ++i) v.push_back(static_cast<float>(log_uniform(g, -45, 38, true)));
    std::shuffle(v.begin() + static_cast<long>(std::size(specials)), v.end(), g);
    if (v.size() % 2 != 0) v.push_back(1.f);
    v.push_back(-0.f);  // in the scalar tail too (the length is odd)
    const at::Tensor x = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kFloat).clone();
    const int64_t n = x.numel();
    auto ck = unary_f32_kernel(op, n);
    at::Tensor out = at::empty_like(x);
    run(*ck, {x, out});
    const float* xp = x.data_ptr<float>();
    const float* o = out.data_ptr<float>();
    double worst = 0;
    int64_t at_i = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = ulp_error<float>(o[i], exp_or_erf(op, xp[i]));
      if (e > worst) {
        worst = e;
        at_i = i;
      }
    }
    std::cout << "[ ulp      ] " << kir::to_string(op) << ".f32 (own code): max " << std::setprecision(3) << worst
              << " ulp\n";
    EXPECT_LE(worst, kExpErfMaxUlp) << kir::to_string(op) << " at x = " << std::setprecision(9) << xp[at_i]
                                    << ": got " << o[at_i];
    // Eager's special values, signs included.
    const at::Tensor ref = op == OpCode::Exp ? x.exp() : x.erf();
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, n - 1}) {
      const float a = out[i].item<float>(), b = ref[i].item<float>();
      EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)))
          << kir::to_string(op) << "(" << xp[i] << ") = " << a << ", eager " << b;
    }
    // Vector lanes and the scalar tail compute the same bits.
    at::Tensor out_shifted = at::empty_like(x);
    run(*ck, {at::roll(x, 1), out_shifted});
    EXPECT_TRUE(at::equal(at::roll(out_shifted, -1).nan_to_num(0), out.nan_to_num(0))) << kir::to_string(op);
    // So do 128-bit vectors.
    codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(128);
    auto ck128 = unary_f32_kernel(op, n);
    codegen::cpu_llvm::cpu_llvm_set_vector_bits_for_testing(0);
    at::Tensor out128 = at::empty_like(x);
    run(*ck128, {x, out128});
    EXPECT_TRUE(at::equal(out128.nan_to_num(0), out.nan_to_num(0))) << kir::to_string(op);
  }
}

// Every f32 where exp is neither 0 nor +inf nor rounds to 1 in a trivial way ([-104, 89])
// and every f32 in [0, 4.5] for erf (odd; 1 beyond): only with TCAP_EXHAUSTIVE=1.
TEST(CpuLlvmMath, ExpErfF32Exhaustive) {
  const char* env = std::getenv("TCAP_EXHAUSTIVE");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set TCAP_EXHAUSTIVE=1 to check every f32 exp and erf";
  const int64_t chunk = int64_t{1} << 24;
  auto bits_of = [](float f) {
    uint32_t b = 0;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  struct Range {
    OpCode op;
    uint32_t first, last;  // bit patterns, walked upwards
  };
  // Negative floats' bit patterns grow with magnitude: [-104, -0] is 0x80000000..bits(-104).
  const Range ranges[] = {{OpCode::Exp, 0u, bits_of(89.0f)},
                          {OpCode::Exp, 0x80000000u, bits_of(-104.0f)},
                          {OpCode::Erf, 0u, bits_of(4.5f)}};
  double worst[2] = {0, 0};
  float worst_x[2] = {0, 0};
  for (const Range& r : ranges) {
    const int which = r.op == OpCode::Exp ? 0 : 1;
    sweep_f32_bits(
        *unary_f32_kernel(r.op, chunk), chunk, r.first, r.last, [&r](double x) { return exp_or_erf(r.op, x); },
        [&](double w, float x) {
          if (w > worst[which]) {
            worst[which] = w;
            worst_x[which] = x;
          }
        });
  }
  std::cout << "[ ulp      ] exp.f32 every x in [-104, 89]: max " << std::setprecision(4) << worst[0] << " ulp at "
            << std::setprecision(9) << worst_x[0] << "\n[ ulp      ] erf.f32 every x in [0, 4.5]: max "
            << std::setprecision(4) << worst[1] << " ulp at " << std::setprecision(9) << worst_x[1] << "\n";
  EXPECT_LE(worst[0], kExpErfMaxUlp);
  EXPECT_LE(worst[1], kExpErfMaxUlp);
}

// pow with the exponents ATen special-cases (2, 3, 0.5, -0.5, -1, -2) computes what ATen does.
TEST(CpuLlvmMath, PowSpecialExponentsMatchAten) {
  const auto seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  at::manual_seed(seed);
  const int64_t n = 1029;
  at::Tensor x = at::rand({n}) * 10;
  for (double p : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0}) {
    KernelBuilder kb("pow_const", {n});
    int32_t bx = kb.input(DType::F32), bo = kb.output(DType::F32);
    kb.store(kb.bin(OpCode::Pow, kb.load(bx, {1}), kb.fconst(DType::F32, p)), bo, {1});
    auto ck = compile(kb);
    at::Tensor out = at::empty({n});
    run(*ck, {x, out});
    if (p == 0.5 || p == -0.5) {  // ATen's sqrt may be MKL's (< 1 ulp, see cpu_llvm_test.cpp)
      EXPECT_TRUE(close(out, x.pow(p), 1.2e-7, 0, kb.k)) << "exponent " << p;
    } else {
      EXPECT_TRUE(same(out, x.pow(p), kb.k)) << "exponent " << p;
    }
  }
}

#endif  // TCAP_HAVE_LLVM

}  // namespace
}  // namespace tcap::test
