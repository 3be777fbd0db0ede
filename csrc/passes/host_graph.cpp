#include "passes/host_graph.h"

#include "ir/op_facts.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <set>

namespace tcap::passes {

HostGraph host_read_graph(const ir::Graph& g) {
  HostGraph out;
  std::vector<ir::NodeId> reads;
  for (const auto& n : g.nodes()) {
    if (ir::reads_on_host(g, n)) reads.push_back(n.id);
  }
  if (reads.empty()) return out;
  std::set<ir::NodeId> keep(reads.begin(), reads.end());
  std::vector<ir::NodeId> todo(reads.begin(), reads.end());
  while (!todo.empty()) {
    const auto& n = g.node(todo.back());
    todo.pop_back();
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      const auto p = g.value(v).producer;
      if (g.node(p).kind == ir::NodeKind::Call && keep.insert(p).second) todo.push_back(p);
    });
  }
  for (ir::NodeId id : keep) {
    const auto& n = g.node(id);
    TORCH_CHECK(!n.draws_random_numbers(), "a value read on the host (item()) depends on the random op ",
                n.qualified_op());
    // A pre-check graph runs before the call: it would issue the collective a second time.
    TORCH_CHECK(!ir::op_has(n.op, ir::OpFact::Collective), "a value read on the host (item()) depends on the collective ",
                n.qualified_op(), ", which a guard cannot run ahead of the call");
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      TORCH_CHECK(g.value(v).version_of == ir::kNoValue, "a value read on the host (item()) depends on the in-place op ",
                  n.qualified_op());
    });
    const std::string where = n.qualified_op() + " (node %" + std::to_string(n.id) + ")";
    for (const auto& a : n.outputs) {
      if (ir::is_host_value(a)) out.reads.push_back({a, where});
    }
    if (ir::sizes_from_values(g, n)) out.sizes_read.push_back(where);
  }
  std::vector<ir::CutInput> ins;
  for (ir::NodeId id : g.input_nodes()) ins.push_back({g.node(id).outputs[0].values[0], g.node(id).input_kind, g.node(id).name});
  out.graph = ir::extract_subgraph(g, std::vector<ir::NodeId>(keep.begin(), keep.end()), ins, {});
  return out;
}

}  // namespace tcap::passes

namespace tcap::passes {

std::vector<ir::NodeId> host_read_nodes(const ir::Graph& g) {
  std::vector<ir::NodeId> out;
  for (const auto& n : g.nodes()) {
    if (ir::reads_on_host(g, n)) out.push_back(n.id);
  }
  return out;
}

bool host_reads_precede_input_writes(const ir::Graph& g) {
  bool written = false;
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::CallHook) written = true;  // a hook may do anything
    if (n.kind != ir::NodeKind::Call) continue;
    if (ir::reads_on_host(g, n) && written) return false;
    // A collective cannot be undone either: a failed guard after it would issue it twice.
    if (ir::op_has(n.op, ir::OpFact::Collective)) written = true;
    // A training batch norm's running statistics (Note [Writes a schema does not show]).
    for (size_t i : ir::hidden_writes(n)) written = written || ir::input_aliased_by(g, n.args[i].values.at(0));
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      if (g.value(v).version_of != ir::kNoValue) written = written || ir::input_aliased_by(g, v);
    });
  }
  return true;
}

bool same_but_host_values(const ir::Graph& ga, const ir::Graph& gb, std::vector<ir::NodeId>* nodes) {
  nodes->clear();
  if (ga.nodes().size() != gb.nodes().size() || ga.values() != gb.values()) return false;
  for (size_t i = 0; i < ga.nodes().size(); ++i) {
    const ir::Node& a = ga.nodes()[i];
    const ir::Node& b = gb.nodes()[i];
    if (a == b) continue;
    ir::Node masked = b;
    bool host = false;
    for (size_t k = 0; k < masked.outputs.size() && k < a.outputs.size(); ++k) {
      if (ir::is_host_value(masked.outputs[k]) && masked.outputs[k].kind == a.outputs[k].kind) {
        masked.outputs[k] = a.outputs[k];
        host = true;
      }
    }
    if (!host || !(masked == a)) return false;
    nodes->push_back(a.id);
  }
  return true;
}

ir::Graph forget_host_reads(const ir::Graph& g, const std::vector<ir::NodeId>& nodes) {
  ir::Graph h = g;
  for (ir::NodeId id : nodes) {
    const ir::Node& n = h.node(id);
    TORCH_CHECK(n.kind == ir::NodeKind::Call && std::all_of(n.outputs.begin(), n.outputs.end(), ir::is_host_value),
                "tcap: node %", id, " (", n.qualified_op(), ") is not a pure host read");
    h.edit_node(id, [](ir::Node& m) {
      for (auto& a : m.outputs) a = ir::Arg::none();
    });
  }
  return h;
}

}  // namespace tcap::passes
