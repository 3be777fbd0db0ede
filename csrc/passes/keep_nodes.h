// A copy of a graph with only some of its nodes, the same inputs and the same outputs: the
// last step of passes that drop nodes (dead-code elimination, fold_transposes).
#pragma once

#include <tcap/graph.h>

#include <unordered_set>
#include <vector>

namespace tcap::passes {

// `keep`: ids of Call and CallHook nodes, in graph order; every value they and the Output
// node read must be an input or made by a kept node.
inline ir::Graph keep_nodes(const ir::Graph& g, const std::vector<ir::NodeId>& keep) {
  std::vector<ir::CutInput> ins;
  for (ir::NodeId id : g.input_nodes()) {
    ins.push_back({g.node(id).outputs.at(0).values.at(0), g.node(id).input_kind, g.node(id).name});
  }
  std::vector<ir::CutOutput> outs;
  if (const ir::Node* out = g.output_node()) {
    const std::vector<ir::ValueId> vals = g.output_values();
    for (size_t k = 0; k < vals.size(); ++k) outs.push_back({vals[k], out->output_names.at(k), out->output_kinds.at(k)});
  }
  return ir::extract_subgraph(g, keep, ins, outs);
}

// g without the Call and CallHook nodes in `drop` (whose results nothing reads any more).
inline ir::Graph drop_nodes(const ir::Graph& g, const std::unordered_set<ir::NodeId>& drop) {
  std::vector<ir::NodeId> keep;
  for (const auto& n : g.nodes()) {
    if ((n.kind == ir::NodeKind::Call || n.kind == ir::NodeKind::CallHook) && !drop.count(n.id)) keep.push_back(n.id);
  }
  return keep_nodes(g, keep);
}

}  // namespace tcap::passes
