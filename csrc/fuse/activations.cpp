// Activation functions and their backwards lowered to kernel IR (activations.h).
#include "fuse/activations.h"

#include "fuse/groups.h"

#include <cmath>
#include <string>

namespace tcap::fuse::activations {

using kir::DType;
using kir::OpCode;

static std::vector<Val> sigmoid_of(Emitter& e, Val x) {
  const DType t = x.dtype;
  return {e.bin(OpCode::Div, e.c(1, t), e.bin(OpCode::Add, e.c(1, t), e.un(OpCode::Exp, e.un(OpCode::Neg, x))))};
}
std::vector<Val> sigmoid(Emitter& e, const ir::Node& n) { return sigmoid_of(e, e.in(n, 0, e.compute_dtype(n))); }
std::vector<Val> relu(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  return {e.bin(OpCode::Max, e.in(n, 0, t), e.c(0, t))};
}
std::vector<Val> silu(Emitter& e, const ir::Node& n) {
  Val x = e.in(n, 0, e.compute_dtype(n));
  return {e.bin(OpCode::Mul, x, sigmoid_of(e, x)[0])};
}
static Val gelu_of(Emitter& e, Val x, const std::string& approximate) {
  const DType t = x.dtype;
  if (approximate == "tanh") {
    const double kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715;
    Val cube = e.bin(OpCode::Mul, e.bin(OpCode::Mul, x, x), x);
    Val inner = e.bin(OpCode::Mul, e.c(kBeta, t), e.bin(OpCode::Add, x, e.bin(OpCode::Mul, e.c(kKappa, t), cube)));
    return e.bin(OpCode::Mul, e.bin(OpCode::Mul, e.c(0.5, t), x), e.bin(OpCode::Add, e.c(1, t), e.un(OpCode::Tanh, inner)));
  }
  Val cdf = e.bin(OpCode::Add, e.c(1, t), e.un(OpCode::Erf, e.bin(OpCode::Mul, x, e.c(M_SQRT1_2, t))));
  return e.bin(OpCode::Mul, e.bin(OpCode::Mul, x, e.c(0.5, t)), cdf);
}
std::vector<Val> gelu(Emitter& e, const ir::Node& n) {
  return {gelu_of(e, e.in(n, 0, e.compute_dtype(n)), e.str(n, 1))};
}
std::vector<Val> gelu_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t);
  if (e.str(n, 2) == "tanh") {
    const double kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715;
    Val x_sq = e.bin(OpCode::Mul, x, x);
    Val x_cube = e.bin(OpCode::Mul, x_sq, x);
    Val inner = e.bin(OpCode::Mul, e.c(kBeta, t), e.bin(OpCode::Add, x, e.bin(OpCode::Mul, e.c(kKappa, t), x_cube)));
    Val th = e.un(OpCode::Tanh, inner);
    Val left = e.bin(OpCode::Mul, e.c(0.5, t), x);
    Val right = e.bin(OpCode::Add, e.c(1, t), th);
    Val left_d = e.bin(OpCode::Mul, e.c(0.5, t), right);
    Val tanh_d = e.bin(OpCode::Sub, e.c(1, t), e.bin(OpCode::Mul, th, th));
    Val inner_d = e.bin(OpCode::Mul, e.c(kBeta, t), e.bin(OpCode::Add, e.c(1, t), e.bin(OpCode::Mul, e.c(3 * kKappa, t), x_sq)));
    Val right_d = e.bin(OpCode::Mul, e.bin(OpCode::Mul, left, tanh_d), inner_d);
    return {e.bin(OpCode::Mul, g, e.bin(OpCode::Add, left_d, right_d))};
  }
  const double kAlpha = M_SQRT1_2, kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5;
  Val cdf = e.bin(OpCode::Mul, e.c(0.5, t), e.bin(OpCode::Add, e.c(1, t), e.un(OpCode::Erf, e.bin(OpCode::Mul, x, e.c(kAlpha, t)))));
  Val pdf = e.bin(OpCode::Mul, e.un(OpCode::Exp, e.bin(OpCode::Mul, e.c(-0.5, t), e.bin(OpCode::Mul, x, x))), e.c(kBeta, t));
  return {e.bin(OpCode::Mul, g, e.bin(OpCode::Add, cdf, e.bin(OpCode::Mul, x, pdf)))};
}
std::vector<Val> silu_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t);
  Val s = sigmoid_of(e, x)[0];
  Val one = e.c(1, t);
  return {e.bin(OpCode::Mul, e.bin(OpCode::Mul, g, s), e.bin(OpCode::Add, one, e.bin(OpCode::Mul, x, e.bin(OpCode::Sub, one, s))))};
}
std::vector<Val> sigmoid_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), y = e.in(n, 1, t);
  return {e.bin(OpCode::Mul, e.bin(OpCode::Mul, g, e.bin(OpCode::Sub, e.c(1, t), y)), y)};
}
std::vector<Val> tanh_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), y = e.in(n, 1, t);
  return {e.bin(OpCode::Mul, g, e.bin(OpCode::Sub, e.c(1, t), e.bin(OpCode::Mul, y, y)))};
}
std::vector<Val> threshold_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t);
  return {e.where(e.cmp(OpCode::Le, x, e.in(n, 2, t)), e.c(0, t), g)};
}
std::vector<Val> threshold(Emitter& e, const ir::Node& n) {  // threshold(self, threshold, value)
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  return {e.where(e.cmp(OpCode::Le, x, e.in(n, 1, t)), e.in(n, 2, t), x)};
}
std::vector<Val> hardtanh(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  return {e.bin(OpCode::Min, e.bin(OpCode::Max, e.in(n, 0, t), e.in(n, 1, t)), e.in(n, 2, t))};
}
std::vector<Val> hardtanh_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t);
  Val out = e.bin(OpCode::Or, e.cmp(OpCode::Le, x, e.in(n, 2, t)), e.cmp(OpCode::Ge, x, e.in(n, 3, t)));
  return {e.where(out, e.c(0, t), g)};
}
std::vector<Val> leaky_relu(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  return {e.where(e.cmp(OpCode::Gt, x, e.c(0, t)), x, e.bin(OpCode::Mul, x, e.in(n, 1, t)))};
}
std::vector<Val> leaky_relu_backward(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t);
  return {e.where(e.cmp(OpCode::Gt, x, e.c(0, t)), g, e.bin(OpCode::Mul, g, e.in(n, 2, t)))};
}
std::vector<Val> elu(Emitter& e, const ir::Node& n) {  // elu(self, alpha, scale, input_scale)
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  const double alpha = e.real(n, 1), scale = e.real(n, 2), input_scale = e.real(n, 3);
  Val neg = e.bin(OpCode::Mul, e.un(OpCode::Expm1, e.bin(OpCode::Mul, x, e.c(input_scale, t))), e.c(alpha * scale, t));
  return {e.where(e.cmp(OpCode::Le, x, e.c(0, t)), neg, e.bin(OpCode::Mul, x, e.c(scale, t)))};
}
std::vector<Val> softplus(Emitter& e, const ir::Node& n) {  // softplus(self, beta, threshold)
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t), beta = e.in(n, 1, t);
  Val xb = e.bin(OpCode::Mul, x, beta);
  Val soft = e.bin(OpCode::Div, e.un(OpCode::Log1p, e.un(OpCode::Exp, xb)), beta);
  return {e.where(e.cmp(OpCode::Gt, xb, e.in(n, 2, t)), x, soft)};
}
std::vector<Val> softplus_backward(Emitter& e, const ir::Node& n) {  // (grad, self, beta, threshold)
  const DType t = e.compute_dtype(n);
  Val g = e.in(n, 0, t), x = e.in(n, 1, t), beta = e.in(n, 2, t);
  Val xb = e.bin(OpCode::Mul, x, beta);
  Val z = e.un(OpCode::Exp, xb);
  Val soft = e.bin(OpCode::Div, e.bin(OpCode::Mul, g, z), e.bin(OpCode::Add, z, e.c(1, t)));
  return {e.where(e.cmp(OpCode::Gt, xb, e.in(n, 3, t)), g, soft)};
}
static std::vector<Val> hardsigmoid_of(Emitter& e, Val x) {
  const DType t = x.dtype;
  Val c = e.bin(OpCode::Min, e.bin(OpCode::Max, e.bin(OpCode::Add, x, e.c(3, t)), e.c(0, t)), e.c(6, t));
  return {e.bin(OpCode::Div, c, e.c(6, t))};
}
std::vector<Val> hardsigmoid(Emitter& e, const ir::Node& n) { return hardsigmoid_of(e, e.in(n, 0, e.compute_dtype(n))); }
std::vector<Val> hardswish(Emitter& e, const ir::Node& n) {
  Val x = e.in(n, 0, e.compute_dtype(n));
  return {e.bin(OpCode::Mul, x, hardsigmoid_of(e, x)[0])};
}
std::vector<Val> mish(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  return {e.bin(OpCode::Mul, x, e.un(OpCode::Tanh, e.un(OpCode::Log1p, e.un(OpCode::Exp, x))))};
}
std::vector<Val> clamp(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  Val x = e.in(n, 0, t);
  if (!e.is_none(n, 1)) x = e.bin(OpCode::Max, x, e.in(n, 1, t));
  if (!e.is_none(n, 2)) x = e.bin(OpCode::Min, x, e.in(n, 2, t));
  return {x};
}
std::vector<Val> clamp_min(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  return {e.bin(OpCode::Max, e.in(n, 0, t), e.in(n, 1, t))};
}
std::vector<Val> clamp_max(Emitter& e, const ir::Node& n) {
  const DType t = e.compute_dtype(n);
  return {e.bin(OpCode::Min, e.in(n, 0, t), e.in(n, 1, t))};
}

}  // namespace tcap::fuse::activations
