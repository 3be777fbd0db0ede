// See Note [Verifying a compiled region] (replay_function.cpp).
#include "aot/verify_region.h"

#include "aot/replay_function.h"
#include "cache/verify.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace tcap::aot {

std::string likely_cause(const RegionEntry& e, const CompileOptions& o) {
  std::string s = "something the function reads that no guard covers changed since entry " + std::to_string(e.id) +
                  " was captured: a host value it reads through its closure (a captured variable, a global, a member "
                  "of a module that is not a registered parameter, buffer or LibTorch option)";
  const auto held = e.guards.held.describe();
  if (!held.empty()) {
    s += ", or a tensor it reads from outside its inputs (";
    for (size_t k = 0; k < e.guards.held.size(); ++k) s += (k ? ", '" : "'") + e.guards.held.name(k) + "'";
    s += ") replaced by another while the old one is still alive";
  } else {
    s += ", or a tensor it reads through its closure";
  }
  if (!e.observed_reads.empty()) s += ", or a value read on the host that observe_host_values made an observation";
  if (e.guards.dyn.dynamic()) {
    s += o.check_new_sizes ? ", or a branch on a size in host code the check capture of these sizes did not run (a "
                             "hook of the backward)"
                           : ", or a branch on a size in host code: the entry is dynamic and check_new_sizes = false "
                             "promised that no host code branches on its dynamic sizes (Note [Checking a new size])";
    if (o.check_new_sizes && !o.dynamic_dims.empty()) {
      s += ", or a branch on a size that CompileOptions::dynamic_dims promised does not exist (sizes within its "
           "bounds are served without a check capture)";
    }
  }
  if (!cache::Tolerances::for_options(o).exact) {
    s += "; or a rounding difference of backend '" + std::string(o.backend.name()) + "' beyond its tolerance (Note [Verify tolerances])";
  }
  return s + " (docs/compile.md, \"What a replay re-reads and what it freezes\")";
}

std::vector<at::Tensor> verified_call(const std::shared_ptr<const RegionEntry>& served, const RegionEntry& guarded,
                                      const std::vector<at::Tensor>& primals, size_t num_inputs,
                                      const EagerRun& run_eager, const CompileOptions& options, const VerifyOptions& v) {
  const RngStates rng = RngStates::save(devices_of(served->part.forward));
  // What the forward writes, as it was: in place, or without its schema saying so (batch
  // norm's running statistics; Note [Writes a schema does not show]).
  std::vector<at::Tensor> before;
  for (size_t j : served->recompute_clones) before.push_back(primals.at(j).detach().clone());
  // Puts them back (without moving the version counters a saved tensor is checked
  // against) and the random numbers, so that a run starts from the state the call found.
  auto restore = [&] {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < served->recompute_clones.size(); ++k) {
      primals.at(served->recompute_clones[k]).variable_data().copy_(before[k]);
    }
    rng.restore();
  };

  auto check = std::make_shared<RegionVerify>();
  check->primals = primals;
  const auto inputs = served->joint.graph.input_nodes();
  for (size_t j = 0; j < primals.size(); ++j) {
    check->names.push_back(j < inputs.size() ? served->joint.graph.node(inputs[j]).name : "primal " + std::to_string(j));
  }
  check->tolerances = cache::Tolerances::for_options(options);
  check->options = v;
  check->report.who = "'" + options.name + "' entry " + std::to_string(guarded.id);
  check->report.likely = likely_cause(guarded, options);

  std::vector<at::Tensor> compiled = replay_region(served, primals, check);
  // The compiled forward's writes, kept; then undone so that eager runs on the same state.
  std::vector<at::Tensor> written;
  for (size_t j : served->recompute_clones) written.push_back(primals.at(j).detach().clone());
  restore();
  std::vector<at::Tensor> eager;
  {
    StanceGuard eager_only(Stance::ForceEager);
    eager = run_eager(nullptr);
  }
  check->eager_outputs = eager;
  // Note [Verifying chained calls]: an input with autograd history (f(f(x)): the outer
  // call's input is the inner call's output) would make eager's gradients with respect to
  // the primals differentiate through that history too (a parameter's gradient would
  // include the inner call's share, and the inner call's node would run inside this
  // check). The node's gradients are its own share only, so they are compared with those
  // of an eager run on the same inputs made leaves: the function's code once more, on the
  // buffers and random numbers the first eager run saw (so the state after it is the
  // first run's). The first run's outputs, attached to the real inputs, are what a
  // difference in the forward returns.
  const bool chained = at::GradMode::is_enabled() &&
                       std::any_of(primals.begin(), primals.begin() + static_cast<std::ptrdiff_t>(num_inputs),
                                   [](const at::Tensor& t) { return t.defined() && t.requires_grad() && !t.is_leaf(); });
  if (chained) {
    std::vector<at::Tensor> leaves(primals.begin(), primals.begin() + static_cast<std::ptrdiff_t>(num_inputs));
    std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> made;  // one leaf per tensor passed twice
    for (auto& t : leaves) {
      if (!t.defined() || !t.requires_grad() || t.is_leaf()) continue;
      auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == t.unsafeGetTensorImpl(); });
      if (it == made.end()) it = made.insert(made.end(), {t.unsafeGetTensorImpl(), t.detach().requires_grad_(true)});
      t = it->second;
    }
    restore();
    {
      StanceGuard eager_only(Stance::ForceEager);
      check->eager_outputs = run_eager(&leaves);
    }
    for (size_t j = 0; j < leaves.size(); ++j) check->primals[j] = leaves[j];
  }

  size_t compared = 0;
  auto differ = [&](const std::string& what, const std::string& how) {
    cache::VerifyReport r = check->report;
    r.what = what;
    r.how = how;
    cache::report_mismatch(v, r);  // throws unless log_only
    return true;
  };
  bool mismatch = false;
  if (compiled.size() != eager.size()) {
    mismatch = differ("the outputs", std::to_string(compiled.size()) + " tensors where eager returned " +
                                         std::to_string(eager.size()));
  }
  for (size_t k = 0; k < compiled.size() && k < eager.size() && !mismatch; ++k, ++compared) {
    std::string how = cache::compare_tensors(compiled[k], eager[k], check->tolerances);
    if (!how.empty()) mismatch = differ("output " + std::to_string(k), how);
  }
  for (size_t k = 0; k < written.size() && !mismatch; ++k, ++compared) {
    const size_t j = served->recompute_clones[k];
    std::string how = cache::compare_tensors(written[k], primals.at(j), check->tolerances);
    if (!how.empty()) mismatch = differ("'" + check->names[j] + "' (written by the function)", how);
  }
  served->stats->count(&CompileStats::verified);
  if (mismatch) return eager;  // log_only: eager's results, eager's state (it ran last)
  cache::report_match(check->report.who, compared);
  return compiled;
}

}  // namespace tcap::aot
