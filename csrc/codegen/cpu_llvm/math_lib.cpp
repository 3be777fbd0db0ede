// Transcendentals: glibc's libmvec for vectors, libm for scalars.
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

#include <algorithm>

namespace tcap::codegen::cpu {

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

Value* ValueEmitter::math(kir::OpCode op, Value* x, Value* y) {
  const bool f32 = x->getType()->getScalarType()->isFloatTy();
  const std::string name = std::string(math_name(op)) + (f32 ? "f" : "");
  if (lanes_of(x) == 1) return call_scalar_math(name, x, y);
  return call_vector_math(name, x, y);
}

}  // namespace tcap::codegen::cpu
