#include "aot/region_entry.h"

#include "compiler/pipeline.h"
#include "ir/op_facts.h"
#include "passes/host_graph.h"
#include "runtime/background_compiles.h"
#include "support/logging.h"

#include <tcap/graph_json.h>

#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>

namespace tcap::aot {
namespace {

void dump(const RegionEntry& e, const CompileOptions& o) {
  std::vector<std::pair<std::string, const ir::Graph*>> graphs = {{".joint", &e.joint.graph},
                                                                   {".forward", &e.part.forward}};
  if (e.has_backward) graphs.emplace_back(".backward", &e.part.backward);
  cache::dump_graphs(o, o.name + "." + std::to_string(e.id), graphs);
}

// Note [Observed host values]
// A value read on the host is a guard (DESIGN.md D6) because host code may branch on it.
// When a call misses an entry on such a value alone, and its capture records the same
// graph except for the values read (with the reads the older entry already observes
// forgotten), the value did not steer the computation at the two values seen: it is read
// for the host's own use (logged, returned). The new entry forgets those reads (nothing
// in its graph reads them), guards only the rest, and replaces the older entry. Host code
// that branches on the value at other values than the two seen would be missed:
// CompileOptions::observe_host_values = false keeps every read a guard.
bool observe_host_values(RegionEntry& e, const RegionEntry& older, const CompileOptions& o) {
  if (!o.observe_host_values || e.joint.num_primals != older.joint.num_primals ||
      e.joint.num_tangents != older.joint.num_tangents || e.joint.grad_of != older.joint.grad_of) {
    return false;
  }
  const auto reads = passes::host_read_nodes(e.joint.graph);
  if (e.joint.graph.nodes().size() != older.joint.graph.nodes().size()) return false;
  for (ir::NodeId id : older.observed_reads) {
    if (std::find(reads.begin(), reads.end(), id) == reads.end()) return false;
  }
  const ir::Graph g = passes::forget_host_reads(e.joint.graph, older.observed_reads);
  std::vector<ir::NodeId> changed;
  if (!passes::same_but_host_values(older.joint.graph, g, &changed) || changed.empty()) return false;
  std::string what;
  for (ir::NodeId id : changed) what += (what.empty() ? "" : ", ") + g.node(id).qualified_op() + " (node %" + std::to_string(id) + ")";
  e.observed_reads = older.observed_reads;
  e.observed_reads.insert(e.observed_reads.end(), changed.begin(), changed.end());
  std::sort(e.observed_reads.begin(), e.observed_reads.end());
  e.joint.graph = passes::forget_host_reads(g, changed);
  TCAP_LOG(Recompiles, "'" << o.name << "' entry " << older.id << ": the value read on the host by " << what
                           << " changed between two captures that recorded the same graph; it is an observation "
                              "from now on, not a guard (CompileOptions::observe_host_values)");
  return true;
}

// Note [Autograd Functions in a region]
// An autograd Function (a custom torch::autograd::Function, or one of LibTorch's own) runs
// its forward with grad mode off and wraps the results in its node: the ops it records
// have results that require grad though no grad mode was on when they ran, and their
// derivative is the Function's backward, not theirs. A compiled backward recorded by a
// real backward() holds that backward's ops, and is right. What differentiates the
// recorded forward instead (an entry whose capture saw no backward, running its forward
// through autograd; the recompute of a double backward) would differentiate the ops
// inside the Function, or nothing at all (they replay without grad mode): such a call runs
// eagerly, and such a recompute stops with an error.
std::string first_op_inside_an_autograd_function(const ir::Graph& g) {
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call || n.phase != ir::Phase::Forward || n.grad_mode) continue;
    bool fresh_requiring_grad = false;
    ir::for_each_value(n.outputs, [&](ir::ValueId v) {
      const auto& val = g.value(v);
      fresh_requiring_grad = fresh_requiring_grad || (val.meta.requires_grad && val.view_of == ir::kNoValue &&
                                                      val.version_of == ir::kNoValue);
    });
    if (fresh_requiring_grad) return n.qualified_op() + " (node %" + std::to_string(n.id) + ")";
  }
  return "";
}

}  // namespace

bool compile_region(RegionEntry& e, JointGraph joint, bool has_backward, const std::vector<at::Tensor>& primals,
                    const CompileOptions& o, const RegionEntry* host_miss_of) {
  const auto t0 = std::chrono::steady_clock::now();
  e.joint = std::move(joint);
  const bool replaces = host_miss_of && observe_host_values(e, *host_miss_of, o);

  e.has_backward = has_backward;
  // Host-value guards (cache::HostReads): inline in the forward where a replay can stop at
  // a changed value without having changed anything, else a pre-check guard graph.
  const bool reads = cache::has_host_reads(e.joint.graph);
  const bool inline_checks = reads && !o.fw_compiler && passes::host_reads_precede_input_writes(e.joint.graph);
  compiler::CompiledJoint c = compiler::compile_joint(e.joint, has_backward, o, o.name + "." + std::to_string(e.id), inline_checks);
  e.part = std::move(c.part);
  e.fw = std::move(c.forward);
  e.bw = std::move(c.backward);
  // Replay facts.
  const auto& jg = e.joint.graph;
  const auto outs = jg.output_values();
  e.output_differentiable.clear();
  e.tangent_present.assign(e.joint.num_user_outputs, false);
  for (size_t k = 0; k < e.joint.num_user_outputs; ++k) e.output_differentiable.push_back(jg.value(outs[k]).meta.requires_grad);
  for (int k : e.joint.tangent_of) e.tangent_present[static_cast<size_t>(k)] = true;
  e.mutated_primals.clear();
  for (size_t j : jg.written_inputs()) {
    if (j < e.joint.num_primals) e.mutated_primals.push_back(j);
  }
  const auto inputs = jg.input_nodes();
  for (size_t j : e.mutated_primals) {
    TORCH_CHECK(!(e.guards.global.grad_mode && primals.at(j).requires_grad()), "the function writes in place into input '",
                jg.node(inputs[j]).name, "', which requires grad (replay cannot rebase its autograd history)");
  }
  const auto& fw = e.part.forward;
  e.recompute_clones = e.mutated_primals;
  for (size_t j : ir::hidden_written_inputs(fw)) {
    if (std::find(e.recompute_clones.begin(), e.recompute_clones.end(), j) == e.recompute_clones.end()) {
      e.recompute_clones.push_back(j);
    }
  }
  e.has_rng = std::any_of(fw.nodes().begin(), fw.nodes().end(), [](const ir::Node& n) { return n.draws_random_numbers(); });
  e.autograd_function = first_op_inside_an_autograd_function(e.joint.graph);
  if (inline_checks) e.guards.host.set_inline(fw);
  else if (reads) e.guards.host.build_precheck(fw);
  else e.guards.host = cache::HostReads();
  e.guards.aliases = cache::AliasGeometry::of(primals);
  // An autograd node per call only where a backward can reach it: grad mode on, a primal
  // requiring grad, and an output that is differentiable. With no differentiable output
  // the node would be built and dropped on every call (no backward can run through it;
  // writes into primals that require grad are refused above), so the replay is direct.
  e.use_function = e.guards.global.grad_mode &&
                   std::any_of(primals.begin(), primals.end(), [](const at::Tensor& t) {
                     return t.defined() && t.requires_grad();
                   }) &&
                   std::any_of(e.output_differentiable.begin(), e.output_differentiable.end(), [](bool d) { return d; });
  e.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(AotGraphs, "'" << o.name << "' entry " << e.id << " joint graph:\n"
                          << ir::to_string(e.joint.graph) << "\nforward graph:\n" << ir::to_string(e.part.forward)
                          << (has_backward ? "\nbackward graph:\n" + ir::to_string(e.part.backward) : "") << "\n"
                          << e.part.explain());
  TCAP_LOG(Perf, "'" << o.name << "' entry " << e.id << " compiled in " << e.compile_ms << " ms");
  dump(e, o);
  return replaces;
}

// Note [The contract of a compiled function]
// What a replay re-reads and what it freezes (docs/compile.md): it re-reads its inputs,
// the modules it was given (their parameters, buffers, tree, flags and options), and the
// tensors it read from outside its inputs (held: their current contents; a replaced one
// recaptures once the old one is let go), and guards every value it read on the host;
// whatever else the function reached through its closure (a number, a flag, a module's
// own member) was read once, at capture, and is frozen. At its first compile each
// function says, under TCAP_LOGS=guards, what it reads from outside its inputs and where.
void log_contract(const RegionEntry& e, const std::string& who) {
  if (!log_enabled(LogChannel::Guards)) return;
  const ir::Graph& g = e.joint.graph;
  const auto inputs = g.input_nodes();
  const size_t declared = e.guards.tensors.size();
  std::ostringstream s;
  s << who << " reads " << e.guards.held.size() << " tensor(s) and " << e.guards.host.size()
    << " host value(s) from outside its inputs";
  for (size_t j = declared; j < inputs.size() && j < e.joint.num_primals; ++j) {
    const ir::ValueId v = g.node(inputs[j]).outputs.at(0).values.at(0);
    const auto users = g.users(v);
    const std::string first =
        users.empty() ? "no op" : g.node(users[0]).qualified_op() + " (node %" + std::to_string(users[0]) + ")";
    s << "\n  tensor '" << g.node(inputs[j]).name << "', first read by " << first
      << ": held, its current contents read by every replay";
  }
  for (const auto& w : e.guards.host.what()) s << "\n  host value read by " << w << ": a guard";
  for (const auto& w : e.guards.host.sizes_of()) {
    s << "\n  the sizes of the results of " << w << ", which come from values: a guard";
  }
  for (ir::NodeId id : e.observed_reads) s << "\n  host value read by node %" << id << ": observed, not a guard";
  s << "\n  anything else it reaches through its closure (numbers, flags, members of modules it was not given) is "
       "frozen as captured; TCAP_VERIFY checks replays against eager";
  TCAP_LOG(Guards, s.str());
  for (const auto& d : e.guards.describe()) TCAP_LOG(Guards, who << " entry " << e.id << " guard: " << d);
}

void generalize(const RegionEntry& a, RegionEntry& b, const std::vector<size_t>& changed, const std::string& who) {
  std::string why = cache::host_reads_keep_static(a.guards, b.guards);
  if (why.empty() && (a.joint.num_primals != b.joint.num_primals || a.joint.num_tangents != b.joint.num_tangents ||
                      a.joint.grad_of != b.joint.grad_of || a.guards.held.size() != b.guards.held.size())) {
    why = "the graphs at the two sizes differ in structure";
  }
  // Note [Checking a new size]: a check capture records the forward alone.
  cache::make_dynamic(std::move(why), {a.joint.graph, a.forward_record, a.guards.sizes},
                      {b.joint.graph, b.forward_record, b.guards.sizes}, b.guards.dyn, changed, {}, /*first_fit=*/false,
                      who, b.id, [&] { return b.guards.describe_dynamic(); });
}

namespace {

// What a specialization keeps of its entry: who it is, the guards that do not depend on
// sizes, and the one fact of the capture the graph does not tell (its tangents'
// aliasing); compile_region derives the rest from the specialized joint graph.
std::shared_ptr<RegionEntry> specialization_of(const RegionEntry& e, ir::Graph graph,
                                               const std::vector<at::Tensor>& primals, const CompileOptions& options) {
  auto s = std::make_shared<RegionEntry>();
  s->id = e.id;
  s->fn_name = e.fn_name;
  s->stats = e.stats;
  s->guards.global = e.guards.global;
  s->guards.held = e.guards.held;
  s->aliased_tangents = e.aliased_tangents;
  JointGraph j = e.joint;
  j.graph = std::move(graph);
  compile_region(*s, std::move(j), e.has_backward, primals, options);
  return s;
}

}  // namespace

std::shared_ptr<const RegionEntry> specialize(const std::shared_ptr<const RegionEntry>& e, const std::vector<int64_t>& key,
                                              const std::vector<at::Tensor>& primals, const CompileOptions& options) {
  return cache::specialized(e, e->joint.graph, key, e->stats.get(), [&] { return "'" + options.name + "'"; },
                            [&](ir::Graph graph) { return specialization_of(*e, std::move(graph), primals, options); });
}

std::shared_ptr<const RegionEntry> specialize_in_background(const std::shared_ptr<const RegionEntry>& e,
                                                            const std::vector<int64_t>& key,
                                                            const std::vector<at::Tensor>& primals,
                                                            const CompileOptions& options) {
  // The job reads the call's tensors' metadata (requires_grad, which share memory), never
  // their values: it holds them (their storages stay alive until it ran) and a copy of
  // the options.
  return cache::specialized_in_background(
      e, &e->joint.graph, key, e->stats, [&] { return "'" + options.name + "'"; },
      [&] {
        return [e, primals, options](ir::Graph graph) {
          return specialization_of(*e, std::move(graph), primals, options);
        };
      },
      runtime::submit_specialization);
}

}  // namespace tcap::aot
