// cpu_llvm: accuracy of the vectorised transcendentals (glibc libmvec, Note [CPU math
// library]) measured in ulps against a long-double reference on fresh random inputs,
// including large arguments, overflow/underflow edges and NaN-producing domains.
#include "kernel_builder.h"

#include <cfloat>
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
