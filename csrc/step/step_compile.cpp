// Capturing a step and compiling it into an entry (Note [Compiling a whole training step]
// in train_step.cpp): the two captures, their comparison and the host scalars found in
// them, the step graph compiled through the pipeline, the history slice of outputs a later
// backward may use, and the generalization and specialization over sizes.
#include "step/step_impl.h"

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

std::vector<at::Tensor> CompiledStep::Impl::capture(StepEntry& e, const std::vector<at::Tensor>& user,
                                                     const step::StepInputs& g, bool count_capture) {
  if (count_capture) cache->stats().count(&CompileStats::captures);
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

std::unordered_map<ir::NodeId, std::pair<size_t, size_t>> CompiledStep::Impl::param_inputs(
    const StepEntry& e, const step::StepInputs& g) const {
  const auto inputs = e.graph.input_nodes();
  std::unordered_map<ir::NodeId, std::pair<size_t, size_t>> out;
  for (size_t j = 0; j < g.params.size(); ++j) {
    if (g.params[j].opt < 0) continue;
    out[inputs.at(static_cast<size_t>(g.param_input[j]))] = {static_cast<size_t>(g.params[j].opt), g.params[j].index};
  }
  return out;
}

// Note [A step compiled from captures at two sizes]
// A step compiles after two captures of one structure: comparing them tells which numbers
// are host scalars recomputed per step (the learning rate, Adam's bias corrections; Note
// [Host scalars of optimizers]) and that the step records the same graph twice. Captured
// at the same sizes, that takes two calls at one size, and lengths that rarely repeat back
// to back (batches of varying length) would start a candidate per length and never
// compile. So the first capture at new sizes is also compared with the nearest capture at
// other sizes (a candidate's, or the record of a compiled entry): where the two graphs
// differ only by integers that follow the changed sizes (their floats, which may be host
// scalars, taken from this capture for the fit), that capture specialized to these sizes
// stands in for a first capture here, the two are compared as two captures at one size
// are, and the step compiles now, from this capture's graph; generalized with a compiled
// entry (Note [Dynamic sizes]), it is dynamic, and each later size is checked as any
// dynamic entry's (Note [Checking a new size]). Where anything else differs (a float that
// follows a size, an integer no form explains), the capture stays a candidate as before.
bool CompiledStep::Impl::compile_from_other_sizes(StepEntry& e, const StepEntry& a, const step::StepInputs& g) {
  ir::Graph other;
  std::vector<std::vector<HostState>> other_host;
  {
    std::lock_guard<std::mutex> lock(const_cast<StepEntry&>(a).mutex);
    if (a.eager()) return false;
    other = a.state == StepEntry::State::Compiled ? a.record : a.graph;
    other_host = a.host;
  }
  // Why this capture cannot stand in for a first one: logged, as the step then waits for a
  // second capture at its sizes (a step whose structure follows the sizes, such as an RNN
  // unrolled over its length, never gets one at a length that does not repeat).
  auto waits = [&](const std::string& why) {
    TCAP_LOG(Recompiles, who() << " entry " << e.id << " waits for a second capture at its sizes: compared with entry "
                               << a.id << "'s capture at other sizes, " << why);
    return false;
  };
  if (a.guards.sizes.size() != e.guards.sizes.size()) return waits("it has other inputs");
  if (other.nodes().size() != e.graph.nodes().size()) {
    return waits("its graph has " + std::to_string(e.graph.nodes().size()) + " nodes where that one has " +
                 std::to_string(other.nodes().size()) + " (the step's structure follows its sizes: a loop unrolled over a length?)");
  }
  const std::vector<size_t> changed = cache::changed_sizes(a.guards.sizes, e.guards.sizes);
  ir::Graph fit = other;
  for (size_t i = 0; i < fit.nodes().size(); ++i) {
    const ir::Node& na = fit.nodes()[i];
    const ir::Node& nb = e.graph.nodes()[i];
    if (na.args.size() != nb.args.size()) return waits("node %" + std::to_string(i) + " has other arguments");
    for (size_t k = 0; k < na.args.size(); ++k) {
      const ir::Arg& x = na.args[k];
      const ir::Arg& y = nb.args[k];
      const bool number = x.kind == y.kind && (x.kind == ir::ArgKind::Double || x.kind == ir::ArgKind::WrappedScalar);
      if (number && !(x == y)) fit.edit_constant(na.id, k, [&y](ir::Arg& arg) { arg = y; });
    }
  }
  cache::DynamicSizes d;
  if (const std::string why = cache::generalize(fit, a.guards.sizes, e.graph, e.guards.sizes, changed, &d,
                                                /*first_fit=*/true);
      !why.empty()) {
    return waits(why);
  }
  const ir::Graph first = cache::specialize(other, d, d.own_key);
  step::StepComparison cmp = step::compare_step_captures(first, e.graph, other_host, e.host, parts.opts,
                                                         param_inputs(e, g), options.observe_host_values);
  if (!cmp.why_not.empty()) return waits(cmp.why_not);
  TCAP_LOG(Recompiles, who() << " entry " << e.id << " compiles from one capture: entry " << a.id
                             << "'s capture at other sizes, specialized to these, stands in for the first");
  compile_compared(e, std::move(cmp), g);
  return true;
}

void CompiledStep::Impl::verify_and_compile(StepEntry& e, const ir::Graph& first,
                                            const std::vector<std::vector<HostState>>& host1, const step::StepInputs& g) {
  step::StepComparison cmp = step::compare_step_captures(first, e.graph, host1, e.host, parts.opts, param_inputs(e, g),
                                                         options.observe_host_values);
  if (!cmp.why_not.empty()) return go_eager(e, cmp.why_not);
  compile_compared(e, std::move(cmp), g);
}

void CompiledStep::Impl::compile_compared(StepEntry& e, step::StepComparison cmp, const step::StepInputs& g) {
  e.record = e.graph;
  e.record_scalars.clear();
  for (const auto& p : cmp.patches) e.record_scalars.emplace_back(p.node, p.arg);
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
    for (const auto& [node, key] : param_inputs(e, g)) param_values[key] = e.graph.node(node).outputs.at(0).values.at(0);
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
  if (std::string why = build_history(e, who()); !why.empty()) return go_eager(e, why);
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
  e.rng_devices.clear();
  if (inline_checks && std::any_of(e.graph.nodes().begin(), e.graph.nodes().end(),
                                   [](const ir::Node& n) { return n.draws_random_numbers(); })) {
    e.rng_devices = aot::devices_of(e.graph);
  }
  try {
    e.exe = compile_step_graph(options, e.graph, e.patches, options.name + ".step" + std::to_string(e.id), inline_checks);
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
  take_place_of_static(e);
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
  cache::dump_graphs(options, options.name + ".step" + std::to_string(e.id), {{"", &e.graph}});
}

std::string CompiledStep::Impl::build_history(StepEntry& e, const std::string& who) {
  e.history.reset();
  if (e.with_history.empty()) return "";
  std::vector<ir::NodeId> patched;
  for (const auto& p : e.patches) patched.push_back(p.node);
  auto slice = std::make_shared<step::HistorySlice>();
  std::string why = step::make_history_slice(e.graph, e.with_history, e.buffer_inputs, patched, slice.get());
  if (!why.empty()) return why + "; a replayed output has no history of its own";
  TCAP_LOG(AotGraphs, who << ": output(s) " << c10::IntArrayRef(std::vector<int64_t>(e.with_history.begin(), e.with_history.end()))
                            << " keep their autograd history on a replay (a node that recomputes "
                            << slice->graph.num_calls() << " ops in its backward)");
  e.history = std::move(slice);
  return "";
}

namespace {

// Whether step a's compiled plan may serve calls that passed b's guards at a's sizes: the
// plans agree on everything but the graph's integers (their graphs agree up to those:
// generalize). b's guards are what such a call passed; a's code is what runs.
bool plans_agree(const StepEntry& a, const StepEntry& b) {
  if (a.patches.size() != b.patches.size()) return false;
  for (size_t k = 0; k < a.patches.size(); ++k) {
    const auto &p = a.patches[k], &q = b.patches[k];
    if (p.node != q.node || p.arg != q.arg || p.opt != q.opt || p.param != q.param || p.expr != q.expr) return false;
  }
  auto same_groups = [](const std::vector<step::MultiTensorUpdate>& x, const std::vector<step::MultiTensorUpdate>& y) {
    if (x.size() != y.size()) return false;
    for (size_t k = 0; k < x.size(); ++k) {
      if (x[k].opt != y[k].opt || x[k].params != y[k].params) return false;
    }
    return true;
  };
  return a.grad_effect == b.grad_effect && a.grad_output == b.grad_output && a.num_user_outputs == b.num_user_outputs &&
         a.mutated_inputs == b.mutated_inputs && a.hook_slots == b.hook_slots && a.with_history == b.with_history &&
         a.buffer_inputs == b.buffer_inputs && a.uses_history == b.uses_history && same_groups(a.fused_groups, b.fused_groups) &&
         a.guards.scalars == b.guards.scalars && a.guards.scalar_is_input == b.guards.scalar_is_input &&
         a.guards.host.mode() == b.guards.host.mode();
}

}  // namespace

// Note [A dynamic entry takes the place of the static one], for steps: e was published as
// a candidate and generalized once compiled, so it moves into the static entry's place
// (EntryCache::move_into_place) where that entry's plan can serve its calls.
void CompiledStep::Impl::take_place_of_static(StepEntry& e) {
  if (!e.size_miss_of || !e.guards.dyn.dynamic() || e.eager()) return;
  const auto& a = static_cast<const StepEntry&>(*e.size_miss_of);
  if (a.state != StepEntry::State::Compiled || !plans_agree(a, e)) return;
  if (auto gone = cache::take_place_of_static(e.size_miss_of, e, who())) cache->move_into_place(e, gone);
}

void CompiledStep::Impl::generalize(const StepEntry& a, StepEntry& b) {
  std::string why;
  if (a.state != StepEntry::State::Compiled) why = "the other entry is not compiled";
  if (why.empty()) why = cache::host_reads_keep_static(a.guards, b.guards);
  if (why.empty() && (a.patches.size() != b.patches.size() || a.record_scalars != b.record_scalars)) {
    why = "the steps at the two sizes recompute or record different host scalars";
  }
  // Host scalars differ between the two captures by design: b's graph and record are
  // compared with a's values in their place (copies made only when they will be fitted).
  ir::Graph bg, rb;
  if (why.empty()) {
    bg = b.graph;
    rb = b.record;
  }
  for (size_t k = 0; k < b.patches.size() && why.empty(); ++k) {
    const auto& pb = b.patches[k];
    const auto& pa = a.patches[k];
    if (pa.node != pb.node || pa.arg != pb.arg) {
      why = "the steps at the two sizes recompute different host scalars";
      break;
    }
    bg.edit_constant(pb.node, pb.arg, [&](ir::Arg& arg) { arg = a.graph.node(pa.node).args[pa.arg]; });
  }
  if (why.empty()) {
    for (const auto& [node, arg] : b.record_scalars) {
      rb.edit_constant(node, arg, [&](ir::Arg& x) { x = a.record.node(node).args.at(arg); });
    }
  }
  // The whole step is checked at each new size (Note [Checking a new size]): an integer two
  // sizes explain alike may take the first.
  cache::make_dynamic(std::move(why), {a.graph, a.record, a.guards.sizes}, {bg, rb, b.guards.sizes}, b.guards.dyn,
                      b.changed, b.record_scalars, /*first_fit=*/options.check_new_sizes, who(), b.id,
                      [&] { return b.guards.describe_dynamic(); });
}

std::vector<at::Tensor> CompiledStep::Impl::check_call(const std::vector<at::Tensor>& user, const step::StepInputs& g,
                                                        cache::SizeCheckRecording* recorded) {
  StepEntry check;
  const step::StepInputs named = gather_named(user, g);
  auto outs = capture(check, user, named, /*count_capture=*/false);
  if (const auto eager = check.eager()) recorded->why_not = "the step cannot be compiled at these sizes: " + eager->why;
  else recorded->graph = std::move(check.graph);
  return outs;
}

namespace {

// Step entry e's plan over `graph` (e's graph patched to new sizes), with its history slice
// made again and its graph compiled. It reads e, the options and its arguments only, so it
// may run as a background job (Note [Specializations in the background]).
std::shared_ptr<StepEntry> step_specialization(const StepEntry& e, ir::Graph graph, const CompileOptions& options,
                                               const std::string& who, bool check_host_values) {
  auto s = std::make_shared<StepEntry>();
  s->id = e.id;
  s->state = StepEntry::State::Compiled;
  static_cast<StepPlan&>(*s) = static_cast<const StepPlan&>(e);
  s->graph = std::move(graph);
  if (std::string why = CompiledStep::Impl::build_history(*s, who); !why.empty()) {
    TORCH_CHECK(false, "tcap: ", who, ": specializing entry ", e.id, " to new sizes: ", why);
  }
  s->exe = CompiledStep::Impl::compile_step_graph(options, s->graph, s->patches,
                                                  options.name + ".step" + std::to_string(e.id) + ".sizes",
                                                  check_host_values);
  s->scalar_inputs = CompiledStep::Impl::scalar_tensors(s->patches.size());
  return s;
}

bool checks_host_values_inline(const StepEntry& e) { return e.guards.host.mode() == cache::HostReads::Mode::Inline; }

}  // namespace

std::shared_ptr<const StepEntry> CompiledStep::Impl::specialize(const std::shared_ptr<const StepEntry>& e,
                                                                const std::vector<int64_t>& key) {
  return cache::specialized(e, e->graph, key, &cache->stats(), [&] { return who(); }, [&](ir::Graph graph) {
    return step_specialization(*e, std::move(graph), options, who(), checks_host_values_inline(*e));
  });
}

std::shared_ptr<const StepEntry> CompiledStep::Impl::specialize_in_background(const std::shared_ptr<const StepEntry>& e,
                                                                              const std::vector<int64_t>& key) {
  // The job holds the entry (its plan does not change once compiled), a copy of the
  // options and the step's name.
  return cache::specialized_in_background(
      e, &e->graph, key, cache->shared_stats(), [&] { return who(); },
      [&] {
        return [e, options = options, who = who(), inline_checks = checks_host_values_inline(*e)](ir::Graph graph) {
          return step_specialization(*e, std::move(graph), options, who, inline_checks);
        };
      },
      runtime::submit_specialization);
}

}  // namespace tcap
