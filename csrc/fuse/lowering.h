// Lowering of ATen nodes into kernel IR: one row per operator (STYLE: op properties are
// rows in one table). The fusion pass (fusion.cpp) decides which nodes share a kernel;
// this file says what each node computes, in kir instructions, with eager's semantics.
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

// How a node uses the fusion group's iteration space.
enum class OpClass {
  Pointwise,  // one output element per element of its (broadcast) output shape
  Reduction,  // reduces its first tensor argument over `reduce_dims`
  Row,        // full-shape in and out, with reductions over `reduce_dims` inside (softmax)
};

// A node's fusion classification (classify() below): how it uses the iteration space and
// which dims it reduces.
struct NodeClass {
  OpClass cls = OpClass::Pointwise;
  std::vector<int64_t> reduce_dims;  // Reduction / Row: dims of the first tensor argument, sorted
};

// Why a node cannot be lowered for kernels on `device` (every tensor it reads and writes
// must live there), or std::nullopt with `info` filled in.
std::optional<std::string> classify(const ir::Graph& g, const ir::Node& n, NodeClass* info,
                                    const c10::Device& device = c10::Device(c10::kCPU));

// Builds instructions for one node. The fusion pass supplies `resolve` (the kir value of a
// tensor argument: an instruction of the group or a Load of an outside value).
class Emitter {
 public:
  Emitter(const ir::Graph& g, kir::Kernel& k, std::function<Val(ir::ValueId)> resolve)
      : g_(g), k_(k), resolve_(std::move(resolve)) {}

  // Lowers node n; returns one value per tensor output (ir Value / ValueList entries, in
  // order), in a compute dtype (the store casts to the output's dtype).
  std::vector<Val> lower(const ir::Node& n);

  // --- building blocks for the table --------------------------------------
  bool is_tensor(const ir::Node& n, size_t i) const;
  bool is_none(const ir::Node& n, size_t i) const;
  // Argument i as a value of dtype `want`: a tensor (resolved and cast) or a scalar constant.
  Val in(const ir::Node& n, size_t i, kir::DType want);
  double real(const ir::Node& n, size_t i) const;
  int64_t integer(const ir::Node& n, size_t i) const;
  std::string str(const ir::Node& n, size_t i) const;
  Val c(double v, kir::DType t);
  Val cast(Val v, kir::DType t);
  Val un(kir::OpCode op, Val a);
  Val bin(kir::OpCode op, Val a, Val b);
  Val cmp(kir::OpCode op, Val a, Val b);
  Val where(Val cond, Val a, Val b);
  Val reduce(kir::OpCode op, Val a);
  // dtype of the node's k-th tensor output, and the dtype arithmetic for it runs in
  // (BF16/F16 compute in F32).
  kir::DType out_dtype(const ir::Node& n, size_t k = 0) const;
  kir::DType compute_dtype(const ir::Node& n, size_t k = 0) const;
  // The dtype operands of a comparison are promoted to (ATen's result_type rules for the
  // tensor and scalar arguments at `args`), BF16/F16 widened to F32.
  kir::DType promoted(const ir::Node& n, std::initializer_list<size_t> args) const;
  // Number of elements reduced by a Reduction/Row node (product of the reduced sizes).
  int64_t reduced_numel(const ir::Node& n) const;

 private:
  const ir::Graph& g_;
  kir::Kernel& k_;
  std::function<Val(ir::ValueId)> resolve_;
};

// c10 dtype -> kir dtype; std::nullopt for dtypes kir has no kernels for (complex, ...).
std::optional<kir::DType> to_kir(c10::ScalarType t);
kir::DType compute_type(kir::DType t);  // BF16/F16 -> F32, others unchanged

}  // namespace tcap::fuse
