// Kernel IR: the target-neutral description of one fused loop nest (D7).
//
// The fusion pass (csrc/fuse) lowers groups of ATen nodes into a kir::Kernel; each
// renderer (codegen/cpu_llvm, codegen/cuda) turns a Kernel into machine code. The
// IR is deliberately small and fully specialised: sizes and strides are constants (tcap
// compiles per guarded shape), so a renderer can emit straight-line index arithmetic.
//
// Iteration domain. `sizes` lists the loop dims, outermost first. The last
// `num_reduce_dims` of them are reduced; the others are "outer" dims. A point of the
// domain is an index tuple (i_0, ..., i_{r-1}).
//
// Values. `instrs` is an SSA list in topological order; instruction k defines value k.
// Every value is either
//   - element-level: it depends on a Load whose strides are non-zero on some reduce dim
//     (or, for a kernel without reduce dims or whose reduce dims are all of size 1, on
//     any Load): one value per domain point;
//   - outer-level: one value per outer index (a Reduce, or anything computed only from
//     Reduces, Consts and Loads whose reduce strides are all zero).
// A Reduce combines its (element-level) operand over all reduce dims for one outer index.
// A Reduce's operand may itself depend on earlier Reduces (softmax: exp(x - max(x))):
// a renderer evaluates such a kernel as several passes over the reduce dims per outer
// index, pass k computing the Reduces whose operands depend on k earlier levels of
// Reduces; element-level values are recomputed in each pass that needs them.
//
// Loads and Stores address a buffer at  offset + sum_d index[d] * strides[d]  (elements,
// not bytes; strides may be zero for broadcast dims and are given for every domain dim).
// A Store of an element-level value writes every domain point. A Store of an outer-level
// value with zero strides on the reduce dims writes once per outer index, after the last
// pass; with a non-zero reduce stride it is a broadcast store: the value is written at
// every domain point, in the pass of its level (a pointwise result of a reduction group
// whose inputs are all broadcast along the reduce dims, such as an expanded gradient).
// `per_element` tells the two kinds apart.
//
// Semantics follow eager ATen on CPU:
//   - floating Max/Min propagate NaN (torch.maximum); comparisons are ordered (false on
//     NaN) except Ne (true on NaN); Where(c, a, b) selects per element;
//   - Cast float->int truncates toward zero, anything->Bool is `!= 0`, Bool->number 0/1;
//     BF16/F16 <-> F32 round to nearest even;
//   - transcendental ops are computed in the instruction's dtype (F32 or F64; the lowering
//     casts BF16/F16 to F32 first) with at most a few ulps of error;
//   - Round rounds half to even (std::nearbyint), Div is true division for floats and
//     truncating division for integers.
// Bool values are i1 in registers and one byte (0/1) in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tcap::kir {

enum class DType : uint8_t { Bool, U8, I8, I16, I32, I64, F16, BF16, F32, F64 };

enum class OpCode : uint8_t {
  // leaves
  Load,   // buffer, strides, offset
  Const,  // f (floating dtypes) or i (integer and Bool dtypes)
  // unary (operand and result of the instruction's dtype, except Cast, IsNan, Not)
  Cast,   // converts args[0] (any dtype) to dtype
  Neg, Abs, Exp, Log, Log1p, Expm1, Sin, Cos, Tan, Tanh, Erf, Sqrt, Rsqrt, Recip,
  Floor, Ceil, Round, Trunc,
  IsNan,  // floating operand, Bool result
  Not,    // Bool -> Bool
  // binary (both operands of the instruction's dtype, except comparisons)
  Add, Sub, Mul, Div, Pow, Max, Min,
  Lt, Le, Gt, Ge, Eq, Ne,  // operands of one dtype, Bool result
  And, Or,                 // Bool
  // ternary
  Where,  // args = {cond (Bool), a, b}; result dtype = a's dtype
  Fma,    // args = {a, b, c}, floating, all of the result's dtype: a * b + c rounded
          // once where the target has FMA (Note [Fused multiply-add])
  // reductions over the reduce dims (operand of the instruction's dtype)
  ReduceSum, ReduceMax, ReduceMin,
};

struct Instr {
  OpCode op = OpCode::Const;
  DType dtype = DType::F32;
  std::vector<int32_t> args;     // value ids of the operands (earlier instructions)
  // Load
  int32_t buffer = -1;
  std::vector<int64_t> strides;  // one per domain dim, in elements
  int64_t offset = 0;
  // Const
  double f = 0.0;
  int64_t i = 0;
};

struct Store {
  int32_t value = -1;
  int32_t buffer = -1;
  std::vector<int64_t> strides;  // one per domain dim, in elements
  int64_t offset = 0;
};

// Note [Kernel parameters]
// A kernel argument is a buffer (a data pointer) or a parameter: one F64 number the kernel
// takes at launch (a host scalar input of the graph, Note [Host scalars as graph inputs]:
// Adam's bias correction, a scheduled learning rate), so that one kernel serves every
// value and nothing is recompiled when the number changes. The kernel reads a parameter
// as a Load with all-zero strides and offset 0, cast to the dtype it computes in, as eager
// converts a Scalar. The runtime hands a parameter over as the address of the number (the
// CPU tensor's data); cpu_llvm reads it through that pointer, cuda passes the number by
// value in the launch's arguments (a host address means nothing on the device).
struct Buffer {
  std::string name;   // for printing: the graph value it holds ("%12")
  DType dtype = DType::F32;
  bool is_output = false;
  bool param = false;  // a parameter (F64, an input): Note [Kernel parameters]
};

struct Kernel {
  std::string name;               // unique within a process is not required; the hash is the identity
  std::vector<int64_t> sizes;     // iteration domain, outermost first
  int num_reduce_dims = 0;        // the last num_reduce_dims dims are reduced
  std::vector<Buffer> buffers;    // kernel arguments, in order (data pointers at run time)
  std::vector<Instr> instrs;      // SSA, topological
  std::vector<Store> stores;

  int64_t numel() const;          // product of sizes
  int64_t outer_numel() const;    // product of the outer dims (1 if none)
  int64_t reduce_numel() const;   // product of the reduce dims (1 if none)
  // The number of iterations of the parallel loop: numel() for a kernel without reduce
  // dims (one iteration per element, row-major), outer_numel() otherwise.
  int64_t parallel_range() const;
};

// Adds an instruction; returns its value id.
int32_t add(Kernel& k, Instr in);

// Canonical text (stable across processes; used for printing, hashing and cache keys):
//   kernel fused_0 sizes=[1024, 2048] reduce=0
//     buf0 in f32 %3
//     buf1 param f64 %5
//     %0 = load.f32 buf0 [2048, 1]+0
//     %1 = cos.f32 %0
//     store buf1 [2048, 1]+0 <- %1
std::string to_string(const Kernel& k);
// 64-bit FNV-1a of n bytes, continuing from h (chain calls to hash several pieces).
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset);
inline uint64_t fnv1a(const std::string& s, uint64_t h = kFnvOffset) { return fnv1a(s.data(), s.size(), h); }

// 64-bit FNV-1a of the canonical text with the name left out (two kernels that differ
// only by name share machine code).
uint64_t structural_hash(const Kernel& k);
std::string hash_hex(uint64_t h);

// Checks the invariants above (operand ids, dtypes, strides' lengths, Reduce operands
// element-level). Throws c10::Error with the
// printed kernel on failure.
void verify(const Kernel& k);

// verify(), then refuses what kir's invariants allow but no renderer implements (nothing
// lowers to them): arithmetic on Bool (Neg, Sub, Div, Pow, ReduceSum) and integer Pow.
// Throws c10::Error naming the renderer ("cpu_llvm"/"CPU", "cuda"/"CUDA"), the kernel
// and the instruction, so the caller can leave the group's ops to ATen.
void check_renderable(const Kernel& k, const char* backend, const char* renderer);

const char* to_string(OpCode op);
const char* to_string(DType t);   // "f32", "bf16", "b8", ...
int64_t dtype_size(DType t);       // bytes in memory (Bool: 1)
bool is_floating(DType t);
bool is_reduce(OpCode op);
bool is_comparison(OpCode op);

// The address of a Load or Store over a coalesced domain (below), in elements.
struct Access {
  int64_t offset = 0;
  std::vector<int64_t> strides;  // one per coalesced dim
};

// A kernel's domain with size-1 dims dropped and adjacent dims merged where every access
// allows it (the outer and the reduce dims separately, never across the boundary); what a
// renderer walks. sizes[0, num_outer) are the outer dims, the rest the reduce dims; a
// kernel without reduce dims has num_outer == sizes.size(). Each group keeps at least one
// dim (an empty group becomes one size-1 dim with zero strides; a group with a size-0 dim
// becomes one size-0 dim).
struct Coalesced {
  std::vector<int64_t> sizes;
  int num_outer = 0;
  std::vector<Access> loads;   // indexed by value id (empty strides for non-Loads)
  std::vector<Access> stores;  // indexed like Kernel::stores
};
Coalesced coalesce(const Kernel& k);

// The canonical text of k without its numbers (sizes, offsets, strides, constants) or
// names: its buffers, its instructions with their element levels `elem`, and each access's
// stride classes (0, 1, other) over the accesses `loads` (by value id) and `stores` of a
// renderer's dims. What a kernel shares with every kernel of its structure (Note [Sizes at
// launch] in codegen/cpu_llvm/cpu_llvm.h, Note [CUDA sizes at launch] in codegen/cuda).
std::string structure_text(const Kernel& k, const std::vector<Access>& loads, const std::vector<Access>& stores,
                           const std::vector<bool>& elem);

// Which values are element-level (see above); index = value id.
std::vector<bool> element_level(const Kernel& k);
// Per value: how many nested levels of Reduce it depends on (a Reduce's level is its
// operand's level + 1). A renderer runs pass p for the Reduces and element-level Stores
// whose values have level p.
std::vector<int> reduce_level(const Kernel& k);
// Whether store s writes every domain point (its value is element-level, or it is a
// broadcast store) rather than once per outer index. `elem` is element_level(k).
bool per_element(const Kernel& k, const Store& s, const std::vector<bool>& elem);

}  // namespace tcap::kir
