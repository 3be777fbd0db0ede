// tcap::compile_step (include/tcap/train_step.h): the front door for whole training steps.
//
// Note [Compiling a whole training step]
// The step function runs forward, backward and the optimizers' step(); all of it is
// recorded into one graph (backward ops through the engine hook, as a CaptureGuard records
// them) and replayed on the real tensors, so in-place updates of parameters, buffers and
// optimizer state happen as in eager. What eager does without an ATen op is done by tcap
// after the replay:
//   * .grad assignments (AccumulateGrad stealing a gradient, zero_grad(set_to_none)): each
//     parameter's .grad at the end of the captured step was a graph value, the very tensor
//     it had before, or undefined; replay does the same;
//   * optimizer step counters are advanced (OptimizerAdapter::advance).
// A step is compiled after two consecutive captures with the same guards recorded the same
// graph, except for
//   * scalars the optimizers compute on the host: each must be found as an expression of
//     the optimizer's host state in both captures (Note [Host scalars of optimizers]), and
//     replay recomputes it;
//   * values read on the host that differ between the two: observations (Note [Observed
//     host values]); the reads that agree are guards, checked inline where safe.
// Anything else leaves the step eager for these guards, with the reason logged.
//
// Note [Hooks in a compiled step]
// Hooks registered on parameters (or leaf inputs) before the step, such as hooks that log
// or clip gradient norms, outlive the step and may have effects on the host: capture
// records each as one opaque CallHook (Note [Opaque hooks]) and every replay calls the
// hook object on that call's tensor, as compiled autograd does. How many hooks each such
// tensor has is part of the guards (a hook registered later recaptures). Hooks the step
// registers itself (on a tensor it creates) are new objects each step and exist only
// while the step's code runs: their bodies are recorded like the rest of the step and
// replayed as graph ops; their host code, like the step's, runs only on captured calls. A step
// that creates optimizer state (the first) is never compiled: it runs once, by design.
// Guards, the entry cache, dynamic sizes and the fallback are the shared runtime's
// (cache/entry_cache.h), as for tcap::compile and compiled autograd.
#include <tcap/train_step.h>

#include "step/fused_optimizers.h"
#include "step/optimizers.h"
#include "step/step_captures.h"
#include "step/step_history.h"
#include "step/step_inputs.h"
#include "step/verify_step.h"
#include "compiler/pipeline.h"
#include "aot/region.h"
#include "aot/region_entry.h"
#include "cache/entry_cache.h"
#include "cache/unused_options.h"
#include "cache/verify.h"
#include "interp/hook_runner.h"
#include "capture/engine_shim.h"
#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "passes/host_graph.h"
#include "passes/scalar_inputs.h"
#include "support/logging.h"

#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace tcap {
namespace {

using step::HostScalar;
using step::HostState;
using step::OptimizerAdapter;
using step::ScalarPatch;

enum class GradEffect { Keep, Clear, Set };

// What a compiled step is: its graph and everything a replay needs to know about it,
// fixed once the entry is compiled. A specialization to new sizes is a copy of the plan
// with the graph specialized (and the history slice made again from it), compiled.
struct StepPlan {
  ir::Graph graph;          // the latest capture, then the compiled graph
  std::vector<ScalarPatch> patches;
  std::vector<GradEffect> grad_effect;  // per parameter
  std::vector<int> grad_output;         // per parameter: output index (Set)
  size_t num_user_outputs = 0;
  std::vector<size_t> mutated_inputs;
  // Per opaque hook slot: (gathered tensor, position in its leaf hooks) (Note [Hooks in a
  // compiled step]).
  std::vector<std::pair<size_t, size_t>> hook_slots;
  // Parameters whose updates run as one fused call with one step count (Note [Fused
  // optimizer steps]).
  std::vector<step::FusedGroup> fused_groups;
  // Outputs returned with autograd history a later backward may use, and the slice that
  // gives them one on a replay (Note [Outputs with history from a replayed step]).
  std::vector<size_t> with_history;
  std::vector<bool> buffer_inputs;  // per input: a module buffer (the only inputs the slice may write)
  std::shared_ptr<const step::HistorySlice> history;
  // Per history node behind an input (StepInputs::histories): the step's backward ran it
  // without retain_graph, so a replay frees it as that backward did.
  std::vector<bool> uses_history;
};

struct StepEntry : cache::Entry, StepPlan {
  enum class State { Candidate, Compiled, Eager } state = State::Candidate;
  std::mutex mutex;         // state changes (a Candidate becomes Compiled or Eager)
  std::vector<std::vector<HostState>> host;  // per optimizer, per parameter: at the latest capture
  std::string eager_reason;
  bool by_design = false;   // runs eagerly by design (it creates optimizer state), not a fallback
  // The plan's graph with its host scalars as inputs (Note [Host scalars as graph
  // inputs]), compiled: takes the step's tensors, then one number per patch. The 0-dim
  // tensors those numbers travel in, written in place per replay (calls are serial, and
  // the interpreter reads them as its run starts): no allocation per scalar per step.
  Executable exe;
  std::vector<at::Tensor> scalar_inputs;
  std::shared_ptr<cache::Entry> size_miss_of;  // for generalizing over sizes at compile time
  std::vector<size_t> changed;
  std::shared_ptr<cache::Specializations<StepEntry>> specialized = std::make_shared<cache::Specializations<StepEntry>>();
};

}  // namespace

struct CompiledStep::Impl {
  std::vector<std::unique_ptr<OptimizerAdapter>> opts;
  step::StepParts parts;  // the models, their submodules and opts (as the aot helpers take them)
  CompiledFunction::Fn fn;
  CompileOptions options;
  std::unique_ptr<cache::EntryCache> cache;
  std::mutex call_mutex;
  CompiledStep::Call last;  // written under call_mutex
  cache::VerifyCounter verifier;  // verify mode: which replays to check

  std::string who() const { return "step '" + options.name + "'"; }

  // Note [A structure key without names]: a replay gathers without names; a capture with.
  step::StepInputs gather(const std::vector<at::Tensor>& user, bool with_names) const {
    return step::gather_step_inputs(parts, user, with_names);
  }
  step::StepInputs gather_named(const std::vector<at::Tensor>& user, const step::StepInputs& unnamed) const {
    step::StepInputs g = gather(user, true);
    TORCH_INTERNAL_ASSERT(g.structure == unnamed.structure && g.ts.size() == unnamed.ts.size(),
                          "tcap: compile_step's gathers with and without names disagree");
    return g;
  }

  // The step's own code, run eagerly (counted by the serving loop when it decided so).
  std::vector<at::Tensor> eager_call(const std::vector<at::Tensor>& user) {
    last.kind = CompiledStep::Call::Kind::Eager;
    last.host_values.clear();
    return fn(user);
  }
  // ... when an entry decides so.
  std::vector<at::Tensor> run_eager(const std::vector<at::Tensor>& user) {
    cache->stats().count(&CompileStats::eager_calls);
    return eager_call(user);
  }

  // Marks e eager for its guards; a fallback unless by design.
  void go_eager(StepEntry& e, const std::string& why, bool by_design = false) {
    {
      std::lock_guard<std::mutex> lock(e.mutex);
      e.state = StepEntry::State::Eager;
      e.eager_reason = why;
      e.by_design = by_design;
    }
    if (by_design) {
      TCAP_LOG(GraphBreaks, who() << ": " << why);
    } else {
      cache::report_fallback(who() + " (for these guards)", why);
    }
  }

  std::vector<at::Tensor> capture(StepEntry& e, const std::vector<at::Tensor>& user, const step::StepInputs& g);
  void verify_and_compile(StepEntry& e, const ir::Graph& first, const std::vector<std::vector<HostState>>& host1,
                          const step::StepInputs& g);
  std::vector<at::Tensor> replay(const StepEntry& e, const step::StepInputs& g, const std::vector<at::Tensor>& primals,
                                 const std::vector<at::Tensor>& user);
  struct Call;
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& user);
  // A verified replay (Note [Verifying a compiled step]), or nullopt where the entry cannot
  // be verified (logged): its outputs have a history node of their own.
  std::optional<std::vector<at::Tensor>> verified(const StepEntry& served, const StepEntry& guarded, const step::StepInputs& g,
                                                  const std::vector<at::Tensor>& primals,
                                                  const std::vector<at::Tensor>& user, const VerifyOptions& v);
  std::shared_ptr<const StepEntry> specialize(const std::shared_ptr<const StepEntry>& e, const std::vector<int64_t>& key);
  // The step graph with its patched scalars as inputs, through the one pipeline (the
  // options' fw_compiler when set: the step is one graph, run without autograd).
  Executable compile_step_graph(const ir::Graph& g, const std::vector<ScalarPatch>& patches, const std::string& what,
                                bool check_host_values) const {
    std::vector<passes::ScalarArg> args;
    for (const auto& p : patches) {
      args.push_back({p.node, p.arg, std::string(step::to_string(p.expr)) + ".opt" + std::to_string(p.opt) + ".p" +
                                         std::to_string(p.param)});
    }
    return compiler::compile_graph(passes::scalars_as_inputs(g, args), options, what, options.fw_compiler,
                                   check_host_values);
  }
  static std::vector<at::Tensor> scalar_tensors(size_t n) {
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < n; ++k) out.push_back(passes::host_scalar_input(0.0));
    return out;
  }
  void generalize(const StepEntry& a, StepEntry& b);
  std::string build_history(StepEntry& e);
};

std::vector<at::Tensor> CompiledStep::Impl::capture(StepEntry& e, const std::vector<at::Tensor>& user,
                                                     const step::StepInputs& g) {
  cache->stats().count(&CompileStats::captures);
  e.host = step::host_states(parts.opts);
  // Guards of an entry that goes eager before the end of the capture (no held tensors):
  // without its alias classes it would miss every later call and recapture each time.
  e.guards.held.hold({}, {});
  e.guards.aliases = cache::AliasGeometry::of(g.ts);
  CaptureOptions co;
  capture::Session s(co);
  s.set_records_collectives(true);
  for (size_t k = 0; k < g.ts.size(); ++k) s.declare_input(g.ts[k], g.names[k], g.kinds[k]);
  // Note [Hooks in a compiled step]: the hooks already on parameters and inputs are opaque.
  capture::Session::HookSlots slots;
  e.hook_slots.clear();
  for (const auto& [k, count] : g.hooked) {
    const auto hooks = capture::leaf_tensor_hooks(g.ts[k]);
    for (size_t i = 0; i < hooks.size(); ++i) {
      slots.emplace(hooks[i], static_cast<int>(e.hook_slots.size()));
      e.hook_slots.emplace_back(k, i);
    }
  }
  s.set_opaque_hooks(&slots);
  std::vector<at::Tensor> outs;
  {
    capture::EngineHookLease lease(&capture::capture_backward_driver);
    capture::RecordingScope recording(&s);
    outs = fn(user);
  }
  auto fail = [&](const std::string& why) {
    go_eager(e, why);
    return outs;
  };
  // Note [Post-accumulate-grad hooks in a step]: a replayed step writes .grad itself and
  // never runs AccumulateGrad, so a parameter's post-accumulate-grad hook would be skipped.
  // A step whose parameters have such hooks runs eagerly, unless each hook recorded its
  // work as graph ops (Note [Recorded post-accumulate-grad hooks]: the gradient all-reduce
  // of tcap::DistributedDataParallel), as does one in which code noted an effect a replay
  // would not redo.
  if (!s.unreplayable_reason().empty()) return fail(s.unreplayable_reason());
  // Note [Backpropagating into an earlier step's outputs]
  for (size_t k = 0; k < user.size(); ++k) {
    const auto& fn = user[k].defined() ? user[k].grad_fn() : nullptr;
    if (fn && !step::is_history_node(*fn) && s.reached_by_backward(fn.get())) {
      return fail("the step's backward runs into the autograd history of input " + std::to_string(k) + " (" +
                  fn->name() + "), which eager code made (outside a compiled step, or a step's eager call): its saved "
                  "tensors would be constants of the graph; compile the step that makes input " + std::to_string(k) +
                  " too, or both as one step");
    }
  }
  for (const auto& m : parts.models) {
    for (const auto& item : m->named_parameters(true)) {
      if (capture::has_post_accumulate_grad_hook(item.value()) && !capture::recorded_grad_hook(item.value())) {
        return fail("parameter " + item.key() + " has a post-accumulate-grad hook, which a replayed step would not run");
      }
    }
  }
  // Optimizer state must be the same tensors before and after. A step that creates state
  // (the first) runs once, by design: the next one has other guards (the state tensors).
  {
    std::vector<at::Tensor> after;
    for (size_t o = 0; o < opts.size(); ++o) {
      step::StateSink sink{after, nullptr, "", nullptr};
      opts[o]->state_tensors(sink);
    }
    if (after.size() > g.state_input.size()) {
      go_eager(e, "this step created optimizer state (a first step); it runs once, eagerly", /*by_design=*/true);
      return outs;
    }
    if (after.size() < g.state_input.size()) return fail("the optimizer dropped state tensors");
    for (size_t k = 0; k < after.size(); ++k) {
      if (!after[k].is_same(g.ts[g.state_input[k]])) return fail("the optimizer replaced a state tensor");
    }
  }
  ir::Graph graph = s.graph();
  last.kind = CompiledStep::Call::Kind::Captured;
  last.host_values.clear();
  for (const auto& n : graph.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    for (const auto& a : n.outputs) {
      if (a.kind == ir::ArgKind::Bool) last.host_values.emplace_back(a.i != 0);
      else if (a.kind == ir::ArgKind::Int) last.host_values.emplace_back(a.i);
      else if (a.kind == ir::ArgKind::Double) last.host_values.emplace_back(a.d);
    }
  }
  for (const auto& n : graph.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    if (std::string why = aot::unreplayable(graph, n); !why.empty()) return fail(why);
  }
  // Outputs: the step's results, then the new .grad tensors.
  std::vector<ir::ValueId> vals;
  std::vector<std::string> names;
  std::vector<ir::OutputKind> kinds;
  e.with_history.clear();
  for (size_t k = 0; k < outs.size(); ++k) {
    auto v = outs[k].defined() ? s.lookup(outs[k]) : std::nullopt;
    if (!v) return fail("output " + std::to_string(k) + " was not computed by recorded ops");
    // An output whose history a later backward could still run through (no backward
    // inside the step used it up) gets one on a replay (Note [Outputs with history from a
    // replayed step]).
    if (outs[k].requires_grad() && outs[k].grad_fn() && !s.used_up_by_backward(outs[k].grad_fn().get())) {
      e.with_history.push_back(k);
    }
    vals.push_back(*v);
    names.push_back("out" + std::to_string(k));
    kinds.push_back(ir::OutputKind::User);
  }
  e.num_user_outputs = outs.size();
  e.uses_history.clear();
  for (const auto& h : g.histories) e.uses_history.push_back(s.used_up_by_backward(h.get()));
  // Note [Leaves of a step]: what the step did to each leaf's .grad.
  e.grad_effect.assign(g.num_leaves(), GradEffect::Keep);
  e.grad_output.assign(g.num_leaves(), -1);
  for (size_t j = 0; j < g.num_leaves(); ++j) {
    const at::Tensor& gr = g.leaf(j).grad();
    if (!gr.defined()) {
      e.grad_effect[j] = g.grad_input[j] >= 0 ? GradEffect::Clear : GradEffect::Keep;
      continue;
    }
    if (g.grad_input[j] >= 0 && gr.is_same(g.ts[static_cast<size_t>(g.grad_input[j])])) continue;  // Keep
    auto v = s.lookup(gr);
    if (!v || graph.node(graph.value(*v).producer).kind == ir::NodeKind::Input) {
      return fail(std::string("the .grad of ") + (j < g.params.size() ? "parameter '" : "input '") + g.leaf_name(j) +
                  "' was set to a tensor the step did not compute");
    }
    e.grad_effect[j] = GradEffect::Set;
    e.grad_output[j] = static_cast<int>(vals.size());
    vals.push_back(*v);
    names.push_back(g.leaf_name(j));
    kinds.push_back(ir::OutputKind::Grad);
  }
  graph.set_outputs(vals, names, kinds);
  graph.meta()["tcap.step"] = options.name;
  e.mutated_inputs.clear();
  for (size_t k : graph.written_inputs()) {
    if (k < g.ts.size()) e.mutated_inputs.push_back(k);
  }
  // Tensors the step read beyond the gathered ones (labels, masks): held (Note [Held tensors]).
  const auto& all = s.input_tensors();
  const auto inputs = graph.input_nodes();
  std::vector<at::Tensor> held(all.begin() + static_cast<std::ptrdiff_t>(std::min(g.ts.size(), all.size())), all.end());
  std::vector<std::string> held_names;
  for (size_t j = g.ts.size(); j < inputs.size(); ++j) held_names.push_back(graph.node(inputs[j]).name);
  // A tensor read from outside whose .grad the step's backward set or accumulated into: a
  // replay would not (Note [Leaves of a step]).
  for (size_t j = 0; j < held.size(); ++j) {
    const at::Tensor& h = held[j];
    if (!h.requires_grad() || !h.is_leaf() || !h.grad().defined()) continue;
    auto v = s.lookup(h.grad());
    if (v) {
      return fail("the step's backward gives a gradient to '" + held_names.at(j) + "', a tensor it reads from " +
                  "outside its inputs (a replay would not set its .grad): pass it to the step as an input, or " +
                  "register it as a parameter of a model");
    }
  }
  e.guards.held.hold(held, held_names);
  std::vector<at::Tensor> primals = g.ts;
  primals.insert(primals.end(), held.begin(), held.end());
  e.guards.aliases = cache::AliasGeometry::of(primals);
  e.graph = std::move(graph);
  return outs;
}

void CompiledStep::Impl::verify_and_compile(StepEntry& e, const ir::Graph& first,
                                            const std::vector<std::vector<HostState>>& host1, const step::StepInputs& g) {
  // Which parameter (optimizer, index) each input node is.
  const auto inputs = e.graph.input_nodes();
  std::unordered_map<ir::NodeId, std::pair<size_t, size_t>> param_inputs;
  for (size_t j = 0; j < g.params.size(); ++j) {
    if (g.params[j].opt < 0) continue;
    param_inputs[inputs.at(static_cast<size_t>(g.param_input[j]))] = {static_cast<size_t>(g.params[j].opt), g.params[j].index};
  }
  step::StepComparison cmp =
      step::compare_step_captures(first, e.graph, host1, e.host, parts.opts, param_inputs, options.observe_host_values);
  if (!cmp.why_not.empty()) return go_eager(e, cmp.why_not);
  e.patches = std::move(cmp.patches);
  const std::vector<ir::NodeId>& observed = cmp.observed;
  if (!observed.empty()) {
    std::string what;
    for (ir::NodeId id : observed) what += (what.empty() ? "" : ", ") + e.graph.node(id).qualified_op() + " (node %" + std::to_string(id) + ")";
    e.graph = passes::forget_host_reads(e.graph, observed);
    TCAP_LOG(Recompiles, who() << ": the value read on the host by " << what
                               << " changed between two steps that recorded the same graph; it is an observation, "
                                  "not a guard (CompileOptions::observe_host_values)");
  }
  // The learning rate is an input of the graph when every parameter update the optimizers
  // make found its learning-rate arguments (Note [Host scalars of optimizers]).
  std::map<std::pair<size_t, size_t>, int> lr_found;
  for (const auto& p : e.patches) {
    if (step::depends_on_lr(p.expr)) ++lr_found[{p.opt, p.param}];
  }
  bool lr_input = true;
  std::string lr_why;
  for (const auto& p : g.params) {
    if (p.opt < 0 || !p.tensor.grad().defined()) continue;
    if (lr_found[{static_cast<size_t>(p.opt), p.index}] < opts[static_cast<size_t>(p.opt)]->lr_uses(p.index)) {
      lr_input = false;
      lr_why = "the update of '" + p.name + "' does not show where its learning rate goes";
      break;
    }
  }
  if (!lr_input) {
    // Keep the learning rate guarded: its patches would not cover every use.
    e.patches.erase(std::remove_if(e.patches.begin(), e.patches.end(),
                                   [](const ScalarPatch& p) { return p.expr == HostScalar::NegLr || p.expr == HostScalar::Lr; }),
                    e.patches.end());
    TCAP_LOG(Recompiles, who() << ": the learning rate stays guarded: " << lr_why);
  }
  // Note [Fused optimizer steps]: the updates as multi-tensor calls, where they match.
  e.fused_groups.clear();
  if (options.fused_optimizers && lr_input) {
    std::map<std::pair<size_t, size_t>, ir::ValueId> param_values;
    for (const auto& [node, key] : param_inputs) param_values[key] = e.graph.node(node).outputs.at(0).values.at(0);
    step::FusedOptimizerSteps f = step::fuse_optimizer_steps(e.graph, e.patches, parts.opts, param_values);
    for (const auto& why : f.kept) TCAP_LOG(Perf, who() << ": an update keeps its recorded ops: " << why);
    if (!f.groups.empty()) {
      TCAP_LOG(Perf, who() << ": the updates of " << f.fused_params << " parameters run as " << f.groups.size()
                           << " fused multi-tensor optimizer call(s)");
      e.graph = std::move(f.graph);
      e.patches = std::move(f.patches);
      e.fused_groups = std::move(f.groups);
    }
  }
  e.buffer_inputs.assign(e.graph.input_nodes().size(), false);
  for (size_t k = 0; k < g.ts.size(); ++k) e.buffer_inputs[k] = g.kinds[k] == ir::InputKind::Buffer;
  for (int k : g.grad_input) {
    if (k >= 0) e.buffer_inputs[static_cast<size_t>(k)] = false;
  }
  for (size_t k : g.state_input) e.buffer_inputs[k] = false;
  if (std::string why = build_history(e); !why.empty()) return go_eager(e, why);
  // Host-value guards: inline where a replay can stop at a changed value before writing
  // anything the caller sees, else a pre-check graph.
  const bool reads = cache::has_host_reads(e.graph);
  // (Not inside a user's compiler: its executable cannot stop at a changed value.)
  const bool inline_checks = reads && !options.fw_compiler && passes::host_reads_precede_input_writes(e.graph);
  try {
    if (inline_checks) e.guards.host.set_inline(e.graph);
    else if (reads) e.guards.host.build_precheck(e.graph);
  } catch (const c10::Error& err) {
    return go_eager(e, err.what_without_backtrace());
  }
  try {
    e.exe = compile_step_graph(e.graph, e.patches, options.name + ".step" + std::to_string(e.id), inline_checks);
    e.scalar_inputs = scalar_tensors(e.patches.size());
  } catch (const c10::Error& err) {
    return go_eager(e, err.what_without_backtrace());
  }
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    if (!lr_input) {
      // Guarded at the value the graph holds: this (second) capture's.
      e.guards.scalars = g.scalars;
      e.guards.scalar_is_input.assign(g.scalars.size(), false);
    }
    if (e.size_miss_of) generalize(static_cast<const StepEntry&>(*e.size_miss_of), e);
    e.state = StepEntry::State::Compiled;
  }
  cache->stats().count(&CompileStats::compiles);
  if (log_enabled(LogChannel::AotGraphs)) {
    std::ostringstream ps;
    for (const auto& p : e.patches) {
      ps << "\n  node %" << p.node << " argument " << p.arg << " = " << step::to_string(p.expr) << " of optimizer "
         << p.opt << " parameter " << p.param;
    }
    TCAP_LOG(AotGraphs, who() << " compiled (" << e.graph.num_calls() << " ops, " << e.patches.size()
                              << " host scalars recomputed per step)" << ps.str() << "\n" << ir::to_string(e.graph));
  }
  const std::string dir = options.dump_dir.empty() ? Config::get().dump_dir : options.dump_dir;
  if (!dir.empty()) {
    std::filesystem::create_directories(dir);
    ir::save_json(e.graph, dir + "/" + options.name + ".step" + std::to_string(e.id) + ".json");
  }
}

std::string CompiledStep::Impl::build_history(StepEntry& e) {
  e.history.reset();
  if (e.with_history.empty()) return "";
  std::vector<ir::NodeId> patched;
  for (const auto& p : e.patches) patched.push_back(p.node);
  auto slice = std::make_shared<step::HistorySlice>();
  std::string why = step::make_history_slice(e.graph, e.with_history, e.buffer_inputs, patched, slice.get());
  if (!why.empty()) return why + "; a replayed output has no history of its own";
  TCAP_LOG(AotGraphs, who() << ": output(s) " << c10::IntArrayRef(std::vector<int64_t>(e.with_history.begin(), e.with_history.end()))
                            << " keep their autograd history on a replay (a node that recomputes "
                            << slice->graph.num_calls() << " ops in its backward)");
  e.history = std::move(slice);
  return "";
}

void CompiledStep::Impl::generalize(const StepEntry& a, StepEntry& b) {
  std::string why;
  if (a.state != StepEntry::State::Compiled) why = "the other entry is not compiled";
  else if (!a.guards.host.empty() || !b.guards.host.empty()) why = "the step reads values on the host";
  else if (a.patches.size() != b.patches.size()) why = "the steps at the two sizes recompute different host scalars";
  if (why.empty()) {
    // Host scalars differ between the two captures by design: compare with a's values.
    ir::Graph bg = b.graph;
    for (size_t k = 0; k < b.patches.size(); ++k) {
      const auto& pb = b.patches[k];
      const auto& pa = a.patches[k];
      if (pa.node != pb.node || pa.arg != pb.arg) {
        why = "the steps at the two sizes recompute different host scalars";
        break;
      }
      bg.edit_constant(pb.node, pb.arg, [&](ir::Arg& arg) { arg = a.graph.node(pa.node).args[pa.arg]; });
    }
    if (why.empty()) why = cache::generalize(a.graph, a.guards.sizes, bg, b.guards.sizes, b.changed, &b.guards.dyn);
  }
  if (!why.empty()) {
    b.guards.dyn = cache::DynamicSizes{};
    TCAP_LOG(Recompiles, who() << " entry " << b.id << " stays static: " << why);
    return;
  }
  TCAP_LOG(Recompiles, who() << " entry " << b.id << " is dynamic in " << b.changed.size() << " dims ("
                             << b.guards.dyn.patches.size() << " integers follow the sizes)");
}

std::shared_ptr<const StepEntry> CompiledStep::Impl::specialize(const std::shared_ptr<const StepEntry>& e,
                                                                const std::vector<int64_t>& key) {
  if (!e->guards.dyn.dynamic() || key == e->guards.dyn.own_key) return e;
  if (auto s = e->specialized->find(key)) return s;
  auto s = std::make_shared<StepEntry>();
  s->id = e->id;
  s->state = StepEntry::State::Compiled;
  static_cast<StepPlan&>(*s) = static_cast<const StepPlan&>(*e);
  s->graph = cache::specialize(e->graph, e->guards.dyn, key);
  if (std::string why = build_history(*s); !why.empty()) {
    TORCH_CHECK(false, "tcap: ", who(), ": specializing entry ", e->id, " to new sizes: ", why);
  }
  s->exe = compile_step_graph(s->graph, s->patches, options.name + ".step" + std::to_string(e->id) + ".sizes",
                              /*check_host_values=*/false);
  s->scalar_inputs = scalar_tensors(s->patches.size());
  cache->stats().count(&CompileStats::compiles);
  TCAP_LOG(Recompiles, who() << " entry " << e->id << " specialized to sizes " << c10::IntArrayRef(key)
                             << " of its dynamic dims (no recapture)");
  return e->specialized->insert(key, std::move(s));
}

std::vector<at::Tensor> CompiledStep::Impl::replay(const StepEntry& e, const step::StepInputs& g,
                                                   const std::vector<at::Tensor>& primals,
                                                   const std::vector<at::Tensor>& user) {
  auto name_of = [&](size_t k) { return gather(user, true).names.at(k); };  // for errors only
  // The graph's inputs: the step's tensors, then its host scalars recomputed for this call.
  std::vector<at::Tensor> inputs;
  inputs.reserve(primals.size() + e.patches.size());
  inputs.insert(inputs.end(), primals.begin(), primals.end());
  for (size_t k = 0; k < e.patches.size(); ++k) {
    const auto& p = e.patches[k];
    at::Tensor t = e.scalar_inputs.at(k);
    *t.mutable_data_ptr<double>() = step::evaluate(p.expr, opts[p.opt]->host_state(p.param));
    inputs.push_back(std::move(t));
  }
  // Note [Hooks in a compiled step]: an opaque CallHook calls the hook object on this
  // call's tensor, as the engine would: default dispatch, grad mode off.
  const auto outer_keys = c10::impl::tls_local_dispatch_key_set();
  interp::HookRunner runner = [&](int slot, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>&) {
    const auto [k, i] = e.hook_slots.at(static_cast<size_t>(slot));
    const auto hooks = capture::leaf_tensor_hooks(g.ts[k]);
    TORCH_CHECK(i < hooks.size(), "tcap: ", who(), ": hook ", i, " of '", name_of(k), "' is gone");
    c10::impl::ForceDispatchKeyGuard keys(outer_keys);
    at::AutoGradMode grad_mode(false);
    std::vector<at::Tensor> out;
    try {
      out = (*hooks[i])(in);
    } catch (const c10::Error& err) {
      TORCH_CHECK(false, "tcap: ", who(), ": a hook of '", name_of(k), "' failed: ", err.what_without_backtrace());
    }
    TORCH_CHECK(out.size() == in.size(), "tcap: ", who(), ": a hook of '", name_of(k), "' returned ", out.size(),
                " gradients for ", in.size());
    for (size_t j = 0; j < out.size(); ++j) {
      if (!out[j].defined() || !in[j].defined()) continue;
      TORCH_CHECK(out[j].sizes() == in[j].sizes() && out[j].scalar_type() == in[j].scalar_type(),
                  "tcap: ", who(), ": a hook of '", name_of(k), "' changed its gradient from ",
                  ir::dtype_short_name(in[j].scalar_type()), in[j].sizes(), " to ",
                  ir::dtype_short_name(out[j].scalar_type()), out[j].sizes());
    }
    return out;
  };
  std::shared_ptr<step::HistoryCall> history;
  if (e.history) history = step::before_step(e.history, primals, who());
  std::vector<at::Tensor> outs;
  last.host_values.clear();
  {
    interp::HookRunnerScope scope(&runner);
    interp::HostValuesScope host_values(&last.host_values);
    outs = e.exe(std::move(inputs));
  }
  auto& hv = last.host_values;  // the scalars a step's code can read (what a capture lists)
  hv.erase(std::remove_if(hv.begin(), hv.end(), [](const c10::IValue& v) { return !v.isDouble() && !v.isInt() && !v.isBool(); }),
           hv.end());
  last.kind = CompiledStep::Call::Kind::Replayed;
  cache->stats().count(&CompileStats::replays);
  for (size_t k : e.mutated_inputs) torch::autograd::impl::bump_version(g.ts[k]);
  for (size_t j = 0; j < g.num_leaves(); ++j) {
    at::Tensor p = g.leaf(j);
    switch (e.grad_effect[j]) {
      case GradEffect::Keep: break;
      case GradEffect::Clear: p.mutable_grad().reset(); break;
      case GradEffect::Set: p.mutable_grad() = outs.at(static_cast<size_t>(e.grad_output[j])); break;
    }
  }
  for (auto& o : opts) o->advance();
  if (history) step::attach_history(history, outs);
  for (size_t k = 0; k < g.histories.size() && k < e.uses_history.size(); ++k) {
    if (e.uses_history[k]) step::release_history(*g.histories[k]);
  }
  outs.resize(e.num_user_outputs);
  return outs;
}

std::optional<std::vector<at::Tensor>> CompiledStep::Impl::verified(const StepEntry& served, const StepEntry& guarded,
                                                                     const step::StepInputs& g,
                                                                     const std::vector<at::Tensor>& primals,
                                                                     const std::vector<at::Tensor>& user,
                                                                     const VerifyOptions& v) {
  if (served.history || std::any_of(served.uses_history.begin(), served.uses_history.end(), [](bool b) { return b; })) {
    TCAP_LOG(Verify, who() << " entry " << guarded.id << " is not verified: its outputs carry a history of their own");
    return std::nullopt;
  }
  const step::StepInputs named = gather_named(user, g);
  step::StepCheck check;
  check.g = &named;
  check.primals = primals;
  const auto inputs = served.graph.input_nodes();
  for (size_t k = 0; k < primals.size(); ++k) {
    check.names.push_back(k < inputs.size() ? served.graph.node(inputs[k]).name : "input " + std::to_string(k));
  }
  check.opts = parts.opts;
  check.replay = [&] { return replay(served, g, primals, user); };
  check.eager = [&] { return fn(user); };
  check.tolerances = cache::Tolerances::for_options(options);
  check.options = v;
  check.report.who = who() + " entry " + std::to_string(guarded.id);
  check.report.likely =
      "something the step reads that no guard covers changed since the entry was captured: a host value in the "
      "step's code (a flag or number its closure captures, an argument such as zero_grad's set_to_none), a tensor "
      "it reads through its closure that was replaced while the old one is still alive, or state of an object "
      "tcap was not given (a module or optimizer the step uses but compile_step does not know)";
  if (!check.tolerances.exact) {
    check.report.likely += "; or a rounding difference of backend '" + std::string(options.backend.name()) +
                           (options.fused_optimizers ? "' with fused optimizer updates" : "'") + " beyond its tolerance";
  }
  check.report.likely += " (docs/compile.md, \"What a replay re-reads and what it freezes\")";
  std::vector<at::Tensor> outs = step::verified_step(check);
  cache->stats().count(&CompileStats::verified);
  last.kind = CompiledStep::Call::Kind::Eager;  // the step's own code ran last, and its results are kept
  last.host_values.clear();
  return outs;
}

// A call of compile_step through the serving loop (Note [The serving loop]).
struct CompiledStep::Impl::Call {
  using Out = std::vector<at::Tensor>;
  Impl& s;
  const std::vector<at::Tensor>& user;
  std::unique_lock<std::mutex> serial;
  std::optional<step::StepInputs> g;
  cache::CallView call_view;

  std::optional<Out> before() {
    // One call at a time: a step updates shared state (parameters, optimizer state, entries).
    serial = std::unique_lock<std::mutex>(s.call_mutex);
    g.emplace(s.gather(user, /*with_names=*/false));
    call_view = g->view();
    return std::nullopt;
  }
  const cache::CallView& view() const { return call_view; }
  const std::vector<at::Tensor>& primals() const { return g->ts; }

  std::optional<Out> replay(const cache::Lookup& found, bool /*first*/) {
    auto e = std::static_pointer_cast<StepEntry>(found.hit);
    StepEntry::State state;
    {
      std::lock_guard<std::mutex> lock(e->mutex);
      state = e->state;
    }
    switch (state) {
      case StepEntry::State::Compiled: {
        if (!e->fused_groups.empty() && !step::fused_steps_agree(e->fused_groups, s.parts.opts)) {
          // Note [Fused optimizer steps]: one step count per fused call. A fallback like
          // any other: error_on_fallback turns it into an error.
          cache::report_fallback(s.who(), "the step counters of parameters updated by one fused optimizer call "
                                          "differ (some had no gradient in an earlier step)");
          return s.run_eager(user);
        }
        auto entry = s.specialize(e, found.key);  // an inline host-value check may throw: see serve()
        const VerifyOptions v = cache::verify_options_for(s.options);
        if (s.verifier.next(v)) {
          if (auto outs = s.verified(*entry, *e, *g, found.primals, user, v)) return outs;
        }
        return s.replay(*entry, *g, found.primals, user);
      }
      case StepEntry::State::Eager:
        if (!e->by_design) cache::report_fallback(s.who() + " (for these guards)", e->eager_reason);
        return s.run_eager(user);
      case StepEntry::State::Candidate: {
        ir::Graph first = e->graph;
        auto host1 = e->host;
        const step::StepInputs named = s.gather_named(user, *g);
        auto outs = s.capture(*e, user, named);
        if (e->state == StepEntry::State::Candidate) s.verify_and_compile(*e, first, host1, named);
        return outs;
      }
    }
    return std::nullopt;
  }

  std::optional<Out> after_miss() { return std::nullopt; }
  void explain(cache::Lookup&, std::string&) const {}
  bool exclusive() { return true; }  // calls are serial already

  Out capture(const cache::Lookup& l) {
    auto e = std::make_shared<StepEntry>();
    const step::StepInputs named = s.gather_named(user, *g);
    e->guards.capture_call(named.view(), named.names, {});
    e->guards.modules = named.modules;
    e->guards.scalar_names = named.scalar_names;
    // The learning rate is not a guard of a candidate: a schedule changes it every step, and
    // verification decides whether the compiled graph takes it as an input.
    e->guards.scalar_is_input = named.scalar_is_lr;
    if (l.size_miss_of && std::static_pointer_cast<StepEntry>(l.size_miss_of)->state == StepEntry::State::Compiled) {
      e->size_miss_of = l.size_miss_of;
      e->changed = l.changed;
    }
    auto outs = s.capture(*e, user, named);
    s.cache->add(e);
    return outs;
  }
  Out eager(const std::string&) { return s.eager_call(user); }
};

std::vector<at::Tensor> CompiledStep::Impl::call(const std::vector<at::Tensor>& user) {
  Call c{*this, user, {}, {}, {}};
  return cache->serve_call(c);
}

CompiledStep::CompiledStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledStep::~CompiledStep() = default;

std::vector<at::Tensor> CompiledStep::operator()(const std::vector<at::Tensor>& inputs) { return impl_->call(inputs); }

CompileStats CompiledStep::stats() const { return impl_->cache->stats().read(); }

std::string CompiledStep::eager_reason() const {
  if (impl_->cache->fell_back()) return impl_->cache->eager_reason();
  const auto entries = impl_->cache->entries();
  for (auto it = entries->rbegin(); it != entries->rend(); ++it) {
    auto& e = static_cast<StepEntry&>(**it);
    std::lock_guard<std::mutex> lock(e.mutex);
    if (e.state == StepEntry::State::Compiled) return "";
    if (e.state == StepEntry::State::Eager && !e.by_design) return e.eager_reason;
  }
  return impl_->cache->eager_reason();
}

const CompiledStep::Call& CompiledStep::last_call() const { return impl_->last; }

const ir::Graph* CompiledStep::graph() const {
  const auto entries = impl_->cache->entries();
  for (auto it = entries->rbegin(); it != entries->rend(); ++it) {
    auto& e = static_cast<StepEntry&>(**it);
    std::lock_guard<std::mutex> lock(e.mutex);
    if (e.state == StepEntry::State::Compiled) return &e.graph;
  }
  return nullptr;
}

std::shared_ptr<CompiledStep> compile_step(std::vector<std::shared_ptr<torch::nn::Module>> models,
                                           std::vector<std::reference_wrapper<torch::optim::Optimizer>> optimizers,
                                           CompiledFunction::Fn step, CompileOptions options) {
  TORCH_CHECK(!models.empty(), "tcap::compile_step: no model given");
  for (const auto& m : models) TORCH_CHECK(m, "tcap::compile_step: a model is null");
  TORCH_CHECK(step, "tcap::compile_step: the step function is empty");
  TORCH_CHECK(options.cache_size_limit >= 1, "tcap::compile_step: cache_size_limit must be at least 1");
  cache::refuse_unused_options(options, cache::FrontDoor::CompileStep);
  auto impl = std::make_unique<CompiledStep::Impl>();
  impl->parts.models = std::move(models);
  impl->fn = std::move(step);
  if (options.name == "fn") options.name = "step";
  impl->cache = std::make_unique<cache::EntryCache>("step '" + options.name + "'", options.cache_size_limit,
                                                    options.dynamic);
  impl->options = std::move(options);
  std::string why;
  for (auto& o : optimizers) {
    auto a = step::OptimizerAdapter::make(o.get(), &why);
    if (!a) break;
    impl->opts.push_back(std::move(a));
    impl->parts.opts.push_back(impl->opts.back().get());
  }
  if (!why.empty()) impl->cache->fall_back(why + "; the step runs eagerly");
  return std::make_shared<CompiledStep>(std::move(impl));
}

std::shared_ptr<CompiledStep> compile_step(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
                                           CompiledFunction::Fn step, CompileOptions options) {
  TORCH_CHECK(model, "tcap::compile_step: the model is null");
  return compile_step(std::vector<std::shared_ptr<torch::nn::Module>>{std::move(model)},
                      std::vector<std::reference_wrapper<torch::optim::Optimizer>>{optimizer}, std::move(step),
                      std::move(options));
}

}  // namespace tcap
