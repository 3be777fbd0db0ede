// verify(): cheap structural checks of an ir::Graph, run after every pass in tests
// and debug builds. Linear in the size of the graph. Each failure throws c10::Error
// naming the node or value and the broken invariant; the message ends with the
// printed graph (to_string), so the failure can be read without a debugger.
//
// Invariants checked:
//   - node ids equal positions; value ids equal positions; hook ids equal positions;
//   - every value's producer lists it among its outputs (at output_index, and at
//     list_index inside a Tensor[] result), and every value a node's outputs name
//     points back at that node and position;
//   - every value a node reads is produced by an earlier node (topological order);
//   - version_of / view_of name a value produced by an earlier node;
//   - Input nodes have exactly one Value output;
//   - Call nodes have an op, a schema when the graph carries schemas, and a valid
//     hook id when they ran inside a hook body; CallHook nodes name an existing hook;
//   - a call to an operator this LibTorch knows passes arguments and results that fit
//     its schema (Note [Arguments against the schema], verify_args.cpp);
//   - a CallHook node has the arguments and results the interpreter reads: inputs and
//     results lists when its hook's body was recorded (slot -1), inputs and optionally
//     node inputs when the hook is called by slot; hook slots are -1 or more;
//   - a Value arg or result names exactly one value;
//   - tensor metadata is one a tensor can have: sizes >= 0 whose product fits in
//     int64_t, as many strides as sizes (or none: a layout without strides), a storage
//     offset >= 0;
//   - at most one Output node, and it is the last node, with one name and one kind
//     per argument.
#include <tcap/graph.h>

#include "ir/verify_args.h"

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <sstream>
#include <string>
#include <unordered_map>

namespace tcap::ir {

namespace {

[[noreturn]] void fail(const Graph& g, const std::string& what) {
  TORCH_CHECK(false, "tcap: verify failed: ", what, "\n", to_string(g));
}

std::string describe(const Node& n) {
  std::ostringstream os;
  os << "node " << n.id << " (" << to_string(n.kind);
  if (n.kind == NodeKind::Call) os << " " << n.qualified_op();
  if (n.kind == NodeKind::Input && !n.name.empty()) os << " " << n.name;
  if (n.kind == NodeKind::CallHook) os << " #" << n.hook;
  os << ")";
  return os.str();
}

bool valid_value(const Graph& g, ValueId v) {
  return v >= 0 && static_cast<size_t>(v) < g.values().size();
}

// The value `v` sits in `n.outputs` where its producer fields say.
bool listed_by_producer(const Node& n, const Value& v) {
  if (v.output_index < 0 || static_cast<size_t>(v.output_index) >= n.outputs.size()) {
    return false;
  }
  const Arg& out = n.outputs[static_cast<size_t>(v.output_index)];
  if (v.list_index < 0) return out.kind == ArgKind::Value && out.values.size() == 1 &&
                               out.values[0] == v.id;
  return (out.kind == ArgKind::ValueList || out.kind == ArgKind::OptValueList) &&
         static_cast<size_t>(v.list_index) < out.values.size() &&
         out.values[static_cast<size_t>(v.list_index)] == v.id;
}

// Why `m` is not the metadata of any tensor, or "".
std::string meta_problem(const TensorMeta& m) {
  if (!m.strides.empty() && m.strides.size() != m.sizes.size()) {
    return "has " + std::to_string(m.sizes.size()) + " sizes but " + std::to_string(m.strides.size()) + " strides";
  }
  uint64_t product = 1;  // of the sizes that are not 0, so that no partial product overflows
  for (int64_t s : m.sizes) {
    if (s < 0) return "has a negative size " + std::to_string(s);
    if (s > 0 && (c10::mul_overflows(product, static_cast<uint64_t>(s), &product) ||
                  product > static_cast<uint64_t>(INT64_MAX))) {
      return "has sizes whose product overflows int64_t";
    }
  }
  if (m.storage_offset < 0) return "has a negative storage offset " + std::to_string(m.storage_offset);
  return "";
}

void check_values(const Graph& g) {
  const auto& values = g.values();
  const auto num_nodes = static_cast<NodeId>(g.nodes().size());
  for (size_t k = 0; k < values.size(); ++k) {
    const Value& v = values[k];
    const auto name = [&] { return "value %" + std::to_string(k); };
    if (v.id != static_cast<ValueId>(k)) {
      fail(g, name() + " has id " + std::to_string(v.id) + "; value ids must equal positions");
    }
    if (v.producer < 0 || v.producer >= num_nodes) {
      fail(g, name() + " names producer node " + std::to_string(v.producer) +
                  ", which does not exist");
    }
    const Node& p = g.node(v.producer);
    const std::string meta = meta_problem(v.meta);
    if (!meta.empty()) fail(g, name() + " " + meta);
    if (!listed_by_producer(p, v)) {
      fail(g, name() + " says it is output " + std::to_string(v.output_index) +
                  (v.list_index >= 0 ? "[" + std::to_string(v.list_index) + "]" : "") +
                  " of " + describe(p) + ", but that node's outputs do not list it there");
    }
    for (const auto& [link, base] : {std::pair<const char*, ValueId>{"version_of", v.version_of},
                                     std::pair<const char*, ValueId>{"view_of", v.view_of}}) {
      if (base == kNoValue) continue;
      if (!valid_value(g, base)) {
        fail(g, name() + " has " + link + " %" + std::to_string(base) + ", which does not exist");
      }
      if (g.value(base).producer >= v.producer) {
        fail(g, name() + " has " + link + " %" + std::to_string(base) +
                    ", which is not produced by an earlier node than " + describe(p));
      }
    }
  }
}

void check_node_outputs(const Graph& g, const Node& n) {
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    const Arg& out = n.outputs[o];
    if (!out.refers_to_values()) continue;
    if (out.kind == ArgKind::Value && out.values.size() != 1) {
      fail(g, describe(n) + " output " + std::to_string(o) + " is a single tensor but holds " +
                  std::to_string(out.values.size()) + " value ids");
    }
    for (size_t li = 0; li < out.values.size(); ++li) {
      const ValueId v = out.values[li];
      if (v == kNoValue && out.kind == ArgKind::OptValueList) continue;
      const auto where = [&] { return describe(n) + " output " + std::to_string(o); };
      if (!valid_value(g, v)) {
        fail(g, where() + " names %" + std::to_string(v) + ", which does not exist");
      }
      const Value& val = g.value(v);
      const int want_list = out.kind == ArgKind::Value ? -1 : static_cast<int>(li);
      if (val.producer != n.id || val.output_index != static_cast<int>(o) ||
          val.list_index != want_list) {
        fail(g, where() + " names %" + std::to_string(v) + ", whose producer fields say node " +
                    std::to_string(val.producer) + " output " +
                    std::to_string(val.output_index) + " list index " +
                    std::to_string(val.list_index));
      }
    }
  }
}

void check_node_args(const Graph& g, const Node& n) {
  for (size_t a = 0; a < n.args.size(); ++a) {
    const Arg& arg = n.args[a];
    if (!arg.refers_to_values()) continue;
    const auto where = [&] {
      return describe(n) + " arg " + std::to_string(a) + (arg.name.empty() ? "" : " (" + arg.name + ")");
    };
    if (arg.kind == ArgKind::Value && arg.values.size() != 1) {
      fail(g, where() + " is a single tensor but holds " + std::to_string(arg.values.size()) +
                  " value ids");
    }
    for (ValueId v : arg.values) {
      if (v == kNoValue && arg.kind == ArgKind::OptValueList) continue;
      if (!valid_value(g, v)) {
        fail(g, where() + " uses %" + std::to_string(v) + ", which does not exist");
      }
      const NodeId producer = g.value(v).producer;
      if (producer >= n.id) {
        fail(g, where() + " uses %" + std::to_string(v) + ", which is produced by node " +
                    std::to_string(producer) +
                    ", not an earlier node (nodes must be in topological order)");
      }
    }
  }
}

bool has_hook(const Graph& g, int hook) {
  return hook >= 0 && static_cast<size_t>(hook) < g.hooks().size();
}

bool is_list(const Arg& a) { return a.kind == ArgKind::ValueList || a.kind == ArgKind::OptValueList; }

// The arguments and results the interpreter reads from a CallHook node (Note [Opaque
// hooks], interp/hook_runner.h): a hook whose body was recorded passes its recorded
// results on; a hook called by slot receives the inputs (and a node post-hook the node's
// inputs) and returns the results.
void check_call_hook(const Graph& g, const Node& n) {
  const Hook& hook = g.hooks()[static_cast<size_t>(n.hook)];
  if (n.outputs.size() != 1 || !(is_list(n.outputs[0]) || n.outputs[0].kind == ArgKind::Value)) {
    fail(g, describe(n) + " must have one output, a list of values (or one value)");
  }
  const bool by_slot = hook.slot >= 0;
  const size_t want_args = by_slot ? (n.args.size() == 2 ? 2 : 1) : 2;
  if (n.args.size() != want_args || !is_list(n.args[0]) || !is_list(n.args.back())) {
    fail(g, describe(n) + (by_slot ? " calls hook slot " + std::to_string(hook.slot) +
                                         " and must have one or two args (inputs, node_inputs), lists of values"
                                   : " passes its recorded hook body on and must have two args (inputs, "
                                     "results), lists of values"));
  }
  if (by_slot) return;
  const auto& results = n.args[1].values;
  const auto& outs = n.outputs[0].values;
  if (results.size() != outs.size()) {
    fail(g, describe(n) + " has " + std::to_string(results.size()) + " results but " +
                std::to_string(outs.size()) + " outputs");
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i] != kNoValue && results[i] == kNoValue) {
      fail(g, describe(n) + " output " + std::to_string(i) + " is a value but its result is None");
    }
  }
}

// Note [Arguments against the schema]. `schemas` caches this LibTorch's schema per
// qualified op for one verify() call.
void check_call_schema(const Graph& g, const Node& n,
                       std::unordered_map<std::string, const c10::FunctionSchema*>& schemas) {
  auto it = schemas.find(n.qualified_op());
  if (it == schemas.end()) it = schemas.emplace(n.qualified_op(), find_schema(n)).first;
  if (it->second == nullptr) return;
  const std::string why = call_mismatch(g, n, *it->second);
  if (!why.empty()) fail(g, describe(n) + " " + why + " (schema: " + c10::toString(*it->second) + ")");
}

void check_node_kind(const Graph& g, const Node& n) {
  switch (n.kind) {
    case NodeKind::Input:
      if (n.outputs.size() != 1 || n.outputs[0].kind != ArgKind::Value) {
        fail(g, describe(n) + " must have exactly one Value output");
      }
      break;
    case NodeKind::Call:
      if (n.op.empty()) fail(g, describe(n) + " has an empty op");
      if (!g.schemas().empty() && g.schemas().count(n.qualified_op()) == 0) {
        fail(g, describe(n) + " has no entry in the graph's schemas");
      }
      if (n.hook != -1 && !has_hook(g, n.hook)) {
        fail(g, describe(n) + " ran inside hook #" + std::to_string(n.hook) +
                    ", which does not exist");
      }
      break;
    case NodeKind::CallHook:
      if (!has_hook(g, n.hook)) {
        fail(g, describe(n) + " calls hook #" + std::to_string(n.hook) +
                    ", which does not exist (the graph has " +
                    std::to_string(g.hooks().size()) + " hooks)");
      }
      break;
    case NodeKind::Output:
      if (static_cast<size_t>(n.id) + 1 != g.nodes().size()) {
        fail(g, describe(n) + " is not the last node (an Output node must be last, and "
                              "there is at most one)");
      }
      if (n.output_names.size() != n.args.size() || n.output_kinds.size() != n.args.size()) {
        fail(g, describe(n) + " has " + std::to_string(n.args.size()) + " args but " +
                    std::to_string(n.output_names.size()) + " output_names and " +
                    std::to_string(n.output_kinds.size()) + " output_kinds");
      }
      // Graph::output_values() and every reader of outputs take one value per argument.
      for (size_t k = 0; k < n.args.size(); ++k) {
        if (n.args[k].kind != ArgKind::Value || n.args[k].values.size() != 1) {
          fail(g, describe(n) + " output " + std::to_string(k) + " is not a value (an Output node's args are the "
                                 "graph's result values, one each)");
        }
      }
      break;
  }
}

}  // namespace

void verify(const Graph& g) {
  const auto& nodes = g.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k].id != static_cast<NodeId>(k)) {
      fail(g, "node at position " + std::to_string(k) + " has id " +
                  std::to_string(nodes[k].id) + "; node ids must equal positions");
    }
  }
  const auto& hooks = g.hooks();
  for (size_t k = 0; k < hooks.size(); ++k) {
    if (hooks[k].id != static_cast<int>(k)) {
      fail(g, "hook at position " + std::to_string(k) + " has id " +
                  std::to_string(hooks[k].id) + "; hook ids must equal positions");
    }
    if (hooks[k].slot < -1) {
      fail(g, "hook #" + std::to_string(k) + " has slot " + std::to_string(hooks[k].slot) +
                  " (-1: its body was recorded; 0 or more: a position in the replay's hook list)");
    }
  }
  check_values(g);
  std::unordered_map<std::string, const c10::FunctionSchema*> schemas;
  for (const Node& n : nodes) {
    check_node_kind(g, n);
    check_node_outputs(g, n);
    check_node_args(g, n);
    if (n.kind == NodeKind::CallHook) check_call_hook(g, n);
    if (n.kind == NodeKind::Call) check_call_schema(g, n, schemas);
  }
}

}  // namespace tcap::ir
