// Copying nodes between graphs: copy_node and extract_subgraph (tcap/graph.h), a rewriting
// pass's copy of the rest (ir/graph_copy.h); the questions about one value that cutting
// and passes ask (describe, is_host_scalar).
#include <tcap/graph.h>

#include "ir/graph_copy.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace tcap::ir {

std::string describe(const Graph& g, ValueId v) {
  std::ostringstream ss;
  const auto& val = g.value(v);
  ss << "%" << v << " " << dtype_short_name(val.meta.dtype) << "[";
  for (size_t i = 0; i < val.meta.sizes.size(); ++i) ss << (i ? ", " : "") << val.meta.sizes[i];
  ss << "]";
  const Node& p = g.node(val.producer);
  if (p.kind == NodeKind::Input) ss << " input '" << p.name << "'";
  else ss << " " << p.qualified_op();
  return ss.str();
}

bool is_host_scalar(const Graph& g, ValueId v) {
  // Safe on graphs verify() has not accepted yet (it asks too).
  if (v < 0 || static_cast<size_t>(v) >= g.values().size()) return false;
  const NodeId producer = g.value(v).producer;
  if (producer < 0 || static_cast<size_t>(producer) >= g.nodes().size()) return false;
  const Node& p = g.node(producer);
  return p.kind == NodeKind::Input && p.input_kind == InputKind::HostScalar;
}

bool reads_host_scalar(const Graph& g, const Node& n) {
  for (const auto& a : n.args) {
    if (a.kind == ArgKind::Value && !a.values.empty() && is_host_scalar(g, a.values[0])) return true;
  }
  return false;
}

NodeId copy_node(const Graph& from, const Node& node, Graph& to, std::unordered_map<ValueId, ValueId>& map) {
  Node n = node;
  const auto new_id = static_cast<NodeId>(to.nodes().size());
  for (auto& a : n.args) {
    if (!a.refers_to_values()) continue;
    for (auto& v : a.values) {
      if (v == kNoValue) continue;
      auto it = map.find(v);
      TORCH_CHECK(it != map.end(), "tcap: cutting a graph: node %", n.id, " (", n.qualified_op(), ") reads ",
                  describe(from, v), ", which is neither an input of the cut graph nor made inside it");
      v = it->second;
    }
  }
  auto link = [&](ValueId o) {
    auto it = map.find(o);
    return (o == kNoValue || it == map.end()) ? kNoValue : it->second;
  };
  for (auto& a : n.outputs) {
    if (!a.refers_to_values()) continue;
    for (auto& v : a.values) {
      if (v == kNoValue) continue;
      const auto& old = from.value(v);
      const ValueId nv = to.new_value(new_id, old.output_index, old.list_index, old.meta);
      auto& val = to.value(nv);
      val.version_of = link(old.version_of);
      val.view_of = link(old.view_of);
      map[v] = nv;
      v = nv;
    }
  }
  if (n.kind == NodeKind::Call) {  // the schema string once per operator, not per node
    std::string q = n.qualified_op();
    auto& schemas = to.schemas();
    if (schemas.find(q) == schemas.end()) {
      auto it = from.schemas().find(q);
      if (it != from.schemas().end()) schemas.emplace(std::move(q), it->second);
    }
  }
  return to.add_node(std::move(n));
}

void copy_hooks(const Graph& from, Graph& to) {
  for (const Hook& h : from.hooks()) to.add_hook(h.kind, h.autograd_node, h.slot);
}

bool copy_boundary(const Graph& from, const Node& n, Graph& to, std::unordered_map<ValueId, ValueId>& map) {
  if (n.kind == NodeKind::Input) {
    const ValueId v = n.outputs.at(0).values.at(0);
    map[v] = to.add_input(n.input_kind, n.name, from.value(v).meta);
    return true;
  }
  if (n.kind == NodeKind::Output) {
    std::vector<ValueId> vs;
    for (const auto& a : n.args) vs.push_back(map.at(a.values.at(0)));
    to.set_outputs(vs, n.output_names, n.output_kinds);
    return true;
  }
  return false;
}

void finish_copy(const Graph& from, Graph& to) {
  for (const auto& [op, schema] : from.schemas()) to.schemas().emplace(op, schema);
  to.meta() = from.meta();
  verify(to);
}

Graph extract_subgraph(const Graph& g, const std::vector<NodeId>& nodes, const std::vector<CutInput>& inputs,
                       const std::vector<CutOutput>& outputs) {
  Graph h;
  copy_hooks(g, h);
  std::unordered_map<ValueId, ValueId> map;
  for (const CutInput& in : inputs) map[in.value] = h.add_input(in.kind, in.name, g.value(in.value).meta);
  for (NodeId id : nodes) copy_node(g, g.node(id), h, map);
  std::vector<ValueId> outs;
  std::vector<std::string> names;
  std::vector<OutputKind> kinds;
  for (const CutOutput& o : outputs) {
    auto it = map.find(o.value);
    TORCH_CHECK(it != map.end(), "tcap: cutting a graph: output ", describe(g, o.value),
                " is neither an input of the cut graph nor made inside it");
    outs.push_back(it->second);
    names.push_back(o.name);
    kinds.push_back(o.kind);
  }
  h.set_outputs(std::move(outs), names, kinds);
  h.meta() = g.meta();
  verify(h);
  return h;
}

}  // namespace tcap::ir
