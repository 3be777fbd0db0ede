// Note [Verifying a compiled step]
// A verified call of a compiled step (verify mode) snapshots what the step can change: the
// values of every tensor it reads (parameters, buffers, .grads, optimizer state, the
// tensors it reads from outside), which tensor each leaf's .grad is, the optimizers' state
// objects (step counters) and the random number generators. It replays the compiled step
// and keeps what it produced, puts everything back (values copied in without moving version
// counters, .grads and state objects reassigned), runs the step's own code eagerly and
// compares: the outputs, every snapshotted tensor's value, each leaf's .grad (defined or
// not, kept or replaced, its value) and the step counters. Eager's results and state are
// kept, so a verified program computes what eager computes. What the step's code does on
// the host besides (a log line, a counter) runs once, in the eager run; parameter hooks
// run twice.
//
// With a fused backend or fused optimizer updates, gradients differ from eager's by
// rounding, and an optimizer like Adam turns a gradient that is zero in exact arithmetic
// (a bias followed by batch norm: rounding noise of either sign) into a full step of
// either sign. So where the two runs' gradients of a parameter differ by more than 1%
// relatively, that parameter's elements, and its optimizer state's, are left out of the
// comparison (Note [Verify tolerances]); the gradients themselves are compared as usual.
#include "step/verify_step.h"

#include "aot/replay_function.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <map>

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
  // Snapshot.
  std::vector<at::Tensor> before;
  for (const auto& t : check.primals) before.push_back(t.defined() ? t.detach().clone() : at::Tensor());
  std::vector<at::Tensor> grad_before;
  for (size_t j = 0; j < g.num_leaves(); ++j) grad_before.push_back(g.leaf(j).grad());
  std::vector<OptimizerAdapter::StateCopy> state_before;
  for (const auto* o : check.opts) state_before.push_back(o->copy_state());
  std::vector<c10::Device> devices{c10::kCPU};
  for (const auto& t : check.primals) {
    if (t.defined() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) devices.push_back(t.device());
  }
  const aot::RngStates rng = aot::RngStates::save(devices);

  // The compiled step, and what it produced.
  std::vector<at::Tensor> compiled_out;
  {
    at::AutoGradMode as_called(true);
    compiled_out = check.replay();
  }
  std::vector<at::Tensor> after;
  for (const auto& t : check.primals) after.push_back(t.defined() ? t.detach().clone() : at::Tensor());
  std::vector<at::Tensor> grad_after;
  std::vector<at::Tensor> grad_after_values;
  for (size_t j = 0; j < g.num_leaves(); ++j) {
    grad_after.push_back(g.leaf(j).grad());
    grad_after_values.push_back(grad_after.back().defined() ? grad_after.back().detach().clone() : at::Tensor());
  }
  std::vector<std::map<void*, int64_t>> steps_after(check.opts.size());
  for (size_t o = 0; o < check.opts.size(); ++o) {
    const auto ps = check.opts[o]->params();
    for (size_t j = 0; j < ps.size(); ++j) steps_after[o][ps[j].unsafeGetTensorImpl()] = check.opts[o]->host_state(j).step;
  }

  // Everything back as it was.
  for (size_t k = 0; k < check.primals.size(); ++k) {
    // An input whose elements share memory (an expand()ed, stride-0 tensor) cannot have
    // been written in place (eager refuses that write too), and copy_ into it is refused.
    if (check.primals[k].defined() && at::has_internal_overlap(check.primals[k]) != at::MemOverlap::Yes) {
      check.primals[k].variable_data().copy_(before[k]);
    }
  }
  for (size_t j = 0; j < g.num_leaves(); ++j) {
    at::Tensor leaf = g.leaf(j);
    leaf.mutable_grad() = grad_before[j];
  }
  for (size_t o = 0; o < check.opts.size(); ++o) check.opts[o]->restore_state(state_before[o]);
  rng.restore();

  // Eager.
  std::vector<at::Tensor> eager_out;
  {
    at::AutoGradMode as_called(true);
    StanceGuard eager_only(Stance::ForceEager);
    eager_out = check.eager();
  }

  // Compare.
  size_t compared = 0;
  auto differ = [&](const std::string& what, const std::string& how) {
    cache::VerifyReport r = check.report;
    r.what = what;
    r.how = how;
    cache::report_mismatch(check.options, r);  // throws unless log_only
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
    std::vector<at::Tensor> skip(check.primals.size());  // per primal: elements not compared
    for (size_t j = 0; j < g.num_leaves(); ++j, ++compared) {
      const at::Tensor& now = g.leaf(j).grad();
      const std::string name = "the .grad of '" + g.leaf_name(j) + "'";
      const bool kept_c = grad_after[j].defined() && grad_after[j].is_same(grad_before[j]);
      const bool kept_e = now.defined() && now.is_same(grad_before[j]);
      if (grad_after[j].defined() != now.defined()) {
        return differ(name, now.defined() ? "no tensor where eager's step set one" : "a tensor where eager's step left none");
      }
      if (kept_c != kept_e) {
        return differ(name, kept_e ? "a new tensor where eager's step kept (and accumulated into) the one it had"
                                   : "the tensor it had where eager's step set a new one");
      }
      std::string how = cache::compare_tensors(grad_after_values[j], now, check.tolerances);
      if (!how.empty()) return differ(name, how);
      if (j < g.params.size() && !check.tolerances.exact) {
        skip[static_cast<size_t>(g.param_input[j])] = unsettled(grad_after_values[j], now);
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
      std::string how = compare_settled(after[k], check.primals[k], mask, check.tolerances);
      if (!how.empty()) return differ("'" + check.names.at(k) + "'", how);
    }
    for (size_t o = 0; o < check.opts.size(); ++o) {
      const auto ps = check.opts[o]->params();
      for (size_t j = 0; j < ps.size(); ++j) {
        const int64_t c = steps_after[o][ps[j].unsafeGetTensorImpl()], e = check.opts[o]->host_state(j).step;
        if (c != e) {
          return differ("the step counter of optimizer " + std::to_string(o) + "'s parameter " + std::to_string(j),
                        std::to_string(c - 1) + " where eager's is " + std::to_string(e - 1));
        }
      }
    }
    return true;
  };
  if (run()) cache::report_match(check.report.who, compared);
  return eager_out;
}

}  // namespace tcap::step
