// Transcendentals: glibc's libmvec for vectors, libm for scalars; f32 sin, cos, exp and
// erf inline.
//
// Note [CPU math library]
// LLVM's llvm.exp & co. stay scalar unless a vector library is configured, and a scalar
// call per lane would dominate a fused kernel. glibc (2.22+; 2.35+ for tanh, erf, expm1,
// log1p, tan) ships libmvec, whose functions follow the x86-64 vector function ABI:
//   _ZGV<isa>N<lanes><v...>_<name>   e.g. _ZGVdN8v_expf (AVX2, 8 x f32), _ZGVeN8v_exp
//   (AVX-512, 8 x f64), _ZGVbN4vv_powf (SSE, 4 x f32, two vector operands).
// The vector is passed and returned in one xmm/ymm/zmm register, which for 512-bit vectors
// needs the caller's "min-legal-vector-width"="512" (set by the renderer). The JIT resolves
// the names through a DynamicLibrarySearchGenerator on libmvec.so.1 (jit.cpp). glibc
// documents these functions as accurate to 4 ulp; tests measure it. A vector narrower than
// 128 bits is padded with zeros to the SSE variant; without libmvec (not x86-64 Linux, or
// the library cannot be loaded) each lane calls the scalar libm function.
#include "codegen/cpu_llvm/emit.h"

#include <c10/util/Exception.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/MDBuilder.h>

#include <algorithm>
#include <cstring>

namespace tcap::codegen::cpu_llvm {

using llvm::Value;

namespace {

const char* math_name(kir::OpCode op) {
  switch (op) {
    case kir::OpCode::Exp: return "exp";
    case kir::OpCode::Log: return "log";
    case kir::OpCode::Log1p: return "log1p";
    case kir::OpCode::Expm1: return "expm1";
    case kir::OpCode::Sin: return "sin";
    case kir::OpCode::Cos: return "cos";
    case kir::OpCode::Tan: return "tan";
    case kir::OpCode::Tanh: return "tanh";
    case kir::OpCode::Erf: return "erf";
    case kir::OpCode::Pow: return "pow";
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "cpu_llvm: ", kir::to_string(op), " is not a math library function");
}

}  // namespace

llvm::FunctionCallee ValueEmitter::math_function(const std::string& name, llvm::Type* t, int arity) {
  std::vector<llvm::Type*> params(static_cast<size_t>(arity), t);
  llvm::FunctionCallee f = m_.getOrInsertFunction(name, llvm::FunctionType::get(t, params, false));
  if (auto* fn = llvm::dyn_cast<llvm::Function>(f.getCallee())) {
    // No errno is read by kernels: treat the functions as pure, like clang -fno-math-errno.
    fn->setDoesNotThrow();
    fn->setWillReturn();
    fn->setDoesNotAccessMemory();
  }
  return f;
}

Value* ValueEmitter::call_scalar_math(const std::string& name, Value* x, Value* y) {
  llvm::FunctionCallee f = math_function(name, x->getType(), y ? 2 : 1);
  return y ? b_.CreateCall(f, {x, y}) : b_.CreateCall(f, {x});
}

Value* ValueEmitter::call_vector_math(const std::string& name, Value* x, Value* y) {
  const int lanes = lanes_of(x);
  if (!t_.libmvec) {
    Value* r = llvm::PoisonValue::get(x->getType());
    for (int l = 0; l < lanes; ++l) {
      Value* xl = b_.CreateExtractElement(x, static_cast<uint64_t>(l));
      Value* yl = y ? b_.CreateExtractElement(y, static_cast<uint64_t>(l)) : nullptr;
      r = b_.CreateInsertElement(r, call_scalar_math(name, xl, yl), static_cast<uint64_t>(l));
    }
    return r;
  }
  llvm::Type* st = x->getType()->getScalarType();
  const int elt_bits = static_cast<int>(st->getPrimitiveSizeInBits());
  const int reg_bits = std::max(128, std::min(lanes * elt_bits, t_.vector_bits));
  const int chunk = reg_bits / elt_bits;
  const char isa = reg_bits == 128 ? 'b' : reg_bits == 256 ? 'd' : 'e';
  const std::string vname =
      std::string("_ZGV") + isa + "N" + std::to_string(chunk) + (y ? "vv" : "v") + "_" + name;
  llvm::Type* ct = vector_type(st, chunk);
  llvm::FunctionCallee f = math_function(vname, ct, y ? 2 : 1);
  auto call = [&](Value* a, Value* c) { return c ? b_.CreateCall(f, {a, c}) : b_.CreateCall(f, {a}); };

  if (lanes <= chunk) {
    if (lanes == chunk) return call(x, y);
    // Pad to the narrowest register with zeros, then drop the extra lanes.
    std::vector<int> widen;
    for (int l = 0; l < chunk; ++l) widen.push_back(l < lanes ? l : lanes);
    Value* zeros = llvm::Constant::getNullValue(x->getType());
    Value* r = call(b_.CreateShuffleVector(x, zeros, widen), y ? b_.CreateShuffleVector(y, zeros, widen) : nullptr);
    std::vector<int> narrow;
    for (int l = 0; l < lanes; ++l) narrow.push_back(l);
    return b_.CreateShuffleVector(r, narrow);
  }
  // Wider than a register: call per register and concatenate (lanes / chunk is a power of 2).
  std::vector<Value*> parts;
  for (int p = 0; p < lanes / chunk; ++p) {
    std::vector<int> sel;
    for (int l = 0; l < chunk; ++l) sel.push_back(p * chunk + l);
    parts.push_back(call(b_.CreateShuffleVector(x, sel), y ? b_.CreateShuffleVector(y, sel) : nullptr));
  }
  while (parts.size() > 1) {
    std::vector<Value*> joined;
    for (size_t i = 0; i + 1 < parts.size(); i += 2) {
      const int n = lanes_of(parts[i]) * 2;
      std::vector<int> sel;
      for (int l = 0; l < n; ++l) sel.push_back(l);
      joined.push_back(b_.CreateShuffleVector(parts[i], parts[i + 1], sel));
    }
    parts = std::move(joined);
  }
  return parts[0];
}

Value* ValueEmitter::fma(Value* a, Value* m, Value* c) {
  return b_.CreateIntrinsic(llvm::Intrinsic::fma, {a->getType()}, {a, m, c});
}

Value* ValueEmitter::unless_rare(Value* rare, Value* fast, const std::string& name, const std::string& slow_block,
                                 const std::function<Value*()>& slow) {
  Value* any = lanes_of(rare) == 1 ? rare : b_.CreateOrReduce(rare);
  llvm::BasicBlock* fast_bb = b_.GetInsertBlock();
  llvm::Function* fn = fast_bb->getParent();
  auto& ctx = m_.getContext();
  auto* slow_bb = llvm::BasicBlock::Create(ctx, name + "." + slow_block, fn);
  auto* join_bb = llvm::BasicBlock::Create(ctx, name + ".join", fn);
  b_.CreateCondBr(any, slow_bb, join_bb, llvm::MDBuilder(ctx).createBranchWeights(1, 1 << 20));
  b_.SetInsertPoint(slow_bb);
  Value* slow_value = slow();
  llvm::BasicBlock* slow_end = b_.GetInsertBlock();
  b_.CreateBr(join_bb);
  b_.SetInsertPoint(join_bb);
  llvm::PHINode* phi = b_.CreatePHI(fast->getType(), 2, name);
  phi->addIncoming(fast, fast_bb);
  phi->addIncoming(slow_value, slow_end);
  return phi;
}

// Note [CPU sin and cos]
// f32 sin and cos (also the compute form of bf16 and f16) are emitted inline instead of
// calling libmvec, on targets with hardware FMA:
//   q = round(x * 2/pi)        adding and subtracting 1.5 * 2^23 in one FMA; the low bits
//                              of the sum's bit pattern are q mod 4
//   r = x - q * pi/2           three FMAs (Cody-Waite; pi/2 = C1 + C2 + C3 + 1.06e-23, the
//                              first product is exact, so r keeps its bits when x is near
//                              a multiple of pi/2)
//   s = r + r^3 P(r^2), c = 1 + r^2 (-1/2 + r^2 Q(r^2))   Cephes' sinf/cosf minimax
//                              polynomials on [-pi/4, pi/4]
//   sin x = (s, c, -s, -c)[q mod 4]; cos x is the same at q + 1.
// Checked against double sin/cos on every f32 in [0, 2^18]: at most 1.54 ulp
// (cpu_llvm_math_test.cpp; TCAP_EXHAUSTIVE=1 runs that sweep, about 90 s). Negative
// x mirrors exactly. A vector with a lane above kSinCosFastLimit (2^18) or infinite takes
// a branch that calls the library for the whole vector and keeps its result for those
// lanes; NaN stays NaN on the fast path; sin(-0) is -0.
// An argument known to lie in [-1, 1] (a sin, cos, tanh or erf, or a clamp to [-1, 1];
// `bounds` in ops.cpp) needs no reduction and no range test: a Taylor polynomial.
// Why not libmvec: the coscos backward needs sin(x) and cos(x) of one x and sin of the
// cos, its forward the cos of a cos; inline, LLVM shares the reduction and polynomials
// between sin(x) and cos(x) (only the final selects differ), the inner results take the
// short polynomial, and no call spills the kernel's live vectors (all vector registers
// are caller-saved in the x86-64 ABI). Without FMA the reduction would need shorter
// constants; those targets keep libmvec.
namespace {
constexpr float kSinCosFastLimit = 262144.0f;  // 2^18
}  // namespace

Value* ValueEmitter::sin_cos_f32(kir::OpCode op, Value* x, bool small_arg) {
  const bool is_cos = op == kir::OpCode::Cos;
  const int lanes = lanes_of(x);
  llvm::Type* ft = x->getType();
  llvm::Type* it = vector_type(b_.getInt32Ty(), lanes);
  auto f = [&](uint32_t bits) {
    float v;
    static_assert(sizeof v == sizeof bits);
    std::memcpy(&v, &bits, sizeof v);
    return float_const(b_.getFloatTy(), v, lanes);
  };
  auto fc = [&](float v) { return float_const(b_.getFloatTy(), v, lanes); };
  auto ic = [&](uint32_t v) { return int_const(b_.getInt32Ty(), v, lanes); };
  // x + (terms that are +0 at x = 0) is +0 for x = -0 (two zeros add to +0): sin keeps x's zero.
  auto keep_zero = [&](Value* sin) {
    return b_.CreateSelect(b_.CreateFCmpOEQ(x, fc(0.0f)), x, sin);
  };
  if (small_arg) {
    // |x| <= 1: no reduction. Taylor series to x^11 (sin) and x^12 (cos): the first
    // omitted terms are below 1.6e-10 and 1.2e-11, far under half an f32 ulp; the Horner
    // steps and the final FMA round to at most 0.97 ulp (every f32 in [0, 1]).
    Value* z = b_.CreateFMul(x, x);
    if (is_cos) {
      Value* p = fc(1.0f / 479001600.0f);
      for (float c : {-1.0f / 3628800.0f, 1.0f / 40320.0f, -1.0f / 720.0f, 1.0f / 24.0f, -0.5f}) p = fma(p, z, fc(c));
      return fma(p, z, fc(1.0f));
    }
    Value* p = fc(-1.0f / 39916800.0f);
    for (float c : {1.0f / 362880.0f, -1.0f / 5040.0f, 1.0f / 120.0f, -1.0f / 6.0f}) p = fma(p, z, fc(c));
    return keep_zero(fma(p, b_.CreateFMul(z, x), x));
  }
  Value* magic = fc(12582912.0f);                           // 1.5 * 2^23
  Value* qm = fma(x, f(0x3f22f983), magic);                 // x * (2/pi) + magic, rounded once
  Value* q = b_.CreateFSub(qm, magic);
  Value* r = fma(q, f(0xbfc90fdb), x);                      // - C1 = -1.57079637
  r = fma(q, f(0x333bbd2e), r);                             // - C2 = +4.37113883e-8
  r = fma(q, f(0x26f72ced), r);                             // - C3 = +1.71512451e-15
  Value* z = b_.CreateFMul(r, r);
  Value* p = fma(fma(fc(-1.9515295891e-4f), z, fc(8.3321608736e-3f)), z, fc(-1.6666654611e-1f));
  Value* s = fma(p, b_.CreateFMul(z, r), r);
  Value* qc = fma(fma(fma(fc(2.443315711809948e-5f), z, fc(-1.388731625493765e-3f)), z, fc(4.166664568298827e-2f)), z,
                  fc(-0.5f));
  Value* c = fma(qc, z, fc(1.0f));
  Value* quadrant = b_.CreateBitCast(qm, it);
  if (is_cos) quadrant = b_.CreateAdd(quadrant, ic(1));
  Value* odd = b_.CreateICmpNE(b_.CreateAnd(quadrant, ic(1)), ic(0));
  Value* v = b_.CreateSelect(odd, c, s);
  Value* sign = b_.CreateShl(b_.CreateAnd(quadrant, ic(2)), ic(30));
  Value* fast = b_.CreateBitCast(b_.CreateXor(b_.CreateBitCast(v, it), sign), ft);
  if (!is_cos) fast = keep_zero(fast);

  // Lanes beyond the fast range (or infinite): the library, for the whole vector.
  // (ordered: NaN stays on the fast path)
  Value* big = b_.CreateFCmpOGT(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x), fc(kSinCosFastLimit));
  const char* name = is_cos ? "cos" : "sin";
  return unless_rare(big, fast, name, "large", [&] {
    Value* lib = lanes == 1 ? call_scalar_math(std::string(name) + "f", x, nullptr)
                            : call_vector_math(std::string(name) + "f", x, nullptr);
    return lanes == 1 ? lib : b_.CreateSelect(big, lib, fast);
  });
}

// Note [CPU exp and erf]
// f32 exp and erf (also the compute form of bf16 and f16) are inline code too, on
// targets with hardware FMA. libmvec's erff took 0.5 ns per element on one core here, and
// a fused GELU or GELU backward (erf and exp of every element) ran 2-3x slower than
// ATen's, whose own vectorised erf and exp are inline polynomials; inline, the kernel's
// other work overlaps the math and no call spills its vectors.
//   exp(x) = 2^n e^r     n = round(x / ln 2) (the 1.5 * 2^23 FMA trick), r = x - n ln 2
//                        in two FMAs (ln 2 = 0x3f317200 + 1.4286068e-6: the first
//                        product is exact for |n| < 2^8); e^r = 1 + r + r^2 P(r), Cephes'
//                        expf polynomial on [-ln2/2, ln2/2]; times 2^n built in the
//                        exponent bits. A vector with a lane beyond +-87 (or NaN) takes
//                        a branch that clamps x to [-104, 89] (exp is 0 or +inf beyond;
//                        below -104 the lane computes e^0 and selects 0),
//                        applies 2^n as two normal factors 2^(n>>1) and 2^(n - n>>1), so
//                        that subnormal results round once and x -> 88.72 reaches
//                        FLT_MAX, and puts NaNs back.
//   erf(x)               for |x| <= 0.927734375: x + x P(x^2); beyond: sign(x) (1 -
//                        exp(Q(min(|x|, 4)))), Q a polynomial fit of log(erfc) (the
//                        minimax fits of N. Juffa's erff); Q is in [-17, -0.9], so its
//                        exp needs no range branch. A vector computes both and selects
//                        per lane.
// Checked against double exp/erf on every f32 (exp: [-104, 89], erf: [0, 4.5], erf is
// odd): exp at most 1.02 ulp, erf at most 1.03 ulp (TCAP_EXHAUSTIVE=1 runs the sweep,
// cpu_llvm_math_test.cpp); exp(-inf) = 0, exp(+inf) = +inf, erf(+-inf) = +-1, erf(-0) = -0.
namespace {
constexpr float kExpFastLimit = 87.0f;  // |x| <= this: e^x and 2^n are normal floats
}  // namespace

// e^x for x in [-104, 89] (no NaN): 2^n applied as two normal factors when `two_scales`,
// as one (|x| <= kExpFastLimit) otherwise.
Value* ValueEmitter::exp_f32_core(Value* x, bool two_scales) {
  const int lanes = lanes_of(x);
  llvm::Type* ft = x->getType();
  llvm::Type* it = vector_type(b_.getInt32Ty(), lanes);
  auto fc = [&](float v) { return float_const(b_.getFloatTy(), v, lanes); };
  auto ic = [&](uint32_t v) { return int_const(b_.getInt32Ty(), v, lanes); };
  Value* magic = fc(12582912.0f);  // 1.5 * 2^23
  Value* n = b_.CreateFSub(fma(x, fc(1.44269502f), magic), magic);
  Value* r = fma(n, fc(-0.693145751953125f), x);
  r = fma(n, fc(-1.428606765330187e-06f), r);
  Value* p = fc(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = fma(p, r, fc(c));
  }
  p = b_.CreateFAdd(fma(p, b_.CreateFMul(r, r), r), fc(1.0f));
  Value* ni = b_.CreateFPToSI(n, it);
  auto pow2 = [&](Value* e) { return b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(e, ic(127)), ic(23)), ft); };
  if (!two_scales) return b_.CreateFMul(p, pow2(ni));
  Value* n1 = b_.CreateAShr(ni, ic(1));
  return b_.CreateFMul(b_.CreateFMul(p, pow2(n1)), pow2(b_.CreateSub(ni, n1)));
}

Value* ValueEmitter::exp_f32(Value* x) {
  const int lanes = lanes_of(x);
  auto fc = [&](float v) { return float_const(b_.getFloatTy(), v, lanes); };
  Value* fast = exp_f32_core(x, /*two_scales=*/false);
  // Lanes beyond +-87, infinite or NaN: the full range for the whole vector.
  Value* special = b_.CreateFCmpUGT(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x), fc(kExpFastLimit));
  return unless_rare(special, fast, "exp", "range", [&] {
    // minnum/maxnum return the number for a NaN operand; the NaN is put back after.
    Value* xc = b_.CreateBinaryIntrinsic(llvm::Intrinsic::minnum,
                                         b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, x, fc(-104.0f)), fc(89.0f));
    // Below -104 (an attention mask's -inf) e^x rounds to 0: such lanes compute e^0 and
    // select 0, since computing e^-104 underflows through a subnormal product, which x86
    // finishes in microcode (about a hundred cycles a lane: a masked softmax ran 6x
    // slower than ATen's). Same values.
    Value* zero_result = b_.CreateFCmpOLT(x, fc(-104.0f));
    Value* full = exp_f32_core(b_.CreateSelect(zero_result, fc(0.0f), xc), /*two_scales=*/true);
    full = b_.CreateSelect(zero_result, fc(0.0f), full);
    return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, full);
  });
}

Value* ValueEmitter::erf_f32(Value* x) {
  const int lanes = lanes_of(x);
  auto fc = [&](float v) { return float_const(b_.getFloatTy(), v, lanes); };
  Value* t = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  Value* s = b_.CreateFMul(x, x);
  // |x| > 0.927734375: 1 - exp(Q(|x|)), at most 0.995 ulp with a correctly rounded exp.
  // erf(4) rounds to 1: clamping |x| to 4 keeps Q in [-17, -0.9] (no range checks in exp)
  // and infinities out of the polynomial.
  Value* tc = b_.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, t, fc(4.0f));
  Value* sc = b_.CreateFMul(tc, tc);
  Value* r = fma(fc(-1.72853470e-5f), tc, fc(3.83197126e-4f));
  Value* u = fma(fc(-3.88396438e-3f), tc, fc(2.42546219e-2f));
  r = fma(r, sc, u);
  for (float c : {-1.06777877e-1f, -6.34846687e-1f, -1.28717512e-1f}) r = fma(r, tc, fc(c));
  r = fma(r, tc, b_.CreateFNeg(tc));
  Value* large = b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign,
                                          b_.CreateFSub(fc(1.0f), exp_f32_core(r, /*two_scales=*/false)), x);
  // |x| <= 0.927734375: x + x P(x^2), at most 0.99 ulp; keeps -0 and NaN.
  Value* q = fc(-5.96761703e-4f);
  for (float c : {4.99119423e-3f, -2.67681349e-2f, 1.12819925e-1f, -3.76125336e-1f, 1.28379166e-1f}) q = fma(q, s, fc(c));
  Value* small = fma(q, x, x);
  return b_.CreateSelect(b_.CreateFCmpOGT(t, fc(0.927734375f)), large, small);
}

Value* ValueEmitter::math(kir::OpCode op, Value* x, Value* y) {
  const bool f32 = x->getType()->getScalarType()->isFloatTy();
  const std::string name = std::string(math_name(op)) + (f32 ? "f" : "");
  if (lanes_of(x) == 1) return call_scalar_math(name, x, y);
  return call_vector_math(name, x, y);
}

}  // namespace tcap::codegen::cpu_llvm
