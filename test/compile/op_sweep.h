// The op sweep's table (op_sweep_ops.cpp): one row per case, its inputs described by
// kind and shape, and the function the sweep compiles and compares with eager
// (op_sweep.cpp says how). Apart from the runner so that adding an op touches only the
// table. Internal to the op sweep binaries (test/CMakeLists.txt).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tcap::test::op_sweep {

using Tensors = std::vector<at::Tensor>;
using Shape = std::vector<int64_t>;
using Fn = std::function<Tensors(const Tensors&)>;

enum class Kind {
  Float,   // randn, requires grad (a leaf)
  Other,   // randn of the other float dtype (f64 in an f32 case and f32 in an f64 case), requires grad
  Const,   // randn, no grad
  Pos,     // uniform in [0.5, 1.5), no grad (variances, weights, Poisson targets)
  Prob,    // uniform in [0.05, 0.95), no grad (probability targets)
  Sign,    // +1 / -1, no grad (margin / hinge targets)
  Mask,    // bool
  Index,   // int64 in [0, high)
  Unique,  // int64 in [0, high), distinct along the last dim
};

struct Spec {
  Kind kind;
  Shape shape;
  int64_t high = 0;
};

inline Spec F(Shape s) { return {Kind::Float, std::move(s)}; }
inline Spec Oth(Shape s) { return {Kind::Other, std::move(s)}; }
inline Spec C(Shape s) { return {Kind::Const, std::move(s)}; }
inline Spec Pos(Shape s) { return {Kind::Pos, std::move(s)}; }
inline Spec Prob(Shape s) { return {Kind::Prob, std::move(s)}; }
inline Spec Sgn(Shape s) { return {Kind::Sign, std::move(s)}; }
inline Spec Mask(Shape s) { return {Kind::Mask, std::move(s)}; }
inline Spec Idx(Shape s, int64_t high) { return {Kind::Index, std::move(s), high}; }
inline Spec Uniq(Shape s, int64_t high) { return {Kind::Unique, std::move(s), high}; }

struct Row {
  std::string name;
  std::vector<Spec> inputs;
  Fn fn;
  double tol = 1;          // scales rtol and atol
  bool noncontig = true;   // also run with non-contiguous inputs
};

// The table, built once.
const std::vector<Row>& rows();

}  // namespace tcap::test::op_sweep
