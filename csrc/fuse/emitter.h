// The building blocks of lowering: an Emitter appends kir instructions to one kernel for
// the nodes of one fusion group, with eager's dtype rules (arguments cast to the dtype an
// op computes in, BF16/F16 computed in F32, ATen's result_type for comparisons).
// Why a file of its own: the lowering table (lowering.cpp) says what each operator
// computes in terms of these blocks; the blocks know nothing of operators.
// Preconditions: the node handed to any member was accepted by classify() (classify.h),
// so its tensors have kir dtypes. Postconditions: every Val returned is an instruction of
// the kernel, of the dtype it says.
#pragma once

#include "kir/kir.h"

#include <tcap/graph.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tcap::fuse {

// A kir value and its dtype.
struct Val {
  int32_t id = -1;
  kir::DType dtype = kir::DType::F32;
};

// Builds instructions for one node. The fusion pass supplies `resolve` (the kir value of a
// tensor argument: an instruction of the group or a Load of an outside value).
class Emitter {
 public:
  // `resolve_mapped` loads an outside value along given dims of the group's space
  // (Contraction operands, in_mapped()); null where no node of the kernel needs it.
  using MappedResolve = std::function<Val(ir::ValueId, const std::vector<int>&)>;
  Emitter(const ir::Graph& g, kir::Kernel& k, std::function<Val(ir::ValueId)> resolve,
          MappedResolve resolve_mapped = {})
      : g_(g), k_(k), resolve_(std::move(resolve)), resolve_mapped_(std::move(resolve_mapped)) {}

  const ir::Graph& graph() const { return g_; }

  bool is_tensor(const ir::Node& n, size_t i) const;
  bool is_none(const ir::Node& n, size_t i) const;
  // Argument i as a value of dtype `want`: a tensor (resolved and cast), a scalar constant,
  // or a host scalar (a kernel parameter, Note [Kernel parameters]: resolved and cast, as
  // eager converts a Scalar to the dtype it computes in).
  Val in(const ir::Node& n, size_t i, kir::DType want);
  // Tensor argument i read along the group's dims: src[d] is the argument's dim feeding
  // dim d of the group's full space, -1 where it is not read along d (contraction_src).
  Val in_mapped(const ir::Node& n, size_t i, kir::DType want, const std::vector<int>& src);
  // A constant argument's value, for lowerings whose instructions depend on it (pow's
  // special exponents, lerp's two formulas). Throws c10::Error for a host scalar: its number
  // is known only at launch, so such a node stays an ATen call (classify() asks).
  double real(const ir::Node& n, size_t i) const;
  int64_t integer(const ir::Node& n, size_t i) const;
  std::string str(const ir::Node& n, size_t i) const;
  // Whether argument i is a constant equal to v (false for a host scalar or none).
  bool is_constant(const ir::Node& n, size_t i, double v) const;
  Val c(double v, kir::DType t);
  Val cast(Val v, kir::DType t);
  Val un(kir::OpCode op, Val a);
  Val bin(kir::OpCode op, Val a, Val b);
  Val cmp(kir::OpCode op, Val a, Val b);
  Val where(Val cond, Val a, Val b);
  // a * b + c: one Fma for floating dtypes (Note [Fused multiply-add]), a Mul and an Add else.
  Val mul_add(Val a, Val b, Val c);
  Val reduce(kir::OpCode op, Val a);
  // dtype of the node's k-th tensor output, and the dtype arithmetic for it runs in
  // (BF16/F16 compute in F32).
  kir::DType out_dtype(const ir::Node& n, size_t k = 0) const;
  kir::DType compute_dtype(const ir::Node& n, size_t k = 0) const;
  // The dtype operands of a comparison are promoted to (ATen's result_type rules for the
  // tensor and scalar arguments at `args`), BF16/F16 widened to F32.
  kir::DType promoted(const ir::Node& n, std::initializer_list<size_t> args) const;

 private:
  const ir::Graph& g_;
  kir::Kernel& k_;
  std::function<Val(ir::ValueId)> resolve_;
  MappedResolve resolve_mapped_;
};

// c10 dtype -> kir dtype; std::nullopt for dtypes kir has no kernels for (complex, ...).
std::optional<kir::DType> to_kir(c10::ScalarType t);
kir::DType compute_type(kir::DType t);  // BF16/F16 -> F32, others unchanged

}  // namespace tcap::fuse
