// tcap::compile_step (include/tcap/train_step.h).
//
// Note [Compiling a whole training step]
// The step function runs forward, backward and optimizer.step(); all of it is recorded
// into one graph (backward ops through the engine hook, as a CaptureGuard records them)
// and replayed by the interpreter on the real tensors, so in-place updates of parameters,
// buffers and optimizer state happen as in eager. What eager does without an ATen op is
// done by tcap after the replay:
//   * .grad assignments (AccumulateGrad stealing a gradient, zero_grad(set_to_none)):
//     each parameter's .grad at the end of the captured step was a graph value, the very
//     tensor it had before, or undefined; replay does the same;
//   * Adam/AdamW step counters: advanced by one per parameter.
// Host values: the optimizer's options are guarded; the scalars Adam computes from its
// step count change every step. tcap captures two consecutive steps with the same guards
// and compares the graphs: they must be identical except for floating-point scalars, and
// each scalar that differs must equal one of Adam's step-count expressions (sqrt of the
// second bias correction, lr over the first, ...) in both steps; replay recomputes those
// from the step count. Any other difference leaves that step eager, with the reason logged.
// A step that creates optimizer state (the first) is never compiled: it runs once.
#include <tcap/train_step.h>

#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "compile/guards.h"
#include "compile/region.h"
#include "support/logging.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <unordered_map>

namespace tcap {
namespace {

enum class OptKind { SGD, Adam, AdamW };

// Host state of the optimizer that the graph depends on.
struct OptSnapshot {
  std::vector<double> options;       // per group: every option value, flattened (guarded)
  std::vector<int64_t> steps;        // Adam/AdamW: per parameter with state
  std::vector<double> group_lr, group_b1, group_b2, group_wd;
  bool operator==(const OptSnapshot& o) const { return options == o.options; }
};

struct ScalarPatch {
  ir::NodeId node;
  size_t arg;
  size_t group;
  int expr;  // index into step_exprs
};

// Scalars Adam-family optimizers compute from the step count s (lr, betas fixed):
double step_expr(int k, double lr, double b1, double b2, double wd, int64_t s) {
  const double c1 = 1 - std::pow(b1, static_cast<double>(s));
  const double c2 = 1 - std::pow(b2, static_cast<double>(s));
  switch (k) {
    case 0: return std::sqrt(c2);
    case 1: return -lr / c1;
    case 2: return lr / c1;
    case 3: return c1;
    case 4: return c2;
    case 5: return 1 / c1;
    case 6: return 1 / std::sqrt(c2);
    case 7: return -lr * std::sqrt(c2) / c1;
    case 8: return lr * std::sqrt(c2) / c1;
    default: (void)wd; return std::nan("");
  }
}
constexpr int kStepExprs = 9;

bool same_double(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(a)); }

struct Signature {
  std::vector<std::string> names;
  std::vector<std::string> sigs;  // per input: dtype/shape/strides/requires_grad/device
  bool grad_mode = true;
  aot::AutocastSig autocast;
  std::vector<bool> training;
  OptSnapshot opt;
  bool operator==(const Signature& o) const {
    return names == o.names && sigs == o.sigs && grad_mode == o.grad_mode && autocast == o.autocast &&
           training == o.training && opt == o.opt;
  }
  // First difference, in words.
  std::string diff(const Signature& o) const {
    if (grad_mode != o.grad_mode) return "grad mode changed";
    if (!(autocast == o.autocast)) return "autocast state changed";
    if (training != o.training) return "a submodule's training flag changed";
    if (!(opt == o.opt)) return "an optimizer option (lr, betas, momentum, ...) changed";
    if (names != o.names) return "the set of .grad / optimizer-state tensors changed";
    for (size_t k = 0; k < sigs.size(); ++k) {
      if (sigs[k] != o.sigs[k]) return "input '" + names[k] + "' changed: " + sigs[k] + " -> " + o.sigs[k];
    }
    return "";
  }
};

std::string sig_of(const at::Tensor& t) {
  std::ostringstream ss;
  ss << ir::dtype_short_name(t.scalar_type()) << t.sizes() << " stride " << t.strides() << " " << t.device()
     << (t.requires_grad() ? " rg" : "");
  return ss.str();
}

enum class GradEffect { Keep, Clear, Set };

struct StepEntry {
  enum class State { Candidate, Compiled, Eager } state = State::Candidate;
  Signature sig;
  ir::Graph graph;          // the latest capture
  OptSnapshot opt_at_capture;
  std::string eager_reason;
  std::shared_ptr<Interpreter> interp;
  std::vector<ScalarPatch> patches;
  std::vector<GradEffect> grad_effect;  // per parameter
  std::vector<int> grad_output;         // per parameter: output index (Set)
  size_t num_user_outputs = 0;
  std::vector<size_t> mutated_inputs;
};

}  // namespace

struct CompiledStep::Impl {
  std::shared_ptr<torch::nn::Module> model;
  torch::optim::Optimizer* opt = nullptr;
  OptKind kind = OptKind::SGD;
  CompiledFunction::Fn fn;
  CompileOptions options;
  std::vector<std::shared_ptr<torch::nn::Module>> submodules;
  std::vector<std::shared_ptr<StepEntry>> entries;
  CompileStats stats;
  std::string eager_reason;

  // Adam and AdamW keep the same options and per-parameter state under two types.
  template <class F>
  void with_adam_options(torch::optim::OptimizerOptions& o, F&& f) const {
    if (kind == OptKind::Adam) f(static_cast<torch::optim::AdamOptions&>(o));
    else f(static_cast<torch::optim::AdamWOptions&>(o));
  }
  template <class F>
  void with_adam_state(torch::optim::OptimizerParamState& st, F&& f) const {
    if (kind == OptKind::Adam) f(static_cast<torch::optim::AdamParamState&>(st));
    else f(static_cast<torch::optim::AdamWParamState&>(st));
  }

  // The optimizer's parameters, in group order (the state map is keyed by them).
  std::vector<at::Tensor> opt_params() const {
    std::vector<at::Tensor> ps;
    for (auto& g : opt->param_groups()) {
      for (auto& p : g.params()) ps.push_back(p);
    }
    return ps;
  }

  OptSnapshot snapshot() const {
    OptSnapshot s;
    for (auto& g : opt->param_groups()) {
      if (kind == OptKind::SGD) {
        auto& o = static_cast<torch::optim::SGDOptions&>(g.options());
        s.options.insert(s.options.end(), {o.lr(), o.momentum(), o.dampening(), o.weight_decay(),
                                           o.nesterov() ? 1.0 : 0.0});
        s.group_lr.push_back(o.lr());
        s.group_b1.push_back(0);
        s.group_b2.push_back(0);
        s.group_wd.push_back(o.weight_decay());
      } else {
        with_adam_options(g.options(), [&](auto& o) {
          const double b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas());
          s.options.insert(s.options.end(), {o.lr(), b1, b2, o.eps(), o.weight_decay(), o.amsgrad() ? 1.0 : 0.0});
          s.group_lr.push_back(o.lr());
          s.group_b1.push_back(b1);
          s.group_b2.push_back(b2);
          s.group_wd.push_back(o.weight_decay());
        });
      }
    }
    if (kind != OptKind::SGD) {
      for (const auto& p : opt_params()) {
        auto it = opt->state().find(p.unsafeGetTensorImpl());
        if (it == opt->state().end()) continue;
        with_adam_state(*it->second, [&](auto& st) { s.steps.push_back(st.step()); });
      }
    }
    return s;
  }

  // Optimizer state tensors (named), in parameter order.
  void state_tensors(std::vector<at::Tensor>& ts, std::vector<std::string>& names) const {
    const auto ps = opt_params();
    for (size_t j = 0; j < ps.size(); ++j) {
      auto it = opt->state().find(ps[j].unsafeGetTensorImpl());
      if (it == opt->state().end()) continue;
      const std::string base = "opt.p" + std::to_string(j) + ".";
      auto add = [&](const at::Tensor& t, const char* what) {
        if (t.defined()) {
          ts.push_back(t);
          names.push_back(base + what);
        }
      };
      if (kind == OptKind::SGD) {
        add(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer(), "momentum_buffer");
      } else {
        with_adam_state(*it->second, [&](auto& st) {
          add(st.exp_avg(), "exp_avg");
          add(st.exp_avg_sq(), "exp_avg_sq");
          add(st.max_exp_avg_sq(), "max_exp_avg_sq");
        });
      }
    }
  }

  // Inputs of a call: user inputs, parameters, buffers, defined .grads, optimizer state.
  struct Gathered {
    std::vector<at::Tensor> ts;
    std::vector<std::string> names;
    std::vector<ir::InputKind> kinds;
    std::vector<at::Tensor> params;        // the model's parameters, named_parameters order
    std::vector<std::string> param_names;
    std::vector<int> grad_input;  // per parameter: index of its .grad input, or -1
  };
  Gathered gather(const std::vector<at::Tensor>& user) const {
    Gathered g;
    for (size_t k = 0; k < user.size(); ++k) {
      g.ts.push_back(user[k]);
      g.names.push_back("in" + std::to_string(k));
      g.kinds.push_back(ir::InputKind::UserInput);
    }
    for (const auto& item : model->named_parameters(true)) {
      g.params.push_back(item.value());
      g.param_names.push_back(item.key());
      g.ts.push_back(item.value());
      g.names.push_back(item.key());
      g.kinds.push_back(ir::InputKind::Parameter);
    }
    for (const auto& item : model->named_buffers(true)) {
      g.ts.push_back(item.value());
      g.names.push_back(item.key());
      g.kinds.push_back(ir::InputKind::Buffer);
    }
    for (size_t j = 0; j < g.params.size(); ++j) {
      const at::Tensor& gr = g.params[j].grad();
      if (gr.defined()) {
        g.grad_input.push_back(static_cast<int>(g.ts.size()));
        g.ts.push_back(gr);
        g.names.push_back(g.param_names[j] + ".grad");
        g.kinds.push_back(ir::InputKind::Buffer);
      } else {
        g.grad_input.push_back(-1);
      }
    }
    std::vector<at::Tensor> st;
    std::vector<std::string> sn;
    state_tensors(st, sn);
    for (size_t k = 0; k < st.size(); ++k) {
      g.ts.push_back(st[k]);
      g.names.push_back(sn[k]);
      g.kinds.push_back(ir::InputKind::Buffer);
    }
    return g;
  }

  Signature signature(const Gathered& g) const {
    Signature s;
    s.names = g.names;
    for (const auto& t : g.ts) s.sigs.push_back(sig_of(t));
    s.grad_mode = at::GradMode::is_enabled();
    s.autocast = aot::AutocastSig::now();
    for (const auto& m : submodules) s.training.push_back(m->is_training());
    s.opt = snapshot();
    return s;
  }

  // Runs the step eagerly with recording on; fills e.graph and the .grad effects, or sets
  // e.eager_reason. Returns the step's outputs.
  std::vector<at::Tensor> capture(StepEntry& e, const std::vector<at::Tensor>& user, const Gathered& g) {
    ++stats.captures;
    CaptureOptions co;
    capture::Session s(co);
    for (size_t k = 0; k < g.ts.size(); ++k) s.declare_input(g.ts[k], g.names[k], g.kinds[k]);
    std::vector<at::Tensor> state_before;
    std::vector<std::string> ignored;
    state_tensors(state_before, ignored);
    std::vector<at::Tensor> outs;
    {
      capture::EngineHookLease lease(&capture::capture_backward_driver);
      capture::RecordingScope recording(&s);
      outs = fn(user);
    }
    e.opt_at_capture = snapshot();
    auto fail = [&](const std::string& why) {
      e.state = StepEntry::State::Eager;
      e.eager_reason = why;
      TCAP_LOG(GraphBreaks, "'" << options.name << "' step runs eagerly for these guards: " << why);
      return outs;
    };
    // Optimizer state must be the same tensors before and after (none created lazily).
    std::vector<at::Tensor> state_after;
    state_tensors(state_after, ignored);
    if (state_after.size() != state_before.size()) {
      return fail("this step creates optimizer state (a first step); it runs once, eagerly");
    }
    for (size_t k = 0; k < state_after.size(); ++k) {
      if (!state_after[k].is_same(state_before[k])) return fail("the optimizer replaced a state tensor");
    }
    ir::Graph graph = s.graph();
    for (const auto& n : graph.nodes()) {
      if (n.kind == ir::NodeKind::CallHook) return fail("a hook ran inside the step");
      if (n.kind != ir::NodeKind::Call) continue;
      if (std::string why = aot::unreplayable(graph, n); !why.empty()) return fail(why);
      if (std::any_of(n.outputs.begin(), n.outputs.end(), ir::is_host_value)) {
        return fail(n.qualified_op() + " reads a value on the host inside the step");
      }
    }
    // Outputs: the step's results, then the new .grad tensors.
    std::vector<ir::ValueId> vals;
    std::vector<std::string> names;
    std::vector<ir::OutputKind> kinds;
    for (size_t k = 0; k < outs.size(); ++k) {
      auto v = outs[k].defined() ? s.lookup(outs[k]) : std::nullopt;
      if (!v) return fail("output " + std::to_string(k) + " was not computed by recorded ops");
      vals.push_back(*v);
      names.push_back("out" + std::to_string(k));
      kinds.push_back(ir::OutputKind::User);
    }
    e.num_user_outputs = outs.size();
    const auto& ps = g.params;
    const auto inputs = graph.input_nodes();
    e.grad_effect.assign(ps.size(), GradEffect::Keep);
    e.grad_output.assign(ps.size(), -1);
    for (size_t j = 0; j < ps.size(); ++j) {
      const at::Tensor& gr = ps[j].grad();
      if (!gr.defined()) {
        e.grad_effect[j] = g.grad_input[j] >= 0 ? GradEffect::Clear : GradEffect::Keep;
        continue;
      }
      if (g.grad_input[j] >= 0 && gr.is_same(g.ts[static_cast<size_t>(g.grad_input[j])])) continue;  // Keep
      auto v = s.lookup(gr);
      if (!v || graph.node(graph.value(*v).producer).kind == ir::NodeKind::Input) {
        return fail("the .grad of parameter " + std::to_string(j) + " was set to a tensor the step did not compute");
      }
      e.grad_effect[j] = GradEffect::Set;
      e.grad_output[j] = static_cast<int>(vals.size());
      vals.push_back(*v);
      names.push_back(g.param_names[j]);
      kinds.push_back(ir::OutputKind::Grad);
    }
    graph.set_outputs(vals, names, kinds);
    graph.meta()["tcap.step"] = options.name;
    // Inputs the step writes (version bumps after replay).
    e.mutated_inputs.clear();
    for (size_t k : graph.written_inputs()) {
      if (k < g.ts.size()) e.mutated_inputs.push_back(k);
    }
    if (inputs.size() != g.ts.size()) {
      // Tensors the step read that are none of the gathered inputs (a closure constant).
      return fail("the step reads " + std::to_string(inputs.size() - g.ts.size()) +
                  " tensor(s) that are not inputs, parameters, buffers, .grads or optimizer state");
    }
    e.graph = std::move(graph);
    return outs;
  }

  // Compares the candidate's graph (first capture) with a second capture; on success
  // compiles the entry.
  void verify_and_compile(StepEntry& e, const ir::Graph& first, const OptSnapshot& opt1) {
    const ir::Graph& g = e.graph;
    auto fail = [&](const std::string& why) {
      e.state = StepEntry::State::Eager;
      e.eager_reason = why;
      TCAP_LOG(GraphBreaks, "'" << options.name << "' step runs eagerly for these guards: " << why);
    };
    if (first.nodes().size() != g.nodes().size()) {
      return fail("two consecutive steps recorded different graphs (" + std::to_string(first.nodes().size()) +
                  " vs " + std::to_string(g.nodes().size()) + " nodes)");
    }
    std::vector<std::pair<ir::NodeId, size_t>> varying;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const auto& a = first.nodes()[i];
      const auto& b = g.nodes()[i];
      const std::string where = "node %" + std::to_string(i) + " (" + b.qualified_op() + ")";
      if (a.kind != b.kind || a.op != b.op || a.overload != b.overload || a.args.size() != b.args.size() ||
          a.outputs != b.outputs) {
        return fail("two consecutive steps recorded different graphs at " + where);
      }
      for (size_t k = 0; k < a.args.size(); ++k) {
        if (a.args[k] == b.args[k]) continue;
        const bool scalar = (a.args[k].kind == ir::ArgKind::Double || a.args[k].kind == ir::ArgKind::WrappedScalar) &&
                            a.args[k].kind == b.args[k].kind && a.args[k].i2 == b.args[k].i2 &&
                            a.args[k].i == b.args[k].i;
        if (!scalar) return fail("two consecutive steps recorded different arguments at " + where);
        varying.emplace_back(static_cast<ir::NodeId>(i), k);
      }
    }
    const auto opt2 = e.opt_at_capture;
    e.patches.clear();
    for (const auto& [node, k] : varying) {
      const double d1 = first.node(node).args[k].d, d2 = g.node(node).args[k].d;
      bool found = false;
      if (kind != OptKind::SGD && !opt1.steps.empty() && !opt2.steps.empty()) {
        const int64_t s1 = opt1.steps.front(), s2 = opt2.steps.front();
        for (size_t grp = 0; grp < opt2.group_lr.size() && !found; ++grp) {
          for (int x = 0; x < kStepExprs && !found; ++x) {
            const double v1 = step_expr(x, opt1.group_lr[grp], opt1.group_b1[grp], opt1.group_b2[grp], opt1.group_wd[grp], s1);
            const double v2 = step_expr(x, opt2.group_lr[grp], opt2.group_b1[grp], opt2.group_b2[grp], opt2.group_wd[grp], s2);
            if (same_double(v1, d1) && same_double(v2, d2)) {
              e.patches.push_back({node, k, grp, x});
              found = true;
            }
          }
        }
      }
      if (!found) {
        std::ostringstream ss;
        ss << "a scalar computed on the host changes between steps (" << g.node(node).qualified_op() << " argument "
           << k << ": " << d1 << " -> " << d2 << ") and is not one tcap can recompute";
        return fail(ss.str());
      }
    }
    if (kind != OptKind::SGD) {
      for (int64_t st : opt2.steps) {
        if (st != opt2.steps.front()) return fail("the optimizer's parameters have different step counts");
      }
    }
    e.interp = std::make_shared<Interpreter>(g);
    e.interp->keep_values(false);
    e.state = StepEntry::State::Compiled;
    ++stats.compiles;
    TCAP_LOG(AotGraphs, "'" << options.name << "' compiled training step (" << g.num_calls() << " ops, "
                            << e.patches.size() << " step-dependent scalars):\n" << ir::to_string(g));
    std::string dir = options.dump_dir.empty() ? Config::get().dump_dir : options.dump_dir;
    if (!dir.empty()) {
      std::filesystem::create_directories(dir);
      ir::save_json(g, dir + "/" + options.name + ".step" + std::to_string(entries.size()) + ".json");
    }
  }

  // host: the optimizer's host state as this call found it (the guards' snapshot).
  std::vector<at::Tensor> replay(StepEntry& e, const Gathered& g, const OptSnapshot& host) {
    ++stats.replays;
    if (!e.patches.empty()) {
      const int64_t s = host.steps.front() + 1;
      for (const auto& p : e.patches) {
        e.interp->set_scalar_arg(p.node, p.arg,
                                 step_expr(p.expr, host.group_lr[p.group], host.group_b1[p.group],
                                           host.group_b2[p.group], host.group_wd[p.group], s));
      }
    }
    auto outs = e.interp->run(g.ts);
    for (size_t k : e.mutated_inputs) torch::autograd::impl::bump_version(g.ts[k]);
    for (size_t j = 0; j < g.params.size(); ++j) {
      at::Tensor p = g.params[j];
      switch (e.grad_effect[j]) {
        case GradEffect::Keep: break;
        case GradEffect::Clear: p.mutable_grad().reset(); break;
        case GradEffect::Set: p.mutable_grad() = outs.at(static_cast<size_t>(e.grad_output[j])); break;
      }
    }
    if (kind != OptKind::SGD) {
      for (const auto& p : opt_params()) {
        auto it = opt->state().find(p.unsafeGetTensorImpl());
        if (it == opt->state().end()) continue;
        with_adam_state(*it->second, [](auto& st) { st.step(st.step() + 1); });
      }
    }
    outs.resize(e.num_user_outputs);
    return outs;
  }

  std::vector<at::Tensor> call(const std::vector<at::Tensor>& user) {
    if (!eager_reason.empty()) {
      ++stats.eager_calls;
      return fn(user);
    }
    const Gathered g = gather(user);
    const Signature sig = signature(g);
    std::string first_miss;
    for (auto& e : entries) {
      if (!(e->sig == sig)) {
        if (first_miss.empty()) first_miss = e->sig.diff(sig);
        continue;
      }
      switch (e->state) {
        case StepEntry::State::Compiled: return replay(*e, g, sig.opt);
        case StepEntry::State::Eager: ++stats.eager_calls; return fn(user);
        case StepEntry::State::Candidate: {
          ir::Graph first = e->graph;
          OptSnapshot opt1 = e->opt_at_capture;
          auto outs = capture(*e, user, g);
          if (e->state == StepEntry::State::Candidate) verify_and_compile(*e, first, opt1);
          return outs;
        }
      }
    }
    if (static_cast<int>(entries.size()) >= options.cache_size_limit) {
      TORCH_WARN("tcap: step '", options.name, "' reached its cache size limit (", options.cache_size_limit,
                 "); it runs eagerly from now on. Last guard failure: ", first_miss);
      eager_reason = "cache size limit reached";
      ++stats.eager_calls;
      return fn(user);
    }
    if (!entries.empty()) {
      ++stats.recompiles;
      TCAP_LOG(Recompiles, "'" << options.name << "' step: new guards (" << first_miss << ")");
    }
    auto e = std::make_shared<StepEntry>();
    e->sig = sig;
    entries.push_back(e);
    return capture(*e, user, g);
  }
};

CompiledStep::CompiledStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledStep::~CompiledStep() = default;

std::vector<at::Tensor> CompiledStep::operator()(const std::vector<at::Tensor>& inputs) { return impl_->call(inputs); }

const CompileStats& CompiledStep::stats() const { return impl_->stats; }

std::string CompiledStep::eager_reason() const {
  if (!impl_->eager_reason.empty()) return impl_->eager_reason;
  for (auto it = impl_->entries.rbegin(); it != impl_->entries.rend(); ++it) {
    if ((*it)->state == StepEntry::State::Compiled) return "";
    if ((*it)->state == StepEntry::State::Eager && !(*it)->eager_reason.empty()) return (*it)->eager_reason;
  }
  return "";
}

const ir::Graph* CompiledStep::graph() const {
  for (auto it = impl_->entries.rbegin(); it != impl_->entries.rend(); ++it) {
    if ((*it)->state == StepEntry::State::Compiled) return &(*it)->graph;
  }
  return nullptr;
}

std::shared_ptr<CompiledStep> compile_step(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
                                           CompiledFunction::Fn step, CompileOptions options) {
  TORCH_CHECK(model, "tcap::compile_step: the model is null");
  TORCH_CHECK(step, "tcap::compile_step: the step function is empty");
  auto impl = std::make_unique<CompiledStep::Impl>();
  impl->model = model;
  impl->opt = &optimizer;
  impl->fn = std::move(step);
  if (options.name == "fn") options.name = "step";
  impl->options = std::move(options);
  impl->submodules.push_back(model);
  for (const auto& m : model->modules(false)) impl->submodules.push_back(m);
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) impl->kind = OptKind::SGD;
  else if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) impl->kind = OptKind::AdamW;
  else if (dynamic_cast<torch::optim::Adam*>(&optimizer)) impl->kind = OptKind::Adam;
  else impl->eager_reason = "compile_step supports SGD, Adam and AdamW optimizers; this one runs eagerly";
  if (!impl->eager_reason.empty()) TCAP_LOG(GraphBreaks, impl->eager_reason);
  return std::make_shared<CompiledStep>(std::move(impl));
}

}  // namespace tcap
