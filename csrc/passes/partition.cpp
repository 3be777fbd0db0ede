// Partitioning a joint graph into forward and backward graphs (include/tcap/partition.h):
// choose what the forward saves (default: what the backward reads; min-cut: Note
// [Min-cut recomputation], passes/min_cut.cpp), then cut the two graphs out of the joint
// graph, recomputed forward ops moving into the backward. Every decision is recorded
// with its reason (PartitionResult::explain).
#include <tcap/partition.h>

#include "ir/op_facts.h"
#include "passes/joint.h"
#include "passes/min_cut.h"

#include <c10/util/Exception.h>

#include <set>
#include <sstream>
#include <unordered_set>

namespace tcap {

std::string to_string(Partitioner p) {
  switch (p) {
    case Partitioner::Default: return "default";
    case Partitioner::MinCut: return "min_cut";
  }
  return "partitioner" + std::to_string(static_cast<int>(p));
}

namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::ValueId;
using passes::JointPhases;

// Forward nodes the backward recomputes: producers of values it reads that are not saved.
std::set<NodeId> recomputed_nodes(const Graph& g, const JointPhases& ph, const std::unordered_set<ValueId>& saved) {
  std::set<NodeId> recompute;
  std::vector<ValueId> todo(ph.read_by_backward.begin(), ph.read_by_backward.end());
  std::unordered_set<ValueId> seen;
  while (!todo.empty()) {
    const ValueId v = todo.back();
    todo.pop_back();
    if (saved.count(v) || !seen.insert(v).second) continue;
    TORCH_CHECK(!ph.primal_set.count(v), "tcap partition: the backward needs primal ", ir::describe(g, v),
                " but it was not saved (internal error)");
    const NodeId p = ph.forward_producer.at(v);
    if (!recompute.insert(p).second) continue;  // its other outputs are recomputed too
    std::string why;
    TORCH_CHECK(!passes::never_recomputed(g, ph, p, &why), "tcap partition: would recompute ", ir::describe(g, v),
                " but ", why, " (internal error)");
    ir::for_each_value(g.node(p).args, [&](ValueId u) { todo.push_back(u); });
  }
  return recompute;
}

// Note [Views are saved as their base]
// A view the backward reads (a Linear's t(weight), a reshaped input) costs the forward an
// op call when saved, and the backward can make it again for nothing: it reads the same
// storage. So a saved view whose producer may be recomputed (never_recomputed: not after
// an in-place write to what it reads) and that is not returned to the user anyway is
// replaced by what it views, walking down chains of views; the backward recomputes the
// view, and the fusion pass reads a view of an outside value through its base (Note
// [Views read through their base]), so it costs no call there either. Returns the new
// saved list (deduplicated, order kept) and which views moved.
std::vector<ValueId> save_view_bases(const Graph& g, const JointPhases& ph, const std::vector<ValueId>& saved,
                                     std::vector<ValueId>* moved) {
  const std::unordered_set<ValueId> user_out(ph.user_outputs.begin(), ph.user_outputs.end());
  auto view_base = [&](ValueId v) -> ValueId {
    if (ph.primal_set.count(v) || user_out.count(v)) return ir::kNoValue;
    auto it = ph.forward_producer.find(v);
    if (it == ph.forward_producer.end()) return ir::kNoValue;
    const Node& n = g.node(it->second);
    if (n.kind != ir::NodeKind::Call || !ir::op_has(n.op, ir::OpFact::View) || n.outputs.size() != 1 ||
        n.outputs[0].kind != ir::ArgKind::Value || n.args.empty() || n.args[0].kind != ir::ArgKind::Value ||
        g.value(v).view_of == ir::kNoValue || passes::never_recomputed(g, ph, it->second, nullptr)) {
      return ir::kNoValue;
    }
    const ValueId base = n.args[0].values[0];
    return ph.is_forward_value(base) ? base : ir::kNoValue;
  };
  std::vector<ValueId> out;
  std::unordered_set<ValueId> seen;
  for (ValueId v : saved) {
    ValueId keep = v;
    for (ValueId b = view_base(keep); b != ir::kNoValue; b = view_base(keep)) keep = b;
    if (keep != v) moved->push_back(v);
    if (seen.insert(keep).second) out.push_back(keep);
  }
  return out;
}

std::string saved_reason(const Graph& g, const JointPhases& ph, Partitioner which, ValueId v) {
  if (ph.primal_set.count(v)) return "saved: a primal input (kept by reference, no extra memory)";
  const auto rd = ph.first_reader.find(v);
  if (rd == ph.first_reader.end()) return "saved: viewed by what the backward reads";  // Note [Views are saved as their base]
  if (which == Partitioner::Default) {
    return "saved: read by the backward" + (rd->second >= 0 ? " (" + g.node(rd->second).qualified_op() + ")" : std::string());
  }
  std::string why;
  if (passes::never_recomputed(g, ph, ph.forward_producer.at(v), &why)) return "saved: " + why;
  return "saved: cheaper to keep (" + std::to_string(passes::tensor_bytes(g.value(v).meta)) +
         " bytes) than to recompute what depends on it";
}

Graph forward_graph(const Graph& g, const JointPhases& ph, const std::vector<ValueId>& saved) {
  std::vector<ir::CutInput> ins;
  for (NodeId id : g.input_nodes()) {
    if (ins.size() == ph.primals.size()) break;
    ins.push_back({ph.primals[ins.size()], g.node(id).input_kind, g.node(id).name});
  }
  std::vector<ir::CutOutput> outs;
  const Node* on = g.output_node();
  for (size_t k = 0; k < ph.user_outputs.size(); ++k) {
    outs.push_back({ph.user_outputs[k], k < on->output_names.size() ? on->output_names[k] : "out" + std::to_string(k),
                    ir::OutputKind::User});
  }
  for (size_t k = 0; k < saved.size(); ++k) outs.push_back({saved[k], "saved" + std::to_string(k), ir::OutputKind::Saved});
  return ir::extract_subgraph(g, ph.forward, ins, outs);
}

Graph backward_graph(const Graph& g, const JointPhases& ph, const std::vector<ValueId>& saved,
                     const std::set<NodeId>& recompute) {
  std::vector<NodeId> nodes(recompute.begin(), recompute.end());
  nodes.insert(nodes.end(), ph.backward.begin(), ph.backward.end());
  std::vector<ir::CutInput> ins;
  for (size_t k = 0; k < saved.size(); ++k) ins.push_back({saved[k], ir::InputKind::Saved, "saved" + std::to_string(k)});
  for (ValueId t : ph.tangents) ins.push_back({t, ir::InputKind::Tangent, g.node(g.value(t).producer).name});
  std::vector<ir::CutOutput> outs;
  const Node* on = g.output_node();
  for (size_t k = 0; k < ph.grads.size(); ++k) {
    const size_t pos = ph.user_outputs.size() + k;
    outs.push_back({ph.grads[k], pos < on->output_names.size() ? on->output_names[pos] : "grad" + std::to_string(k),
                    ir::OutputKind::Grad});
  }
  Graph b = ir::extract_subgraph(g, nodes, ins, outs);
  // Recomputed forward ops run in the backward: mark them so printouts say so.
  for (const auto& n : b.nodes()) {
    if ((n.kind == ir::NodeKind::Call || n.kind == ir::NodeKind::CallHook) && n.phase == ir::Phase::Forward) {
      b.edit_node(n.id, [](ir::Node& m) {
        m.phase = ir::Phase::Backward;
        m.autograd_node = "recomputed";
        m.grad_mode = false;
      });
    }
  }
  return b;
}

}  // namespace

PartitionResult partition(const JointGraph& joint, Partitioner which, const MinCutOptions& min_cut) {
  const Graph& g = joint.graph;
  const JointPhases ph = passes::split_joint(joint);
  PartitionResult r;
  r.partitioner = which;
  r.num_user_outputs = joint.num_user_outputs;
  r.grad_of = joint.grad_of;
  r.tangent_of = joint.tangent_of;

  std::vector<ValueId> moved;  // views saved as their base (Note [Views are saved as their base])
  const std::vector<ValueId> saved = save_view_bases(
      g, ph, which == Partitioner::Default ? ph.read_by_backward : passes::min_cut_saved(g, ph, min_cut), &moved);
  const std::unordered_set<ValueId> saved_set(saved.begin(), saved.end());
  const std::set<NodeId> recompute = recomputed_nodes(g, ph, saved_set);
  r.recomputed_nodes = recompute.size();

  for (ValueId v : saved) r.decisions.push_back({v, ValueDecision::Kind::Saved, saved_reason(g, ph, which, v)});
  const std::unordered_set<ValueId> moved_set(moved.begin(), moved.end());
  for (NodeId id : recompute) {
    ir::for_each_value(g.node(id).outputs, [&](ValueId v) {
      std::ostringstream ss;
      if (moved_set.count(v)) {
        ss << "recomputed in the backward: a view, saved as its base (" << g.node(id).qualified_op() << " of";
        ir::for_each_value(g.node(id).args, [&](ValueId u) { ss << " %" << u; });
        ss << ")";
        r.decisions.push_back({v, ValueDecision::Kind::Recomputed, ss.str()});
        return;
      }
      ss << "recomputed in the backward: " << g.node(id).qualified_op() << " is cheap, from";
      ir::for_each_value(g.node(id).args, [&](ValueId u) { ss << " %" << u; });
      r.decisions.push_back({v, ValueDecision::Kind::Recomputed, ss.str()});
    });
  }
  // saved_bytes: memory the saving keeps alive that would otherwise be freed: not
  // primals, not tensors returned to the user anyway, not views of primals.
  const std::unordered_set<ValueId> user_out(ph.user_outputs.begin(), ph.user_outputs.end());
  for (ValueId v : saved) {
    r.saved.push_back(v);
    r.saved_is_primal.push_back(ph.primal_set.count(v) > 0);
    if (!ph.primal_set.count(g.alias_root(v)) && !user_out.count(v)) r.saved_bytes += passes::tensor_bytes(g.value(v).meta);
  }
  r.forward = forward_graph(g, ph, saved);
  r.backward = backward_graph(g, ph, saved, recompute);
  return r;
}

std::string PartitionResult::explain() const {
  std::ostringstream ss;
  ss << to_string(partitioner) << " partition: " << saved.size() << " saved (" << saved_bytes
     << " bytes beyond primals), " << recomputed_nodes << " ops recomputed\n";
  for (const auto& d : decisions) ss << "  %" << d.value << ": " << d.reason << "\n";
  return ss.str();
}

}  // namespace tcap
