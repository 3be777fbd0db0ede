// Note [Verifying a compiled step]
// A verified call of a compiled step (verify mode) snapshots what the step can change: the
// values of every tensor it reads (parameters, buffers, .grads, optimizer state, the
// tensors it reads from outside), which tensor each leaf's .grad is, the optimizers' state
// objects (step counters) and the random number generators. It runs the step's own code
// eagerly and keeps what that produced, puts everything back (values copied in without
// moving version counters, .grads and state objects reassigned), replays the compiled step
// on the same random numbers and compares: the outputs, every snapshotted tensor's value,
// each leaf's .grad (defined or not, kept or replaced, its value), the step counters and
// the gradients each opaque hook received. Then eager's state goes back (before a
// difference is reported), so a verified program computes what eager computes. What the
// step's code does on the host (a log line, a counter) runs once, in the eager run, and so
// do the parameters' hooks: the compiled step takes their taped results (Note [Hooks called
// once under verify], capture/hooks.h).
//
// With a fused backend or fused optimizer updates, gradients differ from eager's by
// rounding, and an optimizer like Adam turns a gradient that is zero in exact arithmetic
// (a bias followed by batch norm: rounding noise of either sign) into a full step of
// either sign. So where the two runs' gradients of a parameter differ by more than 1%
// relatively, that parameter's elements, and its optimizer state's, are left out of the
// comparison (Note [Verify tolerances]); the gradients themselves are compared as usual.
#include "step/verify_step.h"

#include "aot/replay_function.h"
#include "support/logging.h"

#include <tcap/interpreter.h>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <map>
#include <optional>

namespace tcap::step {
namespace {

// The elements of a parameter whose update the two runs may take in different directions
// (see the Note): where the gradients differ by more than 1% relatively. Undefined: none.
at::Tensor unsettled(const at::Tensor& compiled_grad, const at::Tensor& eager_grad) {
  if (!compiled_grad.defined() || !eager_grad.defined() || compiled_grad.sizes() != eager_grad.sizes()) return {};
  const at::Tensor c = compiled_grad.detach().to(at::kDouble), e = eager_grad.detach().to(at::kDouble);
  return (c - e).abs() > e.abs() * 1e-2;
}

std::string compare_settled(const at::Tensor& compiled, const at::Tensor& eager, const at::Tensor& skip,
                            const cache::Tolerances& tol) {
  if (!skip.defined() || tol.exact || !compiled.defined() || !eager.defined() || compiled.sizes() != skip.sizes() ||
      eager.sizes() != skip.sizes()) {
    return cache::compare_tensors(compiled, eager, tol);
  }
  const at::Tensor keep = skip.logical_not();
  return cache::compare_tensors(compiled.detach().masked_select(keep), eager.detach().masked_select(keep), tol);
}

}  // namespace

std::vector<at::Tensor> verified_step(const StepCheck& check) {
  const StepInputs& g = *check.g;
  at::NoGradGuard no_grad_for_snapshots;
  // What the step can change, as a run leaves it: values, which tensor each .grad is, the
  // optimizers' state objects.
  struct State {
    std::vector<at::Tensor> values;      // per primal
    std::vector<at::Tensor> grads;       // per leaf: the tensor
    std::vector<at::Tensor> grad_values; // per leaf: its value
    std::vector<OptimizerAdapter::StateCopy> opt_states;
    std::vector<std::map<void*, int64_t>> steps;
  };
  auto save = [&] {
    State st;
    for (const auto& t : check.primals) st.values.push_back(t.defined() ? t.detach().clone() : at::Tensor());
    for (size_t j = 0; j < g.num_leaves(); ++j) {
      st.grads.push_back(g.leaf(j).grad());
      st.grad_values.push_back(st.grads.back().defined() ? st.grads.back().detach().clone() : at::Tensor());
    }
    for (const auto* o : check.opts) {
      st.opt_states.push_back(o->copy_state());
      auto& steps = st.steps.emplace_back();
      const auto ps = o->params();
      for (size_t j = 0; j < ps.size(); ++j) steps[ps[j].unsafeGetTensorImpl()] = o->host_state(j).step;
    }
    return st;
  };
  auto put_back = [&](const State& st) {
    for (size_t k = 0; k < check.primals.size(); ++k) {
      // An input whose elements share memory (an expand()ed, stride-0 tensor) cannot have
      // been written in place (eager refuses that write too), and copy_ into it is refused.
      if (check.primals[k].defined() && at::has_internal_overlap(check.primals[k]) != at::MemOverlap::Yes) {
        check.primals[k].variable_data().copy_(st.values[k]);
      }
    }
    for (size_t j = 0; j < g.num_leaves(); ++j) {
      at::Tensor leaf = g.leaf(j);
      leaf.mutable_grad() = st.grads[j];  // a .grad the run set anew is no primal: its value is the run's
    }
    for (size_t o = 0; o < check.opts.size(); ++o) check.opts[o]->restore_state(st.opt_states[o]);
  };
  std::vector<c10::Device> devices{c10::kCPU};
  for (const auto& t : check.primals) {
    if (t.defined() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) devices.push_back(t.device());
  }
  const State before = save();
  const aot::RngStates rng = aot::RngStates::save(devices);

  // Eager, calling the step's opaque hooks for real and taping them (Note [Hooks called
  // once under verify]).
  capture::HookTape tape;
  std::vector<at::Tensor> eager_out;
  {
    at::AutoGradMode as_called(true);
    StanceGuard eager_only(Stance::ForceEager);
    capture::HookTapeScope taped(check.hooks, &tape, capture::HookTapeScope::Mode::Record);
    eager_out = check.eager();
  }
  const State eager = save();
  const aot::RngStates rng_after = aot::RngStates::save(devices);

  // Everything back as it was; the compiled step, its hooks served from the tape.
  put_back(before);
  rng.restore();
  std::vector<at::Tensor> compiled_out;
  try {
    at::AutoGradMode as_called(true);
    compiled_out = check.replay(&tape);
  } catch (const HostValueChanged& err) {
    // A value read on the host changed (an inline guard, checked as the replay reads it):
    // not this entry's call. Eager's step ran already and is the answer; a later call
    // recaptures (rethrown, the serving loop would run the step's code a second time).
    put_back(eager);
    rng_after.restore();
    TCAP_LOG(Verify, check.report.who << " was not compared: " << err.what_without_backtrace());
    return eager_out;
  } catch (const c10::Error& err) {
    // Eager's step ran and did not raise: a replay that does is a difference too.
    put_back(eager);
    rng_after.restore();
    cache::VerifyReport r = check.report;
    r.what = "the compiled step";
    r.how = std::string("raised where eager's did not: ") + err.what_without_backtrace();
    cache::report_mismatch(check.options, r);  // throws unless log_only
    return eager_out;
  }

  // Compare the compiled step's state (the current one) with eager's.
  size_t compared = 0;
  std::optional<cache::VerifyReport> mismatch;
  auto differ = [&](const std::string& what, const std::string& how) {
    mismatch = check.report;
    mismatch->what = what;
    mismatch->how = how;
    return false;
  };
  auto run = [&]() -> bool {
    if (compiled_out.size() != eager_out.size()) {
      return differ("the outputs", std::to_string(compiled_out.size()) + " tensors where eager returned " +
                                       std::to_string(eager_out.size()));
    }
    for (size_t k = 0; k < compiled_out.size(); ++k, ++compared) {
      std::string how = cache::compare_tensors(compiled_out[k], eager_out[k], check.tolerances);
      if (!how.empty()) return differ("output " + std::to_string(k), how);
    }
    for (const auto& p : tape.played()) {
      for (size_t j = 0; j < p.in.size() && j < p.taped_in.size(); ++j, ++compared) {
        std::string how = cache::compare_tensors(p.in[j], p.taped_in[j], check.tolerances);
        if (!how.empty()) {
          return differ("the gradient a hook of '" + check.hook_names.at(static_cast<size_t>(p.slot)) + "' receives", how);
        }
      }
    }
    std::vector<at::Tensor> skip(check.primals.size());  // per primal: elements not compared
    for (size_t j = 0; j < g.num_leaves(); ++j, ++compared) {
      const at::Tensor& now = g.leaf(j).grad();
      const std::string name = "the .grad of '" + g.leaf_name(j) + "'";
      const bool kept_c = now.defined() && now.is_same(before.grads[j]);
      const bool kept_e = eager.grads[j].defined() && eager.grads[j].is_same(before.grads[j]);
      if (now.defined() != eager.grads[j].defined()) {
        return differ(name, eager.grads[j].defined() ? "no tensor where eager's step set one"
                                                     : "a tensor where eager's step left none");
      }
      if (kept_c != kept_e) {
        return differ(name, kept_e ? "a new tensor where eager's step kept (and accumulated into) the one it had"
                                   : "the tensor it had where eager's step set a new one");
      }
      std::string how = cache::compare_tensors(now, eager.grad_values[j], check.tolerances);
      if (!how.empty()) return differ(name, how);
      if (j < g.params.size() && !check.tolerances.exact) {
        skip[static_cast<size_t>(g.param_input[j])] = unsettled(now, eager.grad_values[j]);
      }
    }
    for (size_t k = 0; k < check.primals.size(); ++k, ++compared) {
      // Optimizer state tensors follow their parameter's unsettled elements.
      at::Tensor mask = skip[k];
      if (!mask.defined()) {
        for (size_t s = 0; s < g.state_input.size(); ++s) {
          if (g.state_input[s] != k || s >= g.state_param.size()) continue;
          const int p = g.state_param[s];
          if (p >= 0) mask = skip[static_cast<size_t>(g.param_input[static_cast<size_t>(p)])];
        }
      }
      const at::Tensor now = check.primals[k].defined() ? check.primals[k].detach() : at::Tensor();
      std::string how = compare_settled(now, eager.values[k], mask, check.tolerances);
      if (!how.empty()) return differ("'" + check.names.at(k) + "'", how);
    }
    for (size_t o = 0; o < check.opts.size(); ++o) {
      const auto ps = check.opts[o]->params();
      for (size_t j = 0; j < ps.size(); ++j) {
        const int64_t c = check.opts[o]->host_state(j).step, e = eager.steps[o].at(ps[j].unsafeGetTensorImpl());
        if (c != e) {
          return differ("the step counter of optimizer " + std::to_string(o) + "'s parameter " + std::to_string(j),
                        std::to_string(c - 1) + " where eager's is " + std::to_string(e - 1));
        }
      }
    }
    return true;
  };
  run();
  // Eager's results back, before a difference is reported (it throws unless log_only).
  put_back(eager);
  rng_after.restore();
  if (mismatch) {
    cache::report_mismatch(check.options, *mismatch);
  } else {
    cache::report_match(check.report.who, compared);
  }
  return eager_out;
}

}  // namespace tcap::step
