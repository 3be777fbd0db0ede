// A backward recorded while the engine runs it, compiled into an entry, generalized over
// sizes and specialized to new ones (Note [Compiled autograd], Note [Dynamic sizes]).
#include <tcap/compiled_autograd.h>

#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "autograd/markers.h"
#include "autograd/walk.h"
#include "capture/armed.h"
#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "compiler/pipeline.h"
#include "ir/op_facts.h"
#include "ir/writes_through_views.h"
#include "passes/int_patches.h"
#include "aot/replay_node.h"
#include "cache/entry_cache.h"
#include "cache/unused_options.h"
#include "cache/verify.h"
#include "interp/hook_runner.h"
#include "support/logging.h"

#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include "autograd/ca_runtime.h"

namespace tcap::ca {

using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// The nodes that compute `outputs` or call a hook, in graph order, and every write through
// a view into memory a kept node reads or makes (Note [Writes through a view]), until
// nothing changes; a write kept that no later read needed costs its time, never its
// meaning (the replay runs every kept node in order).
std::vector<ir::NodeId> live_nodes(const ir::Graph& g, const std::vector<ir::ValueId>& outputs) {
  std::vector<char> live(g.nodes().size(), 0);
  std::vector<ir::NodeId> todo;
  auto keep = [&](ir::NodeId p) {
    if (!live[static_cast<size_t>(p)]) {
      live[static_cast<size_t>(p)] = 1;
      todo.push_back(p);
    }
  };
  auto need = [&](ir::ValueId v) {
    if (v != ir::kNoValue) keep(g.value(v).producer);
  };
  auto close_over_inputs = [&] {
    while (!todo.empty()) {
      const ir::NodeId id = todo.back();
      todo.pop_back();
      ir::for_each_value(g.node(id).args, need);
    }
  };
  for (ir::ValueId v : outputs) need(v);
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::CallHook) keep(n.id);
  }
  close_over_inputs();
  // The writes into memory a kept node touches.
  for (bool grew = true; grew;) {
    grew = false;
    std::vector<char> touched(g.values().size(), 0);
    auto touch = [&](ir::ValueId v) {
      if (v != ir::kNoValue) touched[static_cast<size_t>(g.alias_root(v))] = 1;
    };
    for (const auto& n : g.nodes()) {
      if (!live[static_cast<size_t>(n.id)]) continue;
      ir::for_each_value(n.args, touch);
      ir::for_each_value(n.outputs, touch);
    }
    for (const auto& n : g.nodes()) {
      if (live[static_cast<size_t>(n.id)] || n.kind != ir::NodeKind::Call) continue;
      bool writes_touched = false;
      ir::for_each_value(n.outputs, [&](ir::ValueId v) {
        const ir::ValueId memory = ir::memory_written_through_a_view(g, v);
        writes_touched = writes_touched || (memory != ir::kNoValue && touched[static_cast<size_t>(memory)]);
      });
      if (!writes_touched) continue;
      keep(n.id);
      grew = true;
    }
    close_over_inputs();
  }
  std::vector<ir::NodeId> out;
  for (const auto& n : g.nodes()) {
    if (live[static_cast<size_t>(n.id)] && n.kind != ir::NodeKind::Input) out.push_back(n.id);
  }
  return out;
}

Runtime::Recorded Runtime::record(const Request& r, const ca::BackwardWalk& w) {
  Recorded out;
  capture::Session s(CaptureOptions{});
  std::unordered_map<const Node*, std::string> labels;
  for (uint32_t i = 0; i < w.nodes.size(); ++i) labels.emplace(w.nodes[i], w.label(i));
  capture::HookWrapScope::NodeLabeler labeler = [&labels](const Node& n) {
    auto it = labels.find(&n);
    return it == labels.end() ? n.name() : it->second;
  };
  s.set_node_labeler(labeler);
  std::vector<ir::CutInput> inputs;
  for (size_t k = 0; k < w.tensors.size(); ++k) {
    const uint32_t node = w.tensor_node[k];
    const bool tangent = node == 0;
    const std::string& type = *w.names[node];  // "MulBackward0", "torch::autograd::CppNode<...>"
    const size_t colon = type.rfind(':');
    ir::CutInput in;
    in.name = tangent ? "tangents_" + std::to_string(k)
                      : type.substr(colon == std::string::npos ? 0 : colon + 1) + "_" + std::to_string(node) +
                            "_saved_" + std::to_string(k);
    in.kind = tangent ? ir::InputKind::Tangent : ir::InputKind::Saved;
    in.value = s.declare_input(w.tensors[k], in.name, in.kind);
    inputs.push_back(std::move(in));
  }
  capture::HookWrapScope::SlotOf slots;
  for (size_t k = 0; k < w.hooks.size(); ++k) slots.emplace(w.hooks[k].object, static_cast<int>(k));

  variable_list& results = out.results;
  std::vector<ir::ValueId> delivered;
  std::vector<char> in_graph;
  {
    ca::Markers markers(w, &s, r.accumulate_grad);
    capture::HookWrapScope wrap(r.root, &slots, &labeler);
    capture::RecordingScope recording(&s);
    r.prepare_capture();
    s.begin_backward({});
    struct End {
      capture::Session& s;
      ~End() { s.end_backward(); }
    } end{s};
    results = r.run();
    delivered = markers.delivered;
    in_graph = markers.in_graph;
  }

  out.entry = std::make_shared<BackwardEntry>();
  BackwardEntry* entry = out.entry.get();
  entry->guards.check_global = false;
  entry->guards.structure = std::string(w.key());
  for (const auto& sz : w.sizes) {
    entry->guards.sizes.push_back(sz.value);
    entry->guards.size_labels.push_back(w.label(sz.node));
  }
  entry->node_key_end = w.node_key_end;
  entry->keep_alive = w.keep_alive;
  entry->num_hooks = w.hooks.size();
  entry->accumulates_in_graph = std::any_of(in_graph.begin(), in_graph.end(), [](char c) { return c != 0; });
  std::vector<ir::CutOutput> outs;
  std::string& why = out.why;
  why = s.unreplayable_reason();  // Note [Output shapes that depend on values]
  // Note [Sizes that come from values]: a compiled backward cannot stop and look on.
  if (why.empty()) {
    const ir::Graph& recorded = s.graph();
    for (const auto& n : recorded.nodes()) {
      if (!ir::sizes_from_values(recorded, n)) continue;
      why = n.qualified_op() + " has a data-dependent output shape (its output sizes come from values), which a "
                               "compiled backward cannot check";
      break;
    }
  }
  if (r.accumulate_grad) {
    for (size_t i = 0; i < delivered.size(); ++i) {
      if (delivered[i] == ir::kNoValue || in_graph[i]) {
        entry->acc_output.push_back(-1);
        continue;
      }
      entry->acc_output.push_back(static_cast<int>(outs.size()));
      outs.push_back({delivered[i], "grad_" + std::to_string(w.accumulate[i]), ir::OutputKind::Grad});
    }
  }
  for (size_t j = 0; j < results.size(); ++j) {
    if (!results[j].defined()) {
      entry->grad_output.push_back(-1);
      continue;
    }
    auto v = s.lookup(results[j]);
    if (!v) {
      why = "grad() returned a gradient that was not recorded";
      break;
    }
    entry->grad_output.push_back(static_cast<int>(outs.size()));
    outs.push_back({*v, "grad_output_" + std::to_string(j), ir::OutputKind::Grad});
  }
  ir::Graph& graph = out.graph;
  if (why.empty()) {
    const ir::Graph& rec = s.graph();
    std::vector<ir::ValueId> out_values;
    for (const ir::CutOutput& o : outs) out_values.push_back(o.value);
    auto nodes = live_nodes(rec, out_values);
    std::set<ir::ValueId> declared;
    for (const ir::CutInput& in : inputs) declared.insert(in.value);
    for (ir::NodeId id : nodes) {
      ir::for_each_value(rec.node(id).args, [&](ir::ValueId v) {
        const auto& p = rec.node(rec.value(v).producer);
        if (why.empty() && p.kind == ir::NodeKind::Input && !declared.count(v)) {
          why = "the backward reads a tensor that is neither a root gradient nor saved by a node (" +
                ir::describe(rec, v) + ", read by " + rec.node(id).qualified_op() + " in " + rec.node(id).autograd_node + ")";
        }
      });
    }
    for (ir::NodeId id : nodes) {
      const auto& n = rec.node(id);
      if (why.empty() && n.kind == ir::NodeKind::Call && n.hook >= 0) why = "an op ran inside a hook that was not wrapped";
    }
    if (why.empty()) {
      try {
        graph = ir::extract_subgraph(rec, nodes, inputs, outs);
        graph.meta()["producer"] = "tcap compiled autograd";
      } catch (const c10::Error& e) {
        why = first_line(e.what_without_backtrace());
      }
    }
  }
  return out;
}

variable_list Runtime::check(const Request& r, const ca::BackwardWalk& w, cache::SizeCheckRecording* recorded) {
  Recorded rec = record(r, w);
  if (rec.why.empty()) recorded->graph = std::move(rec.graph);
  else recorded->why_not = "no graph can be made of this backward at these sizes: " + rec.why;
  return std::move(rec.results);
}

variable_list Runtime::capture(const Request& r, const ca::BackwardWalk& w,
                               const std::shared_ptr<const BackwardEntry>& size_miss_of, const std::vector<size_t>& changed) {
  count(&CompileStats::captures);
  const auto t0 = std::chrono::steady_clock::now();
  Recorded rec = record(r, w);
  variable_list& results = rec.results;
  const std::shared_ptr<BackwardEntry>& entry = rec.entry;
  const ir::Graph& graph = rec.graph;
  if (!rec.why.empty()) {
    cache_->entries.run_structure_eagerly(w.key(), rec.why);
    return results;
  }
  entry->id = cache_->entries.next_id();
  const std::string what = opts().name + ".ca" + std::to_string(entry->id);
  TCAP_LOG(CompiledAutograd, "TRACED GRAPH\n===== Compiled autograd graph " << entry->id << " =====\n"
                                 << ir::to_string(graph));
  if (log_enabled(LogChannel::CompiledAutogradVerbose)) {
    std::ostringstream s2;
    for (size_t i = 0; i < entry->guards.sizes.size(); ++i) s2 << " " << i << ":" << entry->guards.sizes[i];
    TCAP_LOG(CompiledAutogradVerbose, what << ": " << w.nodes.size() << " autograd nodes, " << w.tensors.size()
                                           << " tensors, " << w.hooks.size() << " hooks, sizes" << s2.str() << "\n"
                                           << ir::to_table(graph));
  }
  cache::dump_graphs(opts(), what, {{".backward", &graph}});
  try {
    entry->graph = graph;
    entry->exe = compile_backward(graph, what);
  } catch (const c10::Error& e) {
    cache_->entries.run_structure_eagerly(w.key(),
                                          what + " could not be compiled: " + first_line(e.what_without_backtrace()));
    return results;
  }
  std::shared_ptr<cache::Entry> gone;
  if (size_miss_of) {
    generalize(*size_miss_of, *entry, changed);
    // Note [A dynamic entry takes the place of the static one]
    gone = cache::take_place_of_static(size_miss_of, *entry, "compiled autograd");
  }
  cache_->entries.add(entry, gone);
  count(&CompileStats::compiles);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Perf, "compiled autograd: " << what << " captured and compiled in " << ms << " ms");
  return results;
}

void Runtime::generalize(const BackwardEntry& a, BackwardEntry& b, const std::vector<size_t>& changed) {
  std::string why;
  if (a.acc_output != b.acc_output || a.grad_output != b.grad_output) {
    why = "the graphs recorded at the two sizes differ in structure";
  }
  // Note [Checking a new size]: the record is the graph itself, so every specialization is
  // checked whole and an integer two sizes explain alike may take the first.
  cache::make_dynamic(std::move(why), {a.graph, a.graph, a.guards.sizes}, {b.graph, b.graph, b.guards.sizes},
                      b.guards.dyn, changed, {}, /*first_fit=*/opts().check_new_sizes, "compiled autograd", b.id,
                      [&] { return b.guards.describe_dynamic(); });
}

namespace {

// Backward entry e's plan over `graph` (e's graph patched to new sizes), compiled; null
// where it does not compile (the call recaptures). It reads e, the options and its
// arguments only, so it may run as a background job (Note [Specializations in the
// background]).
std::shared_ptr<BackwardEntry> backward_specialization(const BackwardEntry& e, ir::Graph graph, const CompileOptions& o) {
  auto s = std::make_shared<BackwardEntry>();
  s->id = e.id;
  s->guards.check_global = false;
  static_cast<BackwardPlan&>(*s) = static_cast<const BackwardPlan&>(e);
  s->graph = std::move(graph);
  const std::string what = o.name + ".ca" + std::to_string(e.id) + ".sizes";
  try {
    s->exe = Runtime::compile_backward(o, s->graph, what);
  } catch (const c10::Error& err) {
    TCAP_LOG(Recompiles, "compiled autograd: specialising entry " << e.id << " failed ("
                                                                 << first_line(err.what_without_backtrace()) << "); recapturing");
    return nullptr;
  }
  return s;
}

std::string compiled_autograd_name() { return "compiled autograd"; }

}  // namespace

std::shared_ptr<const BackwardEntry> Runtime::specialize(const std::shared_ptr<const BackwardEntry>& e, const std::vector<int64_t>& key) {
  return cache::specialized(e, e->graph, key, &cache_->entries.stats(), compiled_autograd_name,
                            [&](ir::Graph graph) { return backward_specialization(*e, std::move(graph), opts()); });
}

std::shared_ptr<const BackwardEntry> Runtime::specialize_in_background(const std::shared_ptr<const BackwardEntry>& e,
                                                                       const std::vector<int64_t>& key) {
  // The job holds the entry (its plan does not change once captured) and a copy of the
  // options.
  return cache::specialized_in_background(
      e, &e->graph, key, cache_->entries.shared_stats(), compiled_autograd_name,
      [&] {
        return [e, o = opts()](ir::Graph graph) { return backward_specialization(*e, std::move(graph), o); };
      },
      runtime::submit_specialization);
}

}  // namespace tcap::ca
