// The CUDA C++ spelling of kernel IR values: register and memory types, constants,
// casts, the per-op expression table and the reduction helpers, plus the prelude of device
// helpers every kernel starts with. Why apart from the renderer (render.cpp and its
// strategy files): these rules are the numerics of the cuda backend (they must agree with
// the CPU renderer's, value for value), while the renderer decides loops and indexing.
// Preconditions: dtypes and opcodes kir::check_renderable accepted. Postconditions: every
// string is a C++ expression (or type) that NVRTC and the host emulator both compile.
//
// Note [CUDA value representation]
// Registers hold bool for Bool, float for F32/F16/BF16, double for F64 and the C integer
// type for the rest. An F16/BF16 instruction rounds its float result to the dtype right
// away (round to nearest even; the value stays exactly representable), so every value
// equals what the CPU renderer computes in half / bfloat16. Memory holds F16/BF16 as
// 16-bit patterns (converted with cvt.f32.f16 / cvt.rn.f16.f32 and bit operations), Bool
// as one byte. Transcendentals use CUDA's accurate libdevice functions (expf, not
// __expf); NVRTC's defaults (IEEE division and sqrt, FMA contraction on, as ATen's own
// CUDA kernels are built) apply. Max/Min propagate NaN and order -0 < +0, integer
// division by zero gives 0, float -> integer casts saturate (NaN -> 0): the semantics of
// kir.h and of the CPU renderer.
#pragma once

#include "kir/kir.h"

#include <cstdint>
#include <string>

namespace tcap::codegen::cuda {

// Helpers every kernel gets (tcap_vec, the 16-bit conversions, NaN-propagating max/min,
// wrapping integer arithmetic, shuffles, warp and block reductions).
extern const char* const kPrelude;

const char* mem_type(kir::DType t);  // element type in memory ("unsigned short" for F16)
const char* reg_type(kir::DType t);  // register type ("float" for F16)
// F16/BF16: x rounded to the dtype (Note [CUDA value representation]); others unchanged.
std::string round_to(kir::DType t, const std::string& x);
// An element read from memory in register form, and a register value in memory form.
std::string from_memory(kir::DType t, const std::string& x);
std::string to_memory(kir::DType t, const std::string& x);
// Reduce helpers: a Reduce's identity, accumulator type and combine functor (accumulators
// have the register type of its dtype).
std::string reduce_identity(const kir::Instr& in);
std::string acc_type(const kir::Instr& in);
std::string reduce_functor(const kir::Instr& in);

// The name of value `id` in generated code: "v<id>".
std::string value_name(int32_t id);
// The expression computing instruction `id` of `k` (neither a Load nor a Reduce) from the
// values its arguments name.
std::string op_expr(const kir::Kernel& k, int32_t id);

}  // namespace tcap::codegen::cuda
