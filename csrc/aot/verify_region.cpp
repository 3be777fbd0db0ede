// See Note [Verifying a compiled region] (replay_function.cpp).
#include "aot/verify_region.h"

#include "aot/replay_function.h"
#include "cache/verify.h"

#include <ATen/ATen.h>

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
  }
  if (!cache::Tolerances::for_options(o).exact) {
    s += "; or a rounding difference of backend '" + std::string(o.backend.name()) + "' beyond its tolerance (Note [Verify tolerances])";
  }
  return s + " (docs/compile.md, \"What a replay re-reads and what it freezes\")";
}

std::vector<at::Tensor> verified_call(const std::shared_ptr<const RegionEntry>& served, const RegionEntry& guarded,
                                      const std::vector<at::Tensor>& primals,
                                      const std::function<std::vector<at::Tensor>()>& run_eager,
                                      const CompileOptions& options, const VerifyOptions& v) {
  const RngStates rng = RngStates::save(devices_of(served->part.forward));
  // What the forward writes, as it was: in place, or without its schema saying so (batch
  // norm's running statistics; Note [Writes a schema does not show]).
  std::vector<at::Tensor> before;
  for (size_t j : served->recompute_clones) before.push_back(primals.at(j).detach().clone());

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
  // The compiled forward's writes, kept; then undone (without moving the version counters
  // a saved tensor is checked against) so that eager runs on the same state.
  std::vector<at::Tensor> written;
  for (size_t k = 0; k < served->recompute_clones.size(); ++k) {
    const at::Tensor& t = primals.at(served->recompute_clones[k]);
    written.push_back(t.detach().clone());
    at::NoGradGuard no_grad;
    t.variable_data().copy_(before[k]);
  }
  rng.restore();
  std::vector<at::Tensor> eager;
  {
    StanceGuard eager_only(Stance::ForceEager);
    eager = run_eager();
  }
  check->eager_outputs = eager;

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
