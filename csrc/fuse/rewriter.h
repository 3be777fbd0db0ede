// The skeleton of a decomposition: a graph copied node by node, some nodes replaced by
// ATen ops that the lowering table covers (decompose_losses.cpp, decompose_norms.cpp).
// A subclass decides which nodes it replaces (plan, selected) and how (rewrite); the
// builders make Call nodes attributed to the node they replace (phase, grad mode, autograd
// node), so a joint graph stays partitionable.
#pragma once

#include "fuse/decompose.h"

#include <tcap/graph.h>

#include <c10/core/Device.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace tcap::fuse {

// Dense row-major metadata.
ir::TensorMeta dense_meta(c10::ScalarType dtype, c10::ArrayRef<int64_t> sizes, c10::Device device);
ir::Arg int_list_arg(std::vector<int64_t> v, const char* name);
ir::Arg scalar_type_arg(c10::ScalarType t, const char* name);
ir::Arg device_arg(const c10::Device& d, const char* name);
// A Call node of `op` with no overload.
bool is_call(const ir::Node& n, const char* op);
// An optional tensor argument that is absent.
bool absent(const ir::Arg& a);

// Why node n's tensors cannot become kernels of a normalization's decomposition on
// `device`, or "": x (its input) float32 or float64 ("bfloat16 statistics accumulate in
// float" otherwise), every tensor argument on `device`, of x's dtype and dense row-major,
// and every result dense row-major.
std::string dense_float_refusal(const ir::Graph& g, const ir::Node& n, ir::ValueId x, const c10::Device& device);

class Rewriter {
 public:
  Rewriter(const ir::Graph& g, const c10::Device& device) : g_(g), device_(device) {}
  virtual ~Rewriter() = default;
  // The rewritten graph (g itself, count 0, when nothing was rewritten).
  Decomposed run();

 protected:
  // Decides which nodes are rewritten; says why others are not in d->decisions.
  virtual void plan(Decomposed* d) = 0;
  virtual bool selected(const ir::Node& n) const = 0;
  // Rewrites a selected node into out_ (mapping its results in map_); true when it counts
  // as a decomposition.
  virtual bool rewrite(const ir::Node& n) = 0;
  // Called before each node of g_ is copied or rewritten, and once at the end.
  virtual void before(const ir::Node& /*n*/) {}
  virtual void at_end() {}

  // A new Call node in out_ with one result of `meta` (a view of `view_of` when given).
  ir::ValueId call(const ir::Node& from, const char* op, const char* overload, std::vector<ir::Arg> args,
                   ir::TensorMeta meta, ir::ValueId view_of = ir::kNoValue);
  const ir::TensorMeta& meta(ir::ValueId v) const { return out_.value(v).meta; }
  ir::ValueId unary(const ir::Node& from, const char* op, ir::ValueId a);
  // op.Tensor(a, b) (with alpha 1 for add and sub), of the given sizes and a's dtype.
  ir::ValueId binary(const ir::Node& from, const char* op, ir::ValueId a, ir::ValueId b, c10::ArrayRef<int64_t> sizes);
  ir::ValueId add_scalar(const ir::Node& from, ir::ValueId a, double s);
  // sum / mean / amax over dims, of a's dtype.
  ir::ValueId reduce(const ir::Node& from, const char* op, ir::ValueId a, std::vector<int64_t> dims, bool keepdim);
  // A view of dense v with other sizes.
  ir::ValueId view(const ir::Node& from, ir::ValueId v, std::vector<int64_t> sizes);
  // v (same sizes and dtype) stands for result k of n, and takes its metadata.
  void result(const ir::Node& n, size_t k, ir::ValueId v);

  const ir::Graph& g_;
  const c10::Device device_;
  ir::Graph out_;
  std::unordered_map<ir::ValueId, ir::ValueId> map_;  // g_'s values -> out_'s
};

}  // namespace tcap::fuse
