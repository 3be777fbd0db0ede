#include "passes/joint.h"

#include "ir/op_facts.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace tcap::passes {

int64_t tensor_bytes(const ir::TensorMeta& m) {
  return std::max<int64_t>(1, m.numel() * static_cast<int64_t>(c10::elementSize(m.dtype)));
}

JointPhases split_joint(const JointGraph& j) {
  const ir::Graph& g = j.graph;
  JointPhases p;
  const auto inputs = g.input_nodes();
  TORCH_CHECK(inputs.size() == j.num_primals + j.num_tangents, "tcap partition: the joint graph has ",
              inputs.size(), " inputs but declares ", j.num_primals, " primals and ", j.num_tangents,
              " tangents");
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ir::ValueId v = g.node(inputs[k]).outputs.at(0).values.at(0);
    (k < j.num_primals ? p.primals : p.tangents).push_back(v);
  }
  TORCH_CHECK(g.output_node() != nullptr, "tcap partition: the joint graph has no output node");
  const auto outs = g.output_values();
  TORCH_CHECK(outs.size() == j.num_user_outputs + j.grad_of.size(), "tcap partition: the joint graph has ",
              outs.size(), " outputs but declares ", j.num_user_outputs, " user outputs and ",
              j.grad_of.size(), " gradients");
  p.user_outputs.assign(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(j.num_user_outputs));
  p.grads.assign(outs.begin() + static_cast<std::ptrdiff_t>(j.num_user_outputs), outs.end());
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call && n.kind != ir::NodeKind::CallHook) continue;
    (n.phase == ir::Phase::Forward ? p.forward : p.backward).push_back(n.id);
  }
  p.primal_set.insert(p.primals.begin(), p.primals.end());
  for (ir::NodeId id : p.forward) {
    ir::for_each_value(g.node(id).outputs, [&](ir::ValueId v) { p.forward_producer[v] = id; });
  }
  for (ir::NodeId id : p.backward) {
    ir::for_each_value(g.node(id).args, [&](ir::ValueId v) {
      if (p.is_forward_value(v) && !p.first_reader.count(v)) {
        p.first_reader[v] = id;
        p.read_by_backward.push_back(v);
      }
    });
  }
  // Gradients that are forward values themselves (rare: a gradient equal to a saved
  // constant) must also be available in the backward.
  for (ir::ValueId v : p.grads) {
    if (p.is_forward_value(v) && !p.first_reader.count(v)) {
      p.first_reader[v] = -1;
      p.read_by_backward.push_back(v);
    }
  }
  std::sort(p.read_by_backward.begin(), p.read_by_backward.end());
  for (const auto& val : g.values()) {
    if (val.version_of != ir::kNoValue) p.overwritten.insert(val.version_of);
  }
  return p;
}

bool never_recomputed(const ir::Graph& g, const JointPhases& ph, ir::NodeId id, std::string* why) {
  const ir::Node& n = g.node(id);
  if (n.kind != ir::NodeKind::Call) {
    if (why) *why = "a hook call is never recomputed";
    return true;
  }
  if (!ir::op_has(n.op, ir::OpFact::Recomputable)) {
    if (why) *why = n.qualified_op() + " is never recomputed (not a cheap pointwise or view op)";
    return true;
  }
  bool writes = false;
  ir::for_each_value(n.outputs, [&](ir::ValueId v) { writes = writes || g.value(v).version_of != ir::kNoValue; });
  if (writes) {
    if (why) *why = n.qualified_op() + " writes in place and is never recomputed";
    return true;
  }
  bool reads_overwritten = false;
  ir::for_each_value(n.args, [&](ir::ValueId v) { reads_overwritten = reads_overwritten || ph.overwritten.count(v); });
  if (reads_overwritten) {
    if (why) *why = n.qualified_op() + " reads a tensor that a later forward op overwrites";
    return true;
  }
  // Note [Recomputing from primals]
  // A primal (an input, a parameter, a held tensor) may change between the forward and
  // the backward: an optimizer step writes through .data() (no version counter moves), a
  // program edits an input in place where eager's backward does not need it. Eager's
  // backward then still computes from what its forward computed: the intermediates it
  // saved are the forward's. A recompute of a value from a primal would compute from the
  // primal's new contents. So an op that computes values from a primal (directly, or
  // through views of it) is never recomputed: its result is computed in the forward and
  // saved, as eager saves it. Views of primals are recomputed freely: a view reads the
  // primal's storage as eager's saved view of it does. And a primal is saved only where
  // eager's own backward reads it, so a change eager allows between forward and backward
  // stays allowed.
  if (!ir::op_has(n.op, ir::OpFact::View)) {
    bool reads_primal = false;
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      for (int depth = 0; !reads_primal && depth < 64; ++depth) {
        if (ph.primal_set.count(v)) {
          reads_primal = true;
          break;
        }
        auto it = ph.forward_producer.find(v);
        if (it == ph.forward_producer.end()) break;
        const ir::Node& p = g.node(it->second);
        if (p.kind != ir::NodeKind::Call || !ir::op_has(p.op, ir::OpFact::View) || p.args.empty() ||
            p.args[0].kind != ir::ArgKind::Value || p.args[0].values.empty()) {
          break;
        }
        v = p.args[0].values[0];
      }
    });
    if (reads_primal) {
      if (why) *why = n.qualified_op() + " computes from a primal, which may change before the backward";
      return true;
    }
  }
  return false;
}

}  // namespace tcap::passes
