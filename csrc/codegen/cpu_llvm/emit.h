// ValueEmitter: emits the LLVM IR of one kir instruction on scalar or vector operands
// (the renderer's one-row-per-op table lives in ops.cpp; the math library calls in
// math_lib.cpp). Internal to codegen/cpu_llvm/.
//
// Note [CPU value representation]
// A value of dtype T with L lanes is an LLVM value of type T' (L == 1) or <L x T'>:
//   Bool -> i1 (u8 in memory: loads compare != 0, stores zero-extend)
//   U8/I8 -> i8, I16 -> i16, I32 -> i32, I64 -> i64 (U8 is the only unsigned type)
//   F16 -> half, BF16 -> i16 holding the bfloat16 bits, F32 -> float, F64 -> double.
// Floating arithmetic on F16/BF16 values widens to f32, computes and rounds back (the
// lowering normally casts to F32 first, so this only matters for hand-written kernels).
// bf16 <-> f32 conversions are bit operations: widening is exact, narrowing rounds to
// nearest even and turns every NaN into the quiet NaN 0x7fc0, as c10::BFloat16 does.
#pragma once

#include "codegen/cpu_llvm/plan.h"
#include "kir/kir.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <vector>

namespace tcap::codegen::cpu_llvm {

class ValueEmitter {
 public:
  ValueEmitter(llvm::IRBuilder<>& b, llvm::Module& m, const TargetInfo& t) : b_(b), m_(m), t_(t) {}

  // Per value id: a Const whose value the launch gives (Note [Sizes at launch]); the
  // emitter must not use such a value as a literal (pow's special exponents, bounds).
  std::vector<bool> launch_consts;
  bool literal(const kir::Kernel& k, int32_t v) const {
    const size_t i = static_cast<size_t>(v);
    return k.instrs[i].op == kir::OpCode::Const && (i >= launch_consts.size() || !launch_consts[i]);
  }

  static int lanes_of(llvm::Value* v);
  // Register type of a dtype (see the Note) and its in-memory element type.
  llvm::Type* scalar_type(kir::DType t) const;
  llvm::Type* memory_type(kir::DType t) const;
  llvm::Type* vector_type(llvm::Type* scalar, int lanes) const;
  llvm::Value* splat(llvm::Value* v, int lanes);

  llvm::Value* constant(const kir::Instr& in, int lanes);
  llvm::Value* from_memory(llvm::Value* v, kir::DType t);  // loaded element(s) -> register form
  llvm::Value* to_memory(llvm::Value* v, kir::DType t);    // register form -> element(s) to store
  // F16/BF16 registers <-> f32 ("compute" form); identity for the other dtypes.
  llvm::Value* to_compute(llvm::Value* v, kir::DType t);
  llvm::Value* from_compute(llvm::Value* v, kir::DType t);
  llvm::Value* cast(llvm::Value* v, kir::DType from, kir::DType to);

  // One instruction that is neither a leaf nor a Reduce; `args` in register form with
  // equal lane counts. `k` gives the operand instructions (dtypes, constant exponents).
  llvm::Value* op(const kir::Kernel& k, const kir::Instr& in, const std::vector<llvm::Value*>& args);

  // Reductions, on accumulators in compute form (f32 for F16/BF16).
  llvm::Value* reduce_identity(kir::OpCode op, kir::DType t, int lanes);
  llvm::Value* reduce_combine(kir::OpCode op, kir::DType t, llvm::Value* acc, llvm::Value* x);
  llvm::Value* reduce_horizontal(kir::OpCode op, kir::DType t, llvm::Value* vec);

  // exp, log, ..., pow on f32/f64 compute values: glibc libmvec for vectors, libm for
  // scalars (math_lib.cpp). `y` is the exponent of Pow, null otherwise.
  llvm::Value* math(kir::OpCode op, llvm::Value* x, llvm::Value* y);
  // sin or cos of f32 values, inline (Note [CPU sin and cos], math_lib.cpp). `small_arg`:
  // |x| <= 1 is known (ops.cpp's `bounds`): a short polynomial, no reduction or library.
  llvm::Value* sin_cos_f32(kir::OpCode op, llvm::Value* x, bool small_arg);
  // exp and erf of f32 values, inline (Note [CPU exp and erf], math_lib.cpp).
  llvm::Value* exp_f32(llvm::Value* x);
  llvm::Value* erf_f32(llvm::Value* x);
  llvm::Value* exp_f32_core(llvm::Value* x, bool two_scales);

 private:
  llvm::Value* float_op(const kir::Kernel& k, const kir::Instr& in, const std::vector<llvm::Value*>& x);
  llvm::Value* int_op(const kir::Instr& in, const std::vector<llvm::Value*>& x);
  llvm::Value* compare(kir::OpCode op, kir::DType t, llvm::Value* a, llvm::Value* c);
  llvm::Value* pow(const kir::Kernel& k, const kir::Instr& in, llvm::Value* x, llvm::Value* y);
  llvm::Value* int_div(kir::DType t, llvm::Value* a, llvm::Value* d);
  llvm::Value* bf16_to_f32(llvm::Value* bits);
  llvm::Value* f32_to_bf16(llvm::Value* f);
  llvm::Value* float_const(llvm::Type* scalar, double v, int lanes);
  llvm::Value* int_const(llvm::Type* scalar, uint64_t v, int lanes);
  llvm::Value* call_scalar_math(const std::string& name, llvm::Value* x, llvm::Value* y);
  llvm::Value* call_vector_math(const std::string& name, llvm::Value* x, llvm::Value* y);
  llvm::FunctionCallee math_function(const std::string& name, llvm::Type* t, int arity);
  llvm::Value* fma(llvm::Value* a, llvm::Value* m, llvm::Value* c);
  // `fast`, unless a lane of the i1 (vector) `rare` is set: then the value `slow` emits on
  // a branch weighted as rarely taken (blocks <name>.<slow_block>, <name>.join).
  llvm::Value* unless_rare(llvm::Value* rare, llvm::Value* fast, const std::string& name,
                           const std::string& slow_block, const std::function<llvm::Value*()>& slow);

  llvm::IRBuilder<>& b_;
  llvm::Module& m_;
  const TargetInfo& t_;
};

}  // namespace tcap::codegen::cpu_llvm
