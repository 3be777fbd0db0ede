// The per-op table of the CPU renderer: how each kir OpCode and DType becomes LLVM IR.
// See Note [CPU value representation] in emit.h.
#include "codegen/cpu_llvm/emit.h"

#include <c10/util/Exception.h>

#include <llvm/ADT/APInt.h>
#include <llvm/IR/Constants.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace tcap::codegen::cpu_llvm {

using kir::DType;
using kir::OpCode;
using llvm::Value;

namespace {

bool is_signed_int(DType t) {
  return t == DType::I8 || t == DType::I16 || t == DType::I32 || t == DType::I64;
}

// c10::BFloat16's rounding: nearest even, every NaN -> 0x7fc0.
uint16_t bf16_bits(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

int ValueEmitter::lanes_of(Value* v) {
  if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(v->getType())) return static_cast<int>(vt->getNumElements());
  return 1;
}

llvm::Type* ValueEmitter::scalar_type(DType t) const {
  auto& c = m_.getContext();
  switch (t) {
    case DType::Bool: return llvm::Type::getInt1Ty(c);
    case DType::U8:
    case DType::I8: return llvm::Type::getInt8Ty(c);
    case DType::I16:
    case DType::BF16: return llvm::Type::getInt16Ty(c);
    case DType::I32: return llvm::Type::getInt32Ty(c);
    case DType::I64: return llvm::Type::getInt64Ty(c);
    case DType::F16: return llvm::Type::getHalfTy(c);
    case DType::F32: return llvm::Type::getFloatTy(c);
    case DType::F64: return llvm::Type::getDoubleTy(c);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown kir dtype");
}

llvm::Type* ValueEmitter::memory_type(DType t) const {
  return t == DType::Bool ? llvm::Type::getInt8Ty(m_.getContext()) : scalar_type(t);
}

llvm::Type* ValueEmitter::vector_type(llvm::Type* scalar, int lanes) const {
  return lanes == 1 ? scalar : llvm::FixedVectorType::get(scalar, static_cast<unsigned>(lanes));
}

Value* ValueEmitter::splat(Value* v, int lanes) {
  return lanes == 1 ? v : b_.CreateVectorSplat(static_cast<unsigned>(lanes), v);
}

Value* ValueEmitter::float_const(llvm::Type* scalar, double v, int lanes) {
  return llvm::ConstantFP::get(vector_type(scalar, lanes), v);
}

Value* ValueEmitter::int_const(llvm::Type* scalar, uint64_t v, int lanes) {
  return llvm::ConstantInt::get(vector_type(scalar, lanes), v);
}

Value* ValueEmitter::constant(const kir::Instr& in, int lanes) {
  switch (in.dtype) {
    case DType::F64: return float_const(b_.getDoubleTy(), in.f, lanes);
    // Through float first, as ATen's scalar_to<Half>(double) does.
    case DType::F32:
    case DType::F16: return float_const(scalar_type(in.dtype), static_cast<double>(static_cast<float>(in.f)), lanes);
    case DType::BF16: return int_const(b_.getInt16Ty(), bf16_bits(static_cast<float>(in.f)), lanes);
    case DType::Bool: return int_const(b_.getInt1Ty(), in.i != 0 ? 1 : 0, lanes);
    default: return int_const(scalar_type(in.dtype), static_cast<uint64_t>(in.i), lanes);
  }
}

Value* ValueEmitter::from_memory(Value* v, DType t) {
  if (t != DType::Bool) return v;
  return b_.CreateICmpNE(v, llvm::Constant::getNullValue(v->getType()));
}

Value* ValueEmitter::to_memory(Value* v, DType t) {
  if (t != DType::Bool) return v;
  return b_.CreateZExt(v, vector_type(b_.getInt8Ty(), lanes_of(v)));
}

Value* ValueEmitter::bf16_to_f32(Value* bits) {
  const int lanes = lanes_of(bits);
  Value* wide = b_.CreateZExt(bits, vector_type(b_.getInt32Ty(), lanes));
  return b_.CreateBitCast(b_.CreateShl(wide, 16), vector_type(b_.getFloatTy(), lanes));
}

Value* ValueEmitter::f32_to_bf16(Value* f) {
  const int lanes = lanes_of(f);
  llvm::Type* i32 = b_.getInt32Ty();
  Value* u = b_.CreateBitCast(f, vector_type(i32, lanes));
  Value* lsb = b_.CreateAnd(b_.CreateLShr(u, 16), int_const(i32, 1, lanes));
  Value* rounded = b_.CreateAdd(b_.CreateAdd(u, int_const(i32, 0x7fff, lanes)), lsb);
  Value* hi = b_.CreateTrunc(b_.CreateLShr(rounded, 16), vector_type(b_.getInt16Ty(), lanes));
  return b_.CreateSelect(b_.CreateFCmpUNO(f, f), int_const(b_.getInt16Ty(), 0x7fc0, lanes), hi);
}

Value* ValueEmitter::to_compute(Value* v, DType t) {
  if (t == DType::BF16) return bf16_to_f32(v);
  if (t == DType::F16) return b_.CreateFPExt(v, vector_type(b_.getFloatTy(), lanes_of(v)));
  return v;
}

Value* ValueEmitter::from_compute(Value* v, DType t) {
  if (t == DType::BF16) return f32_to_bf16(v);
  if (t == DType::F16) return b_.CreateFPTrunc(v, vector_type(b_.getHalfTy(), lanes_of(v)));
  return v;
}

// Cast semantics of kir.h. Float -> I32/I64 saturates (llvm.fptosi.sat; NaN -> 0) where
// C++ leaves out-of-range values undefined; float -> 8/16-bit types goes through int64 and
// truncates, as c10::convert does for uint8.
Value* ValueEmitter::cast(Value* v, DType from, DType to) {
  if (from == to) return v;
  const int lanes = lanes_of(v);
  if (to == DType::Bool) {
    if (kir::is_floating(from)) {
      Value* x = to_compute(v, from);
      return b_.CreateFCmpUNE(x, llvm::Constant::getNullValue(x->getType()));
    }
    return b_.CreateICmpNE(v, llvm::Constant::getNullValue(v->getType()));
  }
  llvm::Type* wide_float = vector_type(to == DType::F64 ? b_.getDoubleTy() : b_.getFloatTy(), lanes);
  if (from == DType::Bool) {
    if (kir::is_floating(to)) return from_compute(b_.CreateUIToFP(v, wide_float), to);
    return b_.CreateZExt(v, vector_type(scalar_type(to), lanes));
  }
  const bool ff = kir::is_floating(from);
  const bool tf = kir::is_floating(to);
  if (ff && tf) {
    Value* x = to_compute(v, from);
    if (x->getType() != wide_float) {
      x = to == DType::F64 ? b_.CreateFPExt(x, wide_float) : b_.CreateFPTrunc(x, wide_float);
    }
    return from_compute(x, to);
  }
  if (ff) {
    Value* x = to_compute(v, from);
    llvm::Type* target = vector_type(scalar_type(to), lanes);
    if (to == DType::I32 || to == DType::I64) {
      return b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {target, x->getType()}, {x});
    }
    llvm::Type* i64 = vector_type(b_.getInt64Ty(), lanes);
    return b_.CreateTrunc(b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {i64, x->getType()}, {x}), target);
  }
  if (tf) {
    Value* x = is_signed_int(from) ? b_.CreateSIToFP(v, wide_float) : b_.CreateUIToFP(v, wide_float);
    return from_compute(x, to);
  }
  return b_.CreateIntCast(v, vector_type(scalar_type(to), lanes), is_signed_int(from));
}

Value* ValueEmitter::op(const kir::Kernel& k, const kir::Instr& in, const std::vector<Value*>& args) {
  const DType at = args.empty() ? in.dtype : k.instrs[static_cast<size_t>(in.args[0])].dtype;
  switch (in.op) {
    case OpCode::Cast: return cast(args[0], at, in.dtype);
    case OpCode::IsNan: {
      Value* x = to_compute(args[0], at);
      return b_.CreateFCmpUNO(x, x);
    }
    case OpCode::Not: return b_.CreateNot(args[0]);
    case OpCode::And: return b_.CreateAnd(args[0], args[1]);
    case OpCode::Or: return b_.CreateOr(args[0], args[1]);
    case OpCode::Where: return b_.CreateSelect(args[0], args[1], args[2]);
    case OpCode::Lt:
    case OpCode::Le:
    case OpCode::Gt:
    case OpCode::Ge:
    case OpCode::Eq:
    case OpCode::Ne: return compare(in.op, at, args[0], args[1]);
    default: break;
  }
  if (kir::is_floating(in.dtype)) {
    std::vector<Value*> x;
    for (Value* a : args) x.push_back(to_compute(a, in.dtype));
    return from_compute(float_op(k, in, x), in.dtype);
  }
  return int_op(in, args);
}

namespace {

// Bounds [lo, hi] of the non-NaN values of instruction `v` (-inf/+inf where unknown), by
// interval arithmetic over the few ops that bound their results, in one pass over the
// instructions up to `v` (operands come before their users). A float type's rounding may
// move a bound slightly, but never across +-1 (representable, and rounding is monotonic),
// which is what within_one needs.
std::pair<double, double> bounds(const kir::Kernel& k, int32_t v, const std::vector<bool>& launch_consts) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, double>> b(static_cast<size_t>(v) + 1, {-inf, inf});
  for (size_t i = 0; i < b.size(); ++i) {
    const kir::Instr& in = k.instrs[i];
    if (!kir::is_floating(in.dtype)) continue;
    auto arg = [&](size_t a) { return b[static_cast<size_t>(in.args[a])]; };
    switch (in.op) {
      case OpCode::Const:
        if (i < launch_consts.size() && launch_consts[i]) break;  // any value
        if (in.dtype == DType::F64) b[i] = {in.f, in.f};
        if (in.dtype == DType::F32) b[i] = {static_cast<float>(in.f), static_cast<float>(in.f)};
        break;
      case OpCode::Sin:
      case OpCode::Cos:
      case OpCode::Tanh:
      case OpCode::Erf: b[i] = {-1.0, 1.0}; break;
      case OpCode::Neg: b[i] = {-arg(0).second, -arg(0).first}; break;
      case OpCode::Abs: {
        const auto [lo, hi] = arg(0);
        b[i] = {lo >= 0 ? lo : hi <= 0 ? -hi : 0.0, std::max(std::fabs(lo), std::fabs(hi))};
        break;
      }
      case OpCode::Max: b[i] = {std::max(arg(0).first, arg(1).first), std::max(arg(0).second, arg(1).second)}; break;
      case OpCode::Min: b[i] = {std::min(arg(0).first, arg(1).first), std::min(arg(0).second, arg(1).second)}; break;
      case OpCode::Where: b[i] = {std::min(arg(1).first, arg(2).first), std::max(arg(1).second, arg(2).second)}; break;
      case OpCode::Cast:
        if (kir::is_floating(k.instrs[static_cast<size_t>(in.args[0])].dtype)) b[i] = arg(0);
        break;
      default: break;
    }
  }
  return b.back();
}

// Whether every non-NaN value of instruction `v` lies in [-1, 1]: sin, cos, tanh, erf,
// clamp(x, -1, 1), and what negation, abs, min, max, where and float casts make of them.
bool within_one(const kir::Kernel& k, int32_t v, const std::vector<bool>& launch_consts) {
  const auto [lo, hi] = bounds(k, v, launch_consts);
  return lo >= -1.0 && hi <= 1.0;
}

}  // namespace

Value* ValueEmitter::float_op(const kir::Kernel& k, const kir::Instr& in, const std::vector<Value*>& x) {
  namespace I = llvm::Intrinsic;
  Value* a = x[0];
  Value* c = x.size() > 1 ? x[1] : nullptr;
  Value* one = llvm::ConstantFP::get(a->getType(), 1.0);
  switch (in.op) {
    case OpCode::Neg: return b_.CreateFNeg(a);
    case OpCode::Abs: return b_.CreateUnaryIntrinsic(I::fabs, a);
    case OpCode::Sin:
    case OpCode::Cos:
      if (a->getType()->getScalarType()->isFloatTy() && t_.has_fma) {
        return sin_cos_f32(in.op, a, within_one(k, in.args[0], launch_consts));
      }
      return math(in.op, a, nullptr);
    case OpCode::Exp:
    case OpCode::Erf:
      if (a->getType()->getScalarType()->isFloatTy() && t_.has_fma) {
        return in.op == OpCode::Exp ? exp_f32(a) : erf_f32(a);
      }
      return math(in.op, a, nullptr);
    case OpCode::Log:
    case OpCode::Log1p:
    case OpCode::Expm1:
    case OpCode::Tan:
    case OpCode::Tanh: return math(in.op, a, nullptr);
    case OpCode::Sqrt: return b_.CreateUnaryIntrinsic(I::sqrt, a);
    // 1/sqrt(x) with a correctly rounded division, not the ~12-bit rsqrtps estimate.
    case OpCode::Rsqrt: return b_.CreateFDiv(one, b_.CreateUnaryIntrinsic(I::sqrt, a));
    case OpCode::Recip: return b_.CreateFDiv(one, a);
    case OpCode::Floor: return b_.CreateUnaryIntrinsic(I::floor, a);
    case OpCode::Ceil: return b_.CreateUnaryIntrinsic(I::ceil, a);
    case OpCode::Round: return b_.CreateUnaryIntrinsic(I::roundeven, a);
    case OpCode::Trunc: return b_.CreateUnaryIntrinsic(I::trunc, a);
    case OpCode::Add: return b_.CreateFAdd(a, c);
    // Note [Fused multiply-add] (fuse/lowering.cpp): one rounding where the target has
    // FMA, as ATen's kernels compute there; a multiply and an add where it has not.
    case OpCode::Fma:
      if (t_.has_fma) return b_.CreateIntrinsic(I::fma, {a->getType()}, {a, c, x[2]});
      return b_.CreateFAdd(b_.CreateFMul(a, c), x[2]);
    case OpCode::Sub: return b_.CreateFSub(a, c);
    case OpCode::Mul: return b_.CreateFMul(a, c);
    case OpCode::Div: return b_.CreateFDiv(a, c);
    case OpCode::Pow: return pow(k, in, a, c);
    // NaN-propagating, -0 < +0: torch.maximum / torch.minimum.
    case OpCode::Max: return b_.CreateBinaryIntrinsic(I::maximum, a, c);
    case OpCode::Min: return b_.CreateBinaryIntrinsic(I::minimum, a, c);
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "cpu_llvm: no floating lowering for ", kir::to_string(in.op));
}

// ATen's pow_tensor_scalar_optimized_kernel special-cases these exponents; doing the same
// keeps results bit-identical (and fast) for x**2, x**0.5, 1/x ...
Value* ValueEmitter::pow(const kir::Kernel& k, const kir::Instr& in, Value* x, Value* y) {
  const kir::Instr& e = k.instrs[static_cast<size_t>(in.args[1])];
  if (literal(k, in.args[1])) {
    const double p = in.dtype == DType::F64 ? e.f : static_cast<double>(static_cast<float>(e.f));
    Value* one = llvm::ConstantFP::get(x->getType(), 1.0);
    if (p == 2.0) return b_.CreateFMul(x, x);
    if (p == 3.0) return b_.CreateFMul(b_.CreateFMul(x, x), x);
    if (p == 0.5) return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x);
    if (p == -0.5) return b_.CreateFDiv(one, b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x));
    if (p == -1.0) return b_.CreateFDiv(one, x);
    if (p == -2.0) return b_.CreateFDiv(one, b_.CreateFMul(x, x));
  }
  return math(OpCode::Pow, x, y);
}

Value* ValueEmitter::int_op(const kir::Instr& in, const std::vector<Value*>& x) {
  namespace I = llvm::Intrinsic;
  const bool boolean = in.dtype == DType::Bool;
  const bool sgn = is_signed_int(in.dtype);
  Value* a = x[0];
  Value* c = x.size() > 1 ? x[1] : nullptr;
  switch (in.op) {
    case OpCode::Neg: return b_.CreateNeg(a);
    case OpCode::Abs:
      if (!sgn) return a;
      return b_.CreateIntrinsic(I::abs, {a->getType()}, {a, b_.getFalse()});
    case OpCode::Add: return boolean ? b_.CreateOr(a, c) : b_.CreateAdd(a, c);
    case OpCode::Sub: return b_.CreateSub(a, c);
    case OpCode::Mul: return boolean ? b_.CreateAnd(a, c) : b_.CreateMul(a, c);
    case OpCode::Div: return int_div(in.dtype, a, c);
    case OpCode::Max:
      if (boolean) return b_.CreateOr(a, c);
      return b_.CreateBinaryIntrinsic(sgn ? I::smax : I::umax, a, c);
    case OpCode::Min:
      if (boolean) return b_.CreateAnd(a, c);
      return b_.CreateBinaryIntrinsic(sgn ? I::smin : I::umin, a, c);
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "cpu_llvm: no integer lowering for ", kir::to_string(in.op), ".",
                        kir::to_string(in.dtype));
}

// Truncating integer division that never traps: x / 0 gives 0 (ATen raises instead) and
// INT_MIN / -1 wraps to INT_MIN.
Value* ValueEmitter::int_div(DType t, Value* a, Value* d) {
  llvm::Type* ty = a->getType();
  Value* zero = llvm::Constant::getNullValue(ty);
  Value* one = llvm::ConstantInt::get(ty, 1);
  Value* is_zero = b_.CreateICmpEQ(d, zero);
  if (!is_signed_int(t)) return b_.CreateSelect(is_zero, zero, b_.CreateUDiv(a, b_.CreateSelect(is_zero, one, d)));
  const unsigned bits = ty->getScalarSizeInBits();
  Value* int_min = llvm::ConstantInt::get(ty, llvm::APInt::getSignedMinValue(bits));
  Value* overflow = b_.CreateAnd(b_.CreateICmpEQ(a, int_min), b_.CreateICmpEQ(d, llvm::Constant::getAllOnesValue(ty)));
  Value* safe = b_.CreateSelect(b_.CreateOr(is_zero, overflow), one, d);
  return b_.CreateSelect(is_zero, zero, b_.CreateSDiv(a, safe));
}

// Ordered comparisons (false on NaN) except Ne (true on NaN), as in C++ and ATen.
Value* ValueEmitter::compare(OpCode op, DType t, Value* a, Value* c) {
  using P = llvm::CmpInst::Predicate;
  if (kir::is_floating(t)) {
    a = to_compute(a, t);
    c = to_compute(c, t);
    P p = op == OpCode::Lt ? P::FCMP_OLT
        : op == OpCode::Le ? P::FCMP_OLE
        : op == OpCode::Gt ? P::FCMP_OGT
        : op == OpCode::Ge ? P::FCMP_OGE
        : op == OpCode::Eq ? P::FCMP_OEQ
                           : P::FCMP_UNE;
    return b_.CreateFCmp(p, a, c);
  }
  const bool s = is_signed_int(t);
  P p = op == OpCode::Lt ? (s ? P::ICMP_SLT : P::ICMP_ULT)
      : op == OpCode::Le ? (s ? P::ICMP_SLE : P::ICMP_ULE)
      : op == OpCode::Gt ? (s ? P::ICMP_SGT : P::ICMP_UGT)
      : op == OpCode::Ge ? (s ? P::ICMP_SGE : P::ICMP_UGE)
      : op == OpCode::Eq ? P::ICMP_EQ
                         : P::ICMP_NE;
  return b_.CreateICmp(p, a, c);
}

Value* ValueEmitter::reduce_identity(OpCode op, DType t, int lanes) {
  if (kir::is_floating(t)) {
    llvm::Type* ct = t == DType::F64 ? b_.getDoubleTy() : b_.getFloatTy();
    const double inf = std::numeric_limits<double>::infinity();
    return float_const(ct, op == OpCode::ReduceSum ? 0.0 : op == OpCode::ReduceMax ? -inf : inf, lanes);
  }
  llvm::Type* ty = vector_type(scalar_type(t), lanes);
  const unsigned bits = scalar_type(t)->getScalarSizeInBits();
  if (op == OpCode::ReduceSum) return llvm::Constant::getNullValue(ty);
  if (t == DType::Bool) return int_const(b_.getInt1Ty(), op == OpCode::ReduceMin ? 1 : 0, lanes);
  const bool sgn = is_signed_int(t);
  if (op == OpCode::ReduceMax) {
    return llvm::ConstantInt::get(ty, sgn ? llvm::APInt::getSignedMinValue(bits) : llvm::APInt::getMinValue(bits));
  }
  return llvm::ConstantInt::get(ty, sgn ? llvm::APInt::getSignedMaxValue(bits) : llvm::APInt::getMaxValue(bits));
}

Value* ValueEmitter::reduce_combine(OpCode op, DType t, Value* acc, Value* x) {
  namespace I = llvm::Intrinsic;
  if (kir::is_floating(t)) {
    if (op == OpCode::ReduceSum) return b_.CreateFAdd(acc, x);
    return b_.CreateBinaryIntrinsic(op == OpCode::ReduceMax ? I::maximum : I::minimum, acc, x);
  }
  if (t == DType::Bool) return op == OpCode::ReduceMax ? b_.CreateOr(acc, x) : b_.CreateAnd(acc, x);
  if (op == OpCode::ReduceSum) return b_.CreateAdd(acc, x);
  const bool sgn = is_signed_int(t);
  if (op == OpCode::ReduceMax) return b_.CreateBinaryIntrinsic(sgn ? I::smax : I::umax, acc, x);
  return b_.CreateBinaryIntrinsic(sgn ? I::smin : I::umin, acc, x);
}

Value* ValueEmitter::reduce_horizontal(OpCode op, DType t, Value* vec) {
  if (kir::is_floating(t)) {
    if (op == OpCode::ReduceSum) {
      // reassoc: a log2(lanes) shuffle tree instead of a serial chain (Note [CPU summation order]).
      llvm::Type* ct = vec->getType()->getScalarType();
      llvm::CallInst* r = b_.CreateFAddReduce(llvm::ConstantFP::getNegativeZero(ct), vec);
      r->setHasAllowReassoc(true);
      return r;
    }
    return op == OpCode::ReduceMax ? b_.CreateFPMaximumReduce(vec) : b_.CreateFPMinimumReduce(vec);
  }
  if (t == DType::Bool) return op == OpCode::ReduceMax ? b_.CreateOrReduce(vec) : b_.CreateAndReduce(vec);
  if (op == OpCode::ReduceSum) return b_.CreateAddReduce(vec);
  const bool sgn = is_signed_int(t);
  return op == OpCode::ReduceMax ? b_.CreateIntMaxReduce(vec, sgn) : b_.CreateIntMinReduce(vec, sgn);
}

}  // namespace tcap::codegen::cpu_llvm
