#include "fuse/lowering.h"

#include "fuse/activations.h"
#include "fuse/groups.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace tcap::fuse {

using kir::DType;
using kir::OpCode;

namespace {

using namespace activations;  // the table below names each activation's lowering

// Number of elements a Reduction/Row node reduces (product of the reduced sizes); for
// mse_loss_backward, what its mean divides by.
int64_t reduced_numel(const Emitter& e, const ir::Node& n);

int64_t rank_of_arg0(const ir::Graph& g, const ir::Node& n) {
  return static_cast<int64_t>(g.value(n.args.at(0).values.at(0)).meta.sizes.size());
}

std::vector<int64_t> normalize(std::vector<int64_t> dims, int64_t rank) {
  for (auto& d : dims) {
    if (d < 0) d += std::max<int64_t>(rank, 1);
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  if (rank == 0) dims.clear();
  return dims;
}

std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < rank; ++i) d.push_back(i);
  return d;
}

// dim: int[1]? (None or [] = all dims)
std::vector<int64_t> dims_arg1(const ir::Graph& g, const ir::Node& n) {
  const int64_t rank = rank_of_arg0(g, n);
  const ir::Arg& a = n.args.at(1);
  if (a.kind == ir::ArgKind::None || (a.kind == ir::ArgKind::IntList && a.ints.empty())) return all_dims(rank);
  if (a.kind == ir::ArgKind::Int) return normalize({a.i}, rank);
  return normalize(a.ints, rank);
}
std::vector<int64_t> dims_all(const ir::Graph& g, const ir::Node& n) { return all_dims(rank_of_arg0(g, n)); }
std::vector<int64_t> dims_softmax(const ir::Graph& g, const ir::Node& n) {
  return normalize({n.args.at(1).i}, rank_of_arg0(g, n));
}
// _softmax_backward_data(grad_output, output, dim, input_dtype)
std::vector<int64_t> dims_softmax_bw(const ir::Graph& g, const ir::Node& n) {
  return normalize({n.args.at(2).i}, rank_of_arg0(g, n));
}
// The trailing dims named by the normalized_shape argument at position `shape_arg`:
// native_layer_norm(input, normalized_shape, ...) and
// native_layer_norm_backward(grad_out, input, normalized_shape, ...).
template <size_t shape_arg>
std::vector<int64_t> dims_layer_norm(const ir::Graph& g, const ir::Node& n) {
  const int64_t rank = rank_of_arg0(g, n);
  const int64_t k = static_cast<int64_t>(n.args.at(shape_arg).ints.size());
  std::vector<int64_t> d;
  for (int64_t i = rank - k; i < rank; ++i) d.push_back(i);
  return d;
}
// mse_loss(self, target, reduction): reduces everything unless reduction == none.
std::vector<int64_t> dims_mse(const ir::Graph& g, const ir::Node& n) { return all_dims(rank_of_arg0(g, n)); }

// --- pointwise -----------------------------------------------------------------

template <OpCode op>
std::vector<Val> unary(Emitter& e, const ir::Node& n) {
  return {e.un(op, e.in(n, 0, e.compute_dtype(n)))};
}

std::vector<Val> logical_not(Emitter& e, const ir::Node& n) {
  return {e.cast(e.un(OpCode::Not, e.in(n, 0, DType::Bool)), e.compute_dtype(n))};
}
template <OpCode op>
std::vector<Val> logical(Emitter& e, const ir::Node& n) {
  return {e.cast(e.bin(op, e.in(n, 0, DType::Bool), e.in(n, 1, DType::Bool)), e.compute_dtype(n))};
}
std::vector<Val> isnan(Emitter& e, const ir::Node& n) {
  return {e.un(OpCode::IsNan, e.in(n, 0, e.promoted(n, {0})))};
}
std::vector<Val> copy_as(Emitter& e, const ir::Node& n) { return {e.in(n, 0, e.compute_dtype(n))}; }
std::vector<Val> reciprocal(Emitter& e, const ir::Node& n) { return unary<OpCode::Recip>(e, n); }

// Note [Fused multiply-add]
// ATen's CPU kernels are compiled with floating-point contraction, and their vector forms
// call fmadd by hand: add(a, b, alpha) is fmadd(b, alpha, a) (sub negates alpha), and
// addcmul(self, t1, t2, value) is fmadd(value * t1, t2, self), each rounded once; CUDA's
// compiler contracts the same expressions. A kernel that multiplies and adds in two
// roundings differs from eager in the last bit of about one element in ten, which an
// optimizer's update (add_ with alpha, addcmul_) then carries into every later step. So
// these lowerings emit kir's Fma where ATen's arithmetic is one, and keep ATen's order of
// operations elsewhere (addcdiv is self + (value * t1) / t2, not self + value * (t1 / t2);
// lerp is one multiply-add either side of weight 0.5, as ATen's lerp_vec):
// an update fused from the recorded ops is then bitwise eager's on CPUs with FMA (x86
// FMA3, AArch64). Checked against eager in test/fuse/fused_updates_test.cpp.

// add/sub with alpha: a + alpha * b, one rounding (fmadd(b, alpha, a)) for floating dtypes
template <OpCode op>
std::vector<Val> add_sub(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val a = e.in(n, 0, t), b = e.in(n, 1, t);
  if (n.args.size() > 2 && !e.is_constant(n, 2, 1.0)) {
    Val alpha = e.in(n, 2, t);
    if (op == OpCode::Sub) alpha = e.un(OpCode::Neg, alpha);
    return {e.mul_add(b, alpha, a)};
  }
  return {e.bin(op, a, b)};
}
std::vector<Val> rsub(Emitter& e, const ir::Node& n) {  // other - alpha * self
  const DType t = e.compute_dtype(n);
  Val a = e.in(n, 0, t), b = e.in(n, 1, t);
  if (n.args.size() > 2 && !e.is_constant(n, 2, 1.0)) {
    a = e.bin(OpCode::Mul, a, e.in(n, 2, t));
  }
  return {e.bin(OpCode::Sub, b, a)};
}
template <OpCode op>
std::vector<Val> binary(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  return {e.bin(op, e.in(n, 0, t), e.in(n, 1, t))};
}
template <OpCode op>
std::vector<Val> compare(Emitter& e, const ir::Node& n) {
  const DType t = e.promoted(n, {0, 1});
  return {e.cast(e.cmp(op, e.in(n, 0, t), e.in(n, 1, t)), e.compute_dtype(n))};
}
std::vector<Val> where(Emitter& e, const ir::Node& n) {  // where(cond, self, other), either may be a Scalar
  const DType t = e.compute_dtype(n);
  return {e.where(e.in(n, 0, DType::Bool), e.in(n, 1, t), e.in(n, 2, t))};
}
std::vector<Val> masked_fill(Emitter& e, const ir::Node& n) {  // (self, mask, value)
  const DType t = e.compute_dtype(n);
  return {e.where(e.in(n, 1, DType::Bool), e.in(n, 2, t), e.in(n, 0, t))};
}
// Note [Fused multiply-add]: ATen's order, self + (value * t1) * t2 with the last
// multiply-add rounded once, and self + (value * t1) / t2.
std::vector<Val> addcmul(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val vt1 = e.bin(OpCode::Mul, e.in(n, 3, t), e.in(n, 1, t));
  return {e.mul_add(vt1, e.in(n, 2, t), e.in(n, 0, t))};
}
std::vector<Val> addcdiv(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val q = e.bin(OpCode::Div, e.bin(OpCode::Mul, e.in(n, 3, t), e.in(n, 1, t)), e.in(n, 2, t));
  return {e.bin(OpCode::Add, e.in(n, 0, t), q)};
}
std::vector<Val> pow_tensor_scalar(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  const double p = e.real(n, 1);
  // ATen's pow special-cases these exponents (exactly, no libm pow).
  if (p == 1) return {x};
  if (p == 2) return {e.bin(OpCode::Mul, x, x)};
  if (p == 3) return {e.bin(OpCode::Mul, e.bin(OpCode::Mul, x, x), x)};
  if (p == 0.5) return {e.un(OpCode::Sqrt, x)};
  if (p == -0.5) return {e.un(OpCode::Rsqrt, x)};
  if (p == -1) return {e.un(OpCode::Recip, x)};
  if (p == -2) return {e.un(OpCode::Recip, e.bin(OpCode::Mul, x, x))};
  return {e.bin(OpCode::Pow, x, e.c(p, t))};
}
std::vector<Val> pow_scalar(Emitter& e, const ir::Node& n) {  // pow.Scalar(Scalar self, Tensor exponent)
  const DType t = e.compute_dtype(n);
  return {e.bin(OpCode::Pow, e.in(n, 0, t), e.in(n, 1, t))};
}
// lerp.Scalar(self, end, weight) as ATen computes it (Note [Fused multiply-add]): with
// diff = end - self, fmadd(weight, diff, self) for |weight| < 0.5, else end - diff * (1 -
// weight) rounded once, 1 - weight taken in the compute dtype (an exponential moving
// average's lerp_ is then eager's bits).
std::vector<Val> lerp_scalar(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val a = e.in(n, 0, t), b = e.in(n, 1, t);
  const double w = e.real(n, 2);
  Val diff = e.bin(OpCode::Sub, b, a);
  if (std::abs(w) < 0.5) return {e.mul_add(e.c(w, t), diff, a)};
  const double one_minus_w =
      t == DType::F64 ? 1.0 - w : static_cast<double>(1.0f - static_cast<float>(w));  // opmath float otherwise
  return {e.mul_add(e.un(OpCode::Neg, diff), e.c(one_minus_w, t), b)};
}
std::vector<Val> mse_loss_backward(Emitter& e, const ir::Node& n) {  // (grad, self, target, reduction)
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t), y = e.in(n, 2, t);
  double norm = 2.0;
  if (e.integer(n, 3) == 1) norm /= static_cast<double>(reduced_numel(e, n));
  return {e.bin(OpCode::Mul, e.bin(OpCode::Mul, e.c(norm, t), e.bin(OpCode::Sub, x, y)), g)};
}

// --- reductions -----------------------------------------------------------------

std::vector<Val> sum(Emitter& e, const ir::Node& n) {
  return {e.reduce(OpCode::ReduceSum, e.in(n, 0, e.compute_dtype(n)))};
}
std::vector<Val> mean(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val s = e.reduce(OpCode::ReduceSum, e.in(n, 0, t));
  return {e.bin(OpCode::Div, s, e.c(static_cast<double>(reduced_numel(e, n)), t))};
}
template <OpCode op>
std::vector<Val> reduce_minmax(Emitter& e, const ir::Node& n) {
  return {e.reduce(op, e.in(n, 0, e.compute_dtype(n)))};
}
std::vector<Val> mse_loss(Emitter& e, const ir::Node& n) {  // reduction: 1 mean, 2 sum
  const DType t = e.compute_dtype(n);
  Val d = e.bin(OpCode::Sub, e.in(n, 0, t), e.in(n, 1, t));
  if (e.integer(n, 2) == 0) return {e.bin(OpCode::Mul, d, d)};
  Val s = e.reduce(OpCode::ReduceSum, e.bin(OpCode::Mul, d, d));
  if (e.integer(n, 2) == 1) s = e.bin(OpCode::Div, s, e.c(static_cast<double>(reduced_numel(e, n)), t));
  return {s};
}
// logsumexp(self, dim, keepdim) as ATen computes it: max + log(sum(exp(x - max))), where
// a row whose maximum is infinite subtracts 0 instead (all -inf gives -inf, a +inf gives
// +inf, not nan). "Infinite" is tested as isnan(m - m), true for +-inf and for nan, whose
// row is nan either way.
std::vector<Val> logsumexp(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  Val m = e.reduce(OpCode::ReduceMax, x);
  Val shift = e.where(e.un(OpCode::IsNan, e.bin(OpCode::Sub, m, m)), e.c(0, t), m);
  Val s = e.reduce(OpCode::ReduceSum, e.un(OpCode::Exp, e.bin(OpCode::Sub, x, shift)));
  return {e.bin(OpCode::Add, e.un(OpCode::Log, s), shift)};
}
std::vector<Val> softmax(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  Val m = e.reduce(OpCode::ReduceMax, x);
  Val ex = e.un(OpCode::Exp, e.bin(OpCode::Sub, x, m));
  Val s = e.reduce(OpCode::ReduceSum, ex);
  return {e.bin(OpCode::Div, ex, s)};
}
std::vector<Val> log_softmax(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  Val m = e.reduce(OpCode::ReduceMax, x);
  Val shifted = e.bin(OpCode::Sub, x, m);
  Val s = e.reduce(OpCode::ReduceSum, e.un(OpCode::Exp, shifted));
  return {e.bin(OpCode::Sub, shifted, e.un(OpCode::Log, s))};
}
std::vector<Val> softmax_backward(Emitter& e, const ir::Node& n) {  // (grad_output, output, dim, input_dtype)
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), y = e.in(n, 1, t);
  Val s = e.reduce(OpCode::ReduceSum, e.bin(OpCode::Mul, g, y));
  return {e.bin(OpCode::Mul, y, e.bin(OpCode::Sub, g, s))};
}
std::vector<Val> log_softmax_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), y = e.in(n, 1, t);
  Val s = e.reduce(OpCode::ReduceSum, g);
  return {e.bin(OpCode::Sub, g, e.bin(OpCode::Mul, e.un(OpCode::Exp, y), s))};
}
// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
std::vector<Val> layer_norm(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n, 1);  // mean/rstd carry the accumulation dtype
  Val x = e.in(n, 0, t);
  const Val count = e.c(static_cast<double>(reduced_numel(e, n)), t);
  Val mu = e.bin(OpCode::Div, e.reduce(OpCode::ReduceSum, x), count);
  Val d = e.bin(OpCode::Sub, x, mu);
  Val var = e.bin(OpCode::Div, e.reduce(OpCode::ReduceSum, e.bin(OpCode::Mul, d, d)), count);
  Val rstd = e.un(OpCode::Rsqrt, e.bin(OpCode::Add, var, e.c(e.real(n, 4), t)));
  Val y = e.bin(OpCode::Mul, d, rstd);
  if (e.is_tensor(n, 2)) y = e.bin(OpCode::Mul, y, e.in(n, 2, t));
  if (e.is_tensor(n, 3)) y = e.bin(OpCode::Add, y, e.in(n, 3, t));
  return {y, mu, rstd};
}
// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask = [1, 0, 0]) -> grad_input. With g = grad_out * weight and
// xhat = (input - mean) * rstd, over the N normalized elements of a row:
//   grad_input = rstd * (g - (sum(g) + xhat * sum(g * xhat)) / N)
// (eager's formula, centered). Weight and bias gradients are split off before fusion
// (Note [Decompositions for fusion]).
std::vector<Val> layer_norm_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val dy = e.in(n, 0, t), x = e.in(n, 1, t), mu = e.in(n, 3, t), rstd = e.in(n, 4, t);
  Val g = e.is_tensor(n, 5) ? e.bin(OpCode::Mul, dy, e.in(n, 5, t)) : dy;
  Val xhat = e.bin(OpCode::Mul, e.bin(OpCode::Sub, x, mu), rstd);
  Val sum_g = e.reduce(OpCode::ReduceSum, g);
  Val sum_gx = e.reduce(OpCode::ReduceSum, e.bin(OpCode::Mul, g, xhat));
  const Val count = e.c(static_cast<double>(reduced_numel(e, n)), t);
  Val inner = e.bin(OpCode::Div, e.bin(OpCode::Add, sum_g, e.bin(OpCode::Mul, xhat, sum_gx)), count);
  return {e.bin(OpCode::Mul, rstd, e.bin(OpCode::Sub, g, inner))};
}

// Note [Small matmuls as kernels] (lowering.h). mm(a, b), bmm(a, b), and addmm/baddbmm
// (self, a, b, beta, alpha) = beta * self + alpha * (a @ b); with beta = 0 self is not
// read at all (eager ignores it, NaN and inf included).
bool adds_self(const ir::Node& n) { return n.op == "aten::addmm" || n.op == "aten::baddbmm"; }

std::vector<Val> matmul(Emitter& e, const ir::Node& n) {
  const ir::Graph& g = e.graph();
  const DType t = e.compute_dtype(n);
  const size_t a = adds_self(n) ? 1 : 0;
  Val prod = e.bin(OpCode::Mul, e.in_mapped(n, a, t, contraction_src(g, n, a)),
                   e.in_mapped(n, a + 1, t, contraction_src(g, n, a + 1)));
  Val r = e.reduce(OpCode::ReduceSum, prod);
  if (!adds_self(n)) return {r};
  const double beta = e.real(n, 3), alpha = e.real(n, 4);
  if (alpha != 1.0) r = e.bin(OpCode::Mul, e.c(alpha, t), r);
  if (beta == 0.0) return {r};
  Val self = e.in_mapped(n, 0, t, contraction_src(g, n, 0));
  if (beta != 1.0) self = e.bin(OpCode::Mul, e.c(beta, t), self);
  return {e.bin(OpCode::Add, self, r)};
}

const std::unordered_map<std::string, LoweringRow>& table() {
  static const std::unordered_map<std::string, LoweringRow> t = {
      {"aten::neg", {OpClass::Pointwise, unary<OpCode::Neg>}},
      {"aten::abs", {OpClass::Pointwise, unary<OpCode::Abs>}},
      {"aten::exp", {OpClass::Pointwise, unary<OpCode::Exp>}},
      {"aten::log", {OpClass::Pointwise, unary<OpCode::Log>}},
      {"aten::log1p", {OpClass::Pointwise, unary<OpCode::Log1p>}},
      {"aten::expm1", {OpClass::Pointwise, unary<OpCode::Expm1>}},
      {"aten::sin", {OpClass::Pointwise, unary<OpCode::Sin>}},
      {"aten::cos", {OpClass::Pointwise, unary<OpCode::Cos>}},
      {"aten::tan", {OpClass::Pointwise, unary<OpCode::Tan>}},
      {"aten::tanh", {OpClass::Pointwise, unary<OpCode::Tanh>}},
      {"aten::erf", {OpClass::Pointwise, unary<OpCode::Erf>}},
      {"aten::sqrt", {OpClass::Pointwise, unary<OpCode::Sqrt>}},
      {"aten::rsqrt", {OpClass::Pointwise, unary<OpCode::Rsqrt>}},
      {"aten::reciprocal", {OpClass::Pointwise, reciprocal}},
      {"aten::floor", {OpClass::Pointwise, unary<OpCode::Floor>}},
      {"aten::ceil", {OpClass::Pointwise, unary<OpCode::Ceil>}},
      {"aten::round", {OpClass::Pointwise, unary<OpCode::Round>}},
      {"aten::trunc", {OpClass::Pointwise, unary<OpCode::Trunc>}},
      {"aten::sigmoid", {OpClass::Pointwise, sigmoid}},
      {"aten::relu", {OpClass::Pointwise, relu}},
      {"aten::silu", {OpClass::Pointwise, silu}},
      {"aten::gelu", {OpClass::Pointwise, gelu}},
      {"aten::mish", {OpClass::Pointwise, mish}},
      {"aten::hardtanh", {OpClass::Pointwise, hardtanh}},
      {"aten::hardsigmoid", {OpClass::Pointwise, hardsigmoid}},
      {"aten::hardswish", {OpClass::Pointwise, hardswish}},
      {"aten::leaky_relu", {OpClass::Pointwise, leaky_relu}},
      {"aten::elu", {OpClass::Pointwise, elu}},
      {"aten::softplus", {OpClass::Pointwise, softplus}},
      {"aten::threshold", {OpClass::Pointwise, threshold}},
      {"aten::clamp", {OpClass::Pointwise, clamp}},
      {"aten::clamp.Tensor", {OpClass::Pointwise, clamp}},
      {"aten::clamp_min", {OpClass::Pointwise, clamp_min}},
      {"aten::clamp_min.Tensor", {OpClass::Pointwise, clamp_min}},
      {"aten::clamp_max", {OpClass::Pointwise, clamp_max}},
      {"aten::clamp_max.Tensor", {OpClass::Pointwise, clamp_max}},
      {"aten::logical_not", {OpClass::Pointwise, logical_not}},
      {"aten::logical_and", {OpClass::Pointwise, logical<OpCode::And>}},
      {"aten::logical_or", {OpClass::Pointwise, logical<OpCode::Or>}},
      {"aten::isnan", {OpClass::Pointwise, isnan}},
      {"aten::_to_copy", {OpClass::Pointwise, copy_as}},
      {"aten::clone", {OpClass::Pointwise, copy_as}},
      {"aten::add.Tensor", {OpClass::Pointwise, add_sub<OpCode::Add>}},
      {"aten::add.Scalar", {OpClass::Pointwise, add_sub<OpCode::Add>}},
      {"aten::sub.Tensor", {OpClass::Pointwise, add_sub<OpCode::Sub>}},
      {"aten::sub.Scalar", {OpClass::Pointwise, add_sub<OpCode::Sub>}},
      {"aten::rsub.Tensor", {OpClass::Pointwise, rsub}},
      {"aten::rsub.Scalar", {OpClass::Pointwise, rsub}},
      {"aten::mul.Tensor", {OpClass::Pointwise, binary<OpCode::Mul>}},
      {"aten::mul.Scalar", {OpClass::Pointwise, binary<OpCode::Mul>}},
      {"aten::div.Tensor", {OpClass::Pointwise, binary<OpCode::Div>}},
      {"aten::div.Scalar", {OpClass::Pointwise, binary<OpCode::Div>}},
      {"aten::maximum", {OpClass::Pointwise, binary<OpCode::Max>}},
      {"aten::minimum", {OpClass::Pointwise, binary<OpCode::Min>}},
      {"aten::pow.Tensor_Tensor", {OpClass::Pointwise, binary<OpCode::Pow>}},
      {"aten::pow.Tensor_Scalar", {OpClass::Pointwise, pow_tensor_scalar}},
      {"aten::pow.Scalar", {OpClass::Pointwise, pow_scalar}},
      {"aten::eq.Tensor", {OpClass::Pointwise, compare<OpCode::Eq>}},
      {"aten::eq.Scalar", {OpClass::Pointwise, compare<OpCode::Eq>}},
      {"aten::ne.Tensor", {OpClass::Pointwise, compare<OpCode::Ne>}},
      {"aten::ne.Scalar", {OpClass::Pointwise, compare<OpCode::Ne>}},
      {"aten::lt.Tensor", {OpClass::Pointwise, compare<OpCode::Lt>}},
      {"aten::lt.Scalar", {OpClass::Pointwise, compare<OpCode::Lt>}},
      {"aten::le.Tensor", {OpClass::Pointwise, compare<OpCode::Le>}},
      {"aten::le.Scalar", {OpClass::Pointwise, compare<OpCode::Le>}},
      {"aten::gt.Tensor", {OpClass::Pointwise, compare<OpCode::Gt>}},
      {"aten::gt.Scalar", {OpClass::Pointwise, compare<OpCode::Gt>}},
      {"aten::ge.Tensor", {OpClass::Pointwise, compare<OpCode::Ge>}},
      {"aten::ge.Scalar", {OpClass::Pointwise, compare<OpCode::Ge>}},
      {"aten::where.self", {OpClass::Pointwise, where}},
      {"aten::where.ScalarOther", {OpClass::Pointwise, where}},
      {"aten::where.ScalarSelf", {OpClass::Pointwise, where}},
      {"aten::where.Scalar", {OpClass::Pointwise, where}},
      {"aten::masked_fill.Scalar", {OpClass::Pointwise, masked_fill}},
      {"aten::masked_fill.Tensor", {OpClass::Pointwise, masked_fill}},
      {"aten::addcmul", {OpClass::Pointwise, addcmul}},
      {"aten::addcdiv", {OpClass::Pointwise, addcdiv}},
      {"aten::lerp.Scalar", {OpClass::Pointwise, lerp_scalar}},
      {"aten::threshold_backward", {OpClass::Pointwise, threshold_backward}},
      {"aten::sigmoid_backward", {OpClass::Pointwise, sigmoid_backward}},
      {"aten::tanh_backward", {OpClass::Pointwise, tanh_backward}},
      {"aten::gelu_backward", {OpClass::Pointwise, gelu_backward}},
      {"aten::silu_backward", {OpClass::Pointwise, silu_backward}},
      {"aten::hardtanh_backward", {OpClass::Pointwise, hardtanh_backward}},
      {"aten::leaky_relu_backward", {OpClass::Pointwise, leaky_relu_backward}},
      {"aten::softplus_backward", {OpClass::Pointwise, softplus_backward}},
      {"aten::mse_loss_backward", {OpClass::Pointwise, mse_loss_backward}},
      {"aten::sum.dim_IntList", {OpClass::Reduction, sum, dims_arg1}},
      {"aten::sum", {OpClass::Reduction, sum, dims_all}},
      {"aten::mean.dim", {OpClass::Reduction, mean, dims_arg1}},
      {"aten::mean", {OpClass::Reduction, mean, dims_all}},
      {"aten::amax", {OpClass::Reduction, reduce_minmax<OpCode::ReduceMax>, dims_arg1}},
      {"aten::amin", {OpClass::Reduction, reduce_minmax<OpCode::ReduceMin>, dims_arg1}},
      {"aten::logsumexp", {OpClass::Reduction, logsumexp, dims_arg1}},
      {"aten::mse_loss", {OpClass::Reduction, mse_loss, dims_mse}},
      {"aten::_softmax", {OpClass::Row, softmax, dims_softmax}},
      {"aten::_log_softmax", {OpClass::Row, log_softmax, dims_softmax}},
      {"aten::_softmax_backward_data", {OpClass::Row, softmax_backward, dims_softmax_bw}},
      {"aten::_log_softmax_backward_data", {OpClass::Row, log_softmax_backward, dims_softmax_bw}},
      {"aten::native_layer_norm", {OpClass::Row, layer_norm, dims_layer_norm<1>}},
      {"aten::native_layer_norm_backward", {OpClass::Row, layer_norm_backward, dims_layer_norm<2>}},
      {"aten::mm", {OpClass::Contraction, matmul}},
      {"aten::addmm", {OpClass::Contraction, matmul}},
      {"aten::bmm", {OpClass::Contraction, matmul}},
      {"aten::baddbmm", {OpClass::Contraction, matmul}},
  };
  return t;
}

int64_t reduced_numel(const Emitter& e, const ir::Node& n) {
  // mse_loss_backward (grad, self, ...) is pointwise, but its mean divides by self's numel.
  if (n.op == "aten::mse_loss_backward") return e.graph().value(n.args.at(1).values.at(0)).meta.numel();
  const LoweringRow* row = find_lowering(n);
  TORCH_INTERNAL_ASSERT(row && row->dims, "tcap fusion: ", n.qualified_op(), " reduces no dims");
  const auto& sizes = e.graph().value(n.args.at(0).values.at(0)).meta.sizes;
  int64_t count = 1;
  for (int64_t d : row->dims(e.graph(), n)) count *= sizes[static_cast<size_t>(d)];
  return count;
}

}  // namespace

// Note [A row per overload]: a row serves the overload it names, and a row named without
// an overload serves the default one only. An op's other overloads may take other
// arguments or mean something else: sum.dim_DimnameList reduces the dims it names where
// the row of `aten::sum` reduces every dim. Each overload a lowering serves is listed.
//
// Note [Writes are not lowered]: a row computes an op's functional result, so no row names
// an overload whose schema writes an argument (Tensor(a!): an out= overload such as
// maximum.out, which Adam's amsgrad records through torch::max_out; an in-place one): a
// kernel would compute the value and drop the write. Such a node runs as an ATen call,
// unless functionalize (fuse/functionalize.cpp) turns it into its functional form first.
// LoweringRows.NoRowNamesAnOverloadThatWrites checks the table against the schemas.
const LoweringRow* find_lowering(const ir::Node& n) {
  const auto& t = table();
  auto it = t.find(n.qualified_op());
  return it == t.end() ? nullptr : &it->second;
}

bool joins_kernels(const ir::Node& n) {
  const LoweringRow* row = n.kind == ir::NodeKind::Call ? find_lowering(n) : nullptr;
  return row && row->cls != OpClass::Contraction;
}

std::vector<std::pair<std::string, OpClass>> lowered_ops() {
  std::vector<std::pair<std::string, OpClass>> out;
  for (const auto& [op, row] : table()) out.emplace_back(op, row.cls);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> contraction_space(const ir::Graph& g, const ir::Node& n) {
  const size_t a = adds_self(n) ? 1 : 0;
  const auto& lhs = g.value(n.args.at(a).values.at(0)).meta.sizes;
  std::vector<int64_t> S = out_sizes(g, n);
  S.push_back(lhs.back());
  return S;
}

std::vector<int> contraction_src(const ir::Graph& g, const ir::Node& n, size_t i) {
  // Space dims: [B,] M, N, K.
  const bool batched = n.op == "aten::bmm" || n.op == "aten::baddbmm";
  const size_t a = adds_self(n) ? 1 : 0;
  if (i == a) return batched ? std::vector<int>{0, 1, -1, 2} : std::vector<int>{0, -1, 1};      // [B,] M, K
  if (i == a + 1) return batched ? std::vector<int>{0, -1, 2, 1} : std::vector<int>{-1, 1, 0};  // [B,] K, N
  TORCH_INTERNAL_ASSERT(adds_self(n) && i == 0, "tcap fusion: ", n.qualified_op(), " has no operand ", i);
  // self broadcasts (right-aligned) onto the output [B,] M, N; it is not read along K.
  const auto& s = g.value(n.args.at(0).values.at(0)).meta.sizes;
  const int out_rank = batched ? 3 : 2;
  std::vector<int> src(static_cast<size_t>(out_rank + 1), -1);
  const int off = out_rank - static_cast<int>(s.size());
  for (int d = std::max(off, 0); d < out_rank; ++d) src[static_cast<size_t>(d)] = d - off;
  return src;
}

int64_t contraction_macs(const ir::Graph& g, const ir::Node& n) {
  int64_t macs = 1;
  for (int64_t d : contraction_space(g, n)) macs *= d;
  return macs;
}

std::vector<Val> lower(Emitter& e, const ir::Node& n) {
  const LoweringRow* row = find_lowering(n);
  TORCH_INTERNAL_ASSERT(row, "tcap fusion: no lowering for ", n.qualified_op());
  return row->lower(e, n);
}

}  // namespace tcap::fuse
