// Note [Buffer reuse in the eager backend]
// Eager LibTorch allocates a fresh tensor for every out-of-place op; with large tensors
// each allocation is an mmap and a page fault per page. A compiled graph knows every
// value's last reader, so the eager backend rewrites an out-of-place pointwise op into its
// in-place form when its first argument is an intermediate that dies there: the result
// then lives in that argument's buffer. The rewrite is taken only when it cannot be
// observed:
//   * the op is a pointwise op with an in-place twin of the same schema (sin -> sin_,
//     mul.Tensor -> mul_.Tensor, ...), and the result has the argument's dtype and shape
//     (no promotion, no broadcasting of self);
//   * the argument is made by an earlier op of this graph that always returns a fresh
//     tensor (a pointwise op or a matmul), is not a graph output (saved tensors and user
//     outputs are outputs), is not a view or a new version of anything, nothing views or
//     writes it, and this op is its last reader;
//   * the other tensor argument of a binary op does not share the argument's buffer.
// mul and add (alpha 1) may write into their second argument instead (they commute).
// The rewritten graph is private to the backend: dumps and fw_compiler see the original.
#include "passes/reuse_buffers.h"

#include "ir/op_facts.h"
#include "ir/verify_args.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <sstream>
#include <unordered_set>

namespace tcap::passes {
namespace {

bool binary_tensor_overload(const ir::Node& n) {
  return n.overload == "Tensor" && n.args.size() >= 2 &&
         (n.args[1].kind == ir::ArgKind::Value || n.args[1].kind == ir::ArgKind::WrappedScalar);
}

bool is_binary(const std::string& op) { return ir::op_has(op, ir::OpFact::Arithmetic); }

bool rewritable(const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call) return false;
  const ir::OpFacts& f = ir::op_facts(n.op);
  if (f.in_place_twin.empty() || !f.has(ir::OpFact::Pointwise)) return false;
  if (is_binary(n.op)) return binary_tensor_overload(n);
  return n.overload.empty() && n.args.size() == 1;
}

// Producers whose result is always a fresh tensor.
bool fresh_producer(const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call) return false;
  if (rewritable(n)) return true;
  return n.overload.empty() && ir::op_has(n.op, ir::OpFact::FreshResult) && !ir::op_has(n.op, ir::OpFact::Pointwise) &&
         !ir::op_has(n.op, ir::OpFact::Reduction);
}

}  // namespace

ir::Graph reuse_buffers(const ir::Graph& g, int* rewritten) {
  ir::Graph h = g;
  const auto& values = g.values();
  const std::vector<ir::NodeId> last = g.last_readers();
  std::vector<uint8_t> aliased(values.size(), 0);
  for (const auto& v : values) {
    if (v.view_of != ir::kNoValue) aliased[static_cast<size_t>(v.view_of)] = 1;
    if (v.version_of != ir::kNoValue) aliased[static_cast<size_t>(v.version_of)] = 1;
  }
  std::unordered_set<ir::ValueId> outputs;
  for (ir::ValueId v : g.output_values()) outputs.insert(v);
  // Whether n may write its result into argument `self`.
  auto reusable = [&](const ir::Node& n, ir::ValueId self, ir::ValueId other) {
    const auto& sv = g.value(self);
    const auto& out = g.value(n.outputs[0].values[0]).meta;
    if (last[static_cast<size_t>(self)] != n.id || outputs.count(self) || aliased[static_cast<size_t>(self)] ||
        sv.view_of != ir::kNoValue || sv.version_of != ir::kNoValue) {
      return false;
    }
    if (!fresh_producer(g.node(sv.producer))) return false;
    if (sv.meta.dtype != out.dtype || sv.meta.sizes != out.sizes || sv.meta.strides != out.strides ||
        sv.meta.device != out.device) {
      return false;
    }
    return other == ir::kNoValue || other == self || g.alias_root(other) != g.alias_root(self);
  };
  int count = 0;
  // n runs as its in-place twin writing into `self`: its result is a new version of self.
  auto to_twin = [&](ir::Node& n, ir::ValueId self) {
    n.op = ir::op_facts(n.op).in_place_twin;
    h.value(n.outputs[0].values[0]).version_of = self;
    auto& schema = h.schemas()[n.qualified_op()];
    if (schema.empty()) schema = ir::schema_string(n.op, n.overload);
    ++count;
  };
  for (const ir::Node& n : g.nodes()) {
    if (!rewritable(n) || n.outputs.size() != 1 || n.outputs[0].kind != ir::ArgKind::Value) continue;
    if (n.args[0].kind != ir::ArgKind::Value) continue;
    const ir::ValueId a = n.args[0].values[0];
    const ir::ValueId b = n.args.size() >= 2 && n.args[1].kind == ir::ArgKind::Value ? n.args[1].values[0] : ir::kNoValue;
    if (reusable(n, a, b)) {
      h.edit_node(n.id, [&](ir::Node& m) { to_twin(m, a); });
      continue;
    }
    // mul and add (alpha 1) commute: write into the second argument if it dies here.
    const bool alpha_one = n.args.size() < 3 || (n.args[2].kind == ir::ArgKind::Int && n.args[2].i == 1);
    const bool commutes = ir::op_has(n.op, ir::OpFact::Commutative) && binary_tensor_overload(n) && alpha_one;
    if (commutes && b != ir::kNoValue && reusable(n, b, a)) {
      h.edit_node(n.id, [&](ir::Node& m) {
        std::swap(m.args[0], m.args[1]);
        std::swap(m.args[0].name, m.args[1].name);
        to_twin(m, b);
      });
    }
  }
  if (rewritten) *rewritten = count;
  return h;
}

}  // namespace tcap::passes
