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
#include "step/step_impl.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace tcap {

std::vector<at::Tensor> CompiledStep::Impl::replay(const StepEntry& e, const step::StepInputs& g,
                                                   const std::vector<at::Tensor>& primals,
                                                   const std::vector<at::Tensor>& user, capture::HookTape* tape) {
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
    if (tape) {
      if (auto out = tape->play(slot, in)) return *out;
    }
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
    // A replay that stops at a changed host value leaves the random number generators as
    // it found them: the call then runs another way (as replay_region does).
    std::optional<aot::RngStates> rng;
    if (!e.rng_devices.empty()) rng = aot::RngStates::save(e.rng_devices);
    try {
      outs = e.exe(std::move(inputs));
    } catch (const HostValueChanged&) {
      if (rng) rng->restore();
      throw;
    }
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
  check.replay = [&](capture::HookTape* tape) { return replay(served, g, primals, user, tape); };
  for (size_t s = 0; s < served.hook_slots.size(); ++s) {
    const auto [k, i] = served.hook_slots[s];
    check.hooks.push_back({g.ts.at(k), i, static_cast<int>(s)});
    check.hook_names.push_back(check.names.at(k));
  }
  check.eager = [&] { return fn(user); };
  check.tolerances = cache::Tolerances::for_options(options);
  check.options = v;
  check.report.who = who() + " entry " + std::to_string(guarded.id);
  check.report.likely =
      "something the step reads that no guard covers changed since the entry was captured: a host value in the "
      "step's code (a flag or number its closure captures, an argument such as zero_grad's set_to_none), a tensor "
      "it reads through its closure that was replaced while the old one is still alive, or state of an object "
      "tcap was not given (a module or optimizer the step uses but compile_step does not know)";
  if (guarded.guards.dyn.dynamic() && !options.check_new_sizes) {
    check.report.likely += "; or a branch on a size in the step's code: the entry is dynamic and check_new_sizes = "
                           "false promised that no host code branches on its dynamic sizes";
  } else if (guarded.guards.dyn.dynamic() && !options.dynamic_dims.empty()) {
    check.report.likely += "; or a branch on a size in the step's code that CompileOptions::dynamic_dims promised "
                           "does not exist (sizes within its bounds are served without a check capture)";
  }
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
struct CompiledStep::Impl::ServedCall {
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
    // An entry that runs eagerly never gets here: the serving loop runs its calls eagerly
    // (Note [Calls that run eagerly]).
    switch (state) {
      case StepEntry::State::Compiled: {
        if (!e->fused_groups.empty() && !step::fused_steps_agree(e->fused_groups, s.parts.opts)) {
          // Note [Fused optimizer steps]: one step count per fused call. A fallback like
          // any other: error_on_fallback turns it into an error.
          cache::report_fallback(s.who(), "the step counters of parameters updated by one fused optimizer call "
                                          "differ (some had no gradient in an earlier step)");
          return s.run_eager(user);
        }
        // An inline host-value check may throw: see serve().
        auto entry = s.in_background() ? s.specialize_in_background(e, found.key) : s.specialize(e, found.key);
        if (!entry) return s.run_eager(user);  // Note [Specializations in the background]: being made
        const VerifyOptions v = cache::verify_options_for(s.options);
        if (s.verifier.next(v)) {
          if (auto outs = s.verified(*entry, *e, *g, found.primals, user, v)) return outs;
        }
        return s.replay(*entry, *g, found.primals, user);
      }
      case StepEntry::State::Candidate: {
        ir::Graph first = e->graph;
        auto host1 = e->host;
        const step::StepInputs named = s.gather_named(user, *g);
        auto outs = s.capture(*e, user, named);
        if (e->state == StepEntry::State::Candidate && !e->eager()) s.verify_and_compile(*e, first, host1, named);
        return outs;
      }
    }
    return std::nullopt;
  }

  std::optional<Out> after_miss(bool*) { return std::nullopt; }
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
    // Note [A step compiled from captures at two sizes].
    if (l.size_miss_of && e->state == StepEntry::State::Candidate && !e->eager()) {
      s.compile_from_other_sizes(*e, static_cast<const StepEntry&>(*l.size_miss_of), named);
    }
    return outs;
  }
  Out eager(const std::string&) { return s.eager_call(user); }
  std::optional<Out> check(cache::SizeCheckRecording* recorded) {
    return s.check_call(user, *g, recorded);
  }
};

std::vector<at::Tensor> CompiledStep::Impl::call(const std::vector<at::Tensor>& user) {
  ServedCall c{*this, user, {}, {}, {}};
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
    if (auto m = e.eager(); m && !m->by_design) return m->why;
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
                                                    options.dynamic, options.check_new_sizes, options.static_dims,
                                                    options.dynamic_dims);
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
