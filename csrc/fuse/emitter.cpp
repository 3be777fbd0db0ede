#include "fuse/emitter.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <optional>

namespace tcap::fuse {

using kir::DType;
using kir::OpCode;

std::optional<kir::DType> to_kir(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return DType::Bool;
    case c10::kByte: return DType::U8;
    case c10::kChar: return DType::I8;
    case c10::kShort: return DType::I16;
    case c10::kInt: return DType::I32;
    case c10::kLong: return DType::I64;
    case c10::kHalf: return DType::F16;
    case c10::kBFloat16: return DType::BF16;
    case c10::kFloat: return DType::F32;
    case c10::kDouble: return DType::F64;
    default: return std::nullopt;
  }
}

DType compute_type(DType t) { return t == DType::BF16 || t == DType::F16 ? DType::F32 : t; }

bool Emitter::is_tensor(const ir::Node& n, size_t i) const {
  return i < n.args.size() && (n.args[i].kind == ir::ArgKind::Value);
}
bool Emitter::is_none(const ir::Node& n, size_t i) const {
  return i >= n.args.size() || n.args[i].kind == ir::ArgKind::None;
}

Val Emitter::in(const ir::Node& n, size_t i, DType want) {
  const ir::Arg& a = n.args.at(i);
  switch (a.kind) {
    case ir::ArgKind::Value: return cast(resolve_(a.values[0]), want);
    case ir::ArgKind::Double: return c(a.d, want);
    case ir::ArgKind::Int:
    case ir::ArgKind::Bool: return c(static_cast<double>(a.i), want);
    case ir::ArgKind::WrappedScalar: {
      const auto st = static_cast<c10::ScalarType>(a.i2);
      return c(c10::isFloatingType(st) ? a.d : static_cast<double>(a.i), want);
    }
    default: break;
  }
  TORCH_CHECK(false, "tcap fusion: ", n.qualified_op(), " argument ", i, " (", a.name, ") is a ",
              ir::to_string(a.kind), ", not a tensor or a scalar");
}

Val Emitter::in_mapped(const ir::Node& n, size_t i, DType want, const std::vector<int>& src) {
  const ir::Arg& a = n.args.at(i);
  TORCH_CHECK(a.kind == ir::ArgKind::Value && resolve_mapped_, "tcap fusion: ", n.qualified_op(), " argument ", i,
              " (", a.name, ") cannot be read along the group's dims");
  return cast(resolve_mapped_(a.values[0], src), want);
}

namespace {
void check_constant(const ir::Node& n, size_t i) {
  const ir::Arg& a = n.args.at(i);
  TORCH_CHECK(a.kind != ir::ArgKind::Value && a.kind != ir::ArgKind::ValueList && a.kind != ir::ArgKind::OptValueList,
              "argument '", a.name, "' of ", n.qualified_op(),
              " is a host scalar, which its kernel would need as a constant");
}
}  // namespace

double Emitter::real(const ir::Node& n, size_t i) const {
  check_constant(n, i);
  const ir::Arg& a = n.args.at(i);
  if (a.kind == ir::ArgKind::Double) return a.d;
  if (a.kind == ir::ArgKind::WrappedScalar) {
    return c10::isFloatingType(static_cast<c10::ScalarType>(a.i2)) ? a.d : static_cast<double>(a.i);
  }
  return static_cast<double>(a.i);
}
int64_t Emitter::integer(const ir::Node& n, size_t i) const {
  check_constant(n, i);
  return n.args.at(i).i;
}
std::string Emitter::str(const ir::Node& n, size_t i) const {
  check_constant(n, i);
  return n.args.at(i).s;
}
bool Emitter::is_constant(const ir::Node& n, size_t i, double v) const {
  if (i >= n.args.size()) return false;
  switch (n.args[i].kind) {
    case ir::ArgKind::Double:
    case ir::ArgKind::Int:
    case ir::ArgKind::Bool:
    case ir::ArgKind::WrappedScalar: return real(n, i) == v;
    default: return false;
  }
}

Val Emitter::c(double v, DType t) {
  kir::Instr in;
  in.op = OpCode::Const;
  in.dtype = t;
  if (kir::is_floating(t)) {
    in.f = v;
  } else if (t == DType::Bool) {
    in.i = v != 0;
  } else {
    in.i = static_cast<int64_t>(v);
  }
  return {kir::add(k_, std::move(in)), t};
}

Val Emitter::cast(Val v, DType t) {
  if (v.dtype == t) return v;
  kir::Instr in;
  in.op = OpCode::Cast;
  in.dtype = t;
  in.args = {v.id};
  return {kir::add(k_, std::move(in)), t};
}

Val Emitter::un(OpCode op, Val a) {
  kir::Instr in;
  in.op = op;
  in.dtype = op == OpCode::IsNan ? DType::Bool : a.dtype;
  in.args = {a.id};
  return {kir::add(k_, std::move(in)), in.dtype};
}

Val Emitter::bin(OpCode op, Val a, Val b) {
  TORCH_INTERNAL_ASSERT(a.dtype == b.dtype, "tcap fusion: ", kir::to_string(op), " of ", kir::to_string(a.dtype),
                        " and ", kir::to_string(b.dtype));
  kir::Instr in;
  in.op = op;
  in.dtype = a.dtype;
  in.args = {a.id, b.id};
  return {kir::add(k_, std::move(in)), a.dtype};
}

Val Emitter::cmp(OpCode op, Val a, Val b) {
  TORCH_INTERNAL_ASSERT(a.dtype == b.dtype);
  kir::Instr in;
  in.op = op;
  in.dtype = DType::Bool;
  in.args = {a.id, b.id};
  return {kir::add(k_, std::move(in)), DType::Bool};
}

Val Emitter::where(Val cond, Val a, Val b) {
  TORCH_INTERNAL_ASSERT(cond.dtype == DType::Bool && a.dtype == b.dtype);
  kir::Instr in;
  in.op = OpCode::Where;
  in.dtype = a.dtype;
  in.args = {cond.id, a.id, b.id};
  return {kir::add(k_, std::move(in)), a.dtype};
}

Val Emitter::mul_add(Val a, Val b, Val c) {
  TORCH_INTERNAL_ASSERT(a.dtype == b.dtype && b.dtype == c.dtype);
  if (!kir::is_floating(a.dtype)) return bin(OpCode::Add, bin(OpCode::Mul, a, b), c);
  kir::Instr in;
  in.op = OpCode::Fma;
  in.dtype = a.dtype;
  in.args = {a.id, b.id, c.id};
  return {kir::add(k_, std::move(in)), a.dtype};
}

Val Emitter::reduce(OpCode op, Val a) {
  kir::Instr in;
  in.op = op;
  in.dtype = a.dtype;
  in.args = {a.id};
  return {kir::add(k_, std::move(in)), a.dtype};
}

DType Emitter::out_dtype(const ir::Node& n, size_t k) const {
  size_t seen = 0;
  for (const auto& o : n.outputs) {
    if (o.kind != ir::ArgKind::Value) continue;
    if (seen++ == k) return *to_kir(g_.value(o.values[0]).meta.dtype);
  }
  TORCH_INTERNAL_ASSERT(false, "tcap fusion: ", n.qualified_op(), " has no tensor output ", k);
}

DType Emitter::compute_dtype(const ir::Node& n, size_t k) const { return compute_type(out_dtype(n, k)); }

DType Emitter::promoted(const ir::Node& n, std::initializer_list<size_t> args) const {
  // ATen's result_type: dimensioned tensors win over zero-dim tensors, which win over
  // wrapped numbers and scalars, unless a lower-priority argument is of a higher category
  // (bool < integer < floating).
  auto category = [](c10::ScalarType t) { return t == c10::kBool ? 0 : c10::isIntegralType(t, false) ? 1 : 2; };
  std::optional<c10::ScalarType> dim_t, zero_t, wrapped_t;
  auto merge = [](std::optional<c10::ScalarType>& s, c10::ScalarType t) { s = s ? c10::promoteTypes(*s, t) : t; };
  for (size_t i : args) {
    const ir::Arg& a = n.args.at(i);
    if (a.kind == ir::ArgKind::Value && ir::is_host_scalar(g_, a.values[0])) {
      merge(wrapped_t, c10::kDouble);  // a number in place of a Double or a wrapped double
    } else if (a.kind == ir::ArgKind::Value) {
      const auto& m = g_.value(a.values[0]).meta;
      merge(m.sizes.empty() ? zero_t : dim_t, m.dtype);
    } else if (a.kind == ir::ArgKind::WrappedScalar) {
      merge(wrapped_t, c10::isFloatingType(static_cast<c10::ScalarType>(a.i2)) ? c10::kDouble : c10::kLong);
    } else if (a.kind == ir::ArgKind::Double) {
      merge(wrapped_t, c10::kDouble);
    } else if (a.kind == ir::ArgKind::Int) {
      merge(wrapped_t, c10::kLong);
    } else if (a.kind == ir::ArgKind::Bool) {
      merge(wrapped_t, c10::kBool);
    }
  }
  c10::ScalarType r = dim_t ? *dim_t : zero_t ? *zero_t : wrapped_t ? *wrapped_t : c10::kFloat;
  auto lift = [&](const std::optional<c10::ScalarType>& lower) {
    if (lower && category(*lower) > category(r)) {
      r = category(*lower) == 2 ? (c10::isFloatingType(*lower) && *lower != c10::kDouble ? *lower : c10::kFloat) : *lower;
    }
  };
  if (dim_t) lift(zero_t);
  lift(wrapped_t);
  if (wrapped_t && !dim_t && !zero_t) r = *wrapped_t == c10::kDouble ? c10::kDouble : *wrapped_t;
  auto k = to_kir(r);
  TORCH_CHECK(k, "tcap fusion: unsupported promoted dtype");
  return compute_type(*k);
}

}  // namespace tcap::fuse
