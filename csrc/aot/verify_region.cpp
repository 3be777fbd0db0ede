// Verify mode for tcap::compile functions (Note [Verifying a compiled region], below).
#include "aot/verify_region.h"

#include "aot/replay_function.h"
#include "cache/verify.h"
#include "capture/hooks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

namespace tcap::aot {

using torch::autograd::variable_list;

// Note [Verifying a compiled region]
// A verified call (verify mode, include/tcap/stance.h) of a tcap::compile function runs the
// compiled forward, then the function's own code eagerly on the same inputs, with the same
// random numbers and the buffers the forward writes as they were before it, and compares
// the outputs and the written buffers (aot/verify_region.cpp). Its outputs are the compiled
// ones, whose node keeps eager's outputs: when the user's backward reaches it, it runs the
// compiled backward, then eager's (torch::autograd::grad of eager's outputs with respect
// to the same primals and with the same incoming gradients), compares each primal's
// gradient, and hands eager's on. A create_graph backward (a double backward's first) is
// compared too: the compiled side's recompute (Note [What a recompute reads]) against
// eager's gradients with their graph, which are handed on, so the second differentiation
// is eager's (a later backward that reaches this node again runs it unverified).
variable_list verified_gradients(RegionVerify& v, const variable_list& incoming, variable_list compiled) {
  std::vector<at::Tensor> outs, grads, inputs;
  std::vector<size_t> which;
  for (size_t k = 0; k < v.eager_outputs.size() && k < incoming.size(); ++k) {
    if (!incoming[k].defined() || !v.eager_outputs[k].requires_grad()) continue;
    outs.push_back(v.eager_outputs[k]);
    grads.push_back(incoming[k]);
  }
  for (size_t j = 0; j < v.primals.size(); ++j) {
    if (!v.primals[j].requires_grad()) continue;
    inputs.push_back(v.primals[j]);
    which.push_back(j);
  }
  variable_list eager(compiled.size());
  if (!outs.empty() && !inputs.empty()) {
    // The primals' own hooks run once, when eager's gradients are handed on to them
    // (Note [Hooks called once under verify], capture/hooks.h); here they are passed over.
    std::vector<capture::HookTapeScope::LeafHook> leaf_hooks;
    std::vector<std::unique_ptr<capture::HookTapeScope>> passed_over;
    for (const auto& t : inputs) {
      if (t.is_leaf()) {
        for (size_t i = 0; i < capture::leaf_tensor_hooks(t).size(); ++i) leaf_hooks.push_back({t, i, 0});
      } else if (const auto fn = t.grad_fn()) {
        capture::HookWrapScope::SlotOf slots;
        for (const auto& h : fn->tensor_pre_hooks()) slots.emplace(h.get(), 0);
        for (const auto& [i, h] : fn->retains_grad_hooks()) slots.emplace(h.get(), 0);
        if (!slots.empty()) {
          passed_over.push_back(std::make_unique<capture::HookTapeScope>(fn, slots, nullptr, capture::HookTapeScope::Mode::PassOver));
        }
      }
    }
    capture::HookTapeScope leaves_passed_over(std::move(leaf_hooks), nullptr, capture::HookTapeScope::Mode::PassOver);
    // A double backward (create_graph): eager's gradients keep their graph, so the second
    // differentiation runs through eager's.
    const auto g = torch::autograd::grad(outs, inputs, grads, torch::autograd::get_current_graph_task_keep_graph(),
                                         /*create_graph=*/at::GradMode::is_enabled(), /*allow_unused=*/true);
    for (size_t i = 0; i < which.size(); ++i) {
      if (which[i] < eager.size()) eager[which[i]] = g[i];
    }
  }
  // One tensor passed at several positions: autograd::grad gives each position the whole
  // gradient of that tensor, the compiled backward splits it among them. Compare the sum
  // of the compiled positions with eager's whole gradient, and hand eager's on once (at
  // the first position), or the tensor would receive it once per position.
  for (size_t j = 0; j < compiled.size() && j < eager.size(); ++j) {
    if (!v.primals[j].defined()) continue;
    for (size_t k = j + 1; k < compiled.size() && k < eager.size(); ++k) {
      if (!v.primals[k].is_same(v.primals[j])) continue;
      if (compiled[k].defined()) compiled[j] = compiled[j].defined() ? compiled[j] + compiled[k] : compiled[k];
      compiled[k] = at::Tensor();
      eager[k] = at::Tensor();
    }
  }
  for (size_t j = 0; j < compiled.size() && j < eager.size(); ++j) {
    at::NoGradGuard no_grad;
    // A primal that gets no gradient from eager's graph gets none (or zeros) from the
    // compiled one: both mean nothing reached it.
    const at::Tensor c = compiled[j].defined() || !eager[j].defined() ? compiled[j] : at::zeros_like(eager[j]);
    const at::Tensor e = eager[j].defined() || !c.defined() ? eager[j] : at::zeros_like(c);
    std::string how = cache::compare_tensors(c.defined() ? c.detach() : c, e.defined() ? e.detach() : e, v.tolerances);
    if (how.empty()) continue;
    cache::VerifyReport r = v.report;
    r.what = "the gradient of " + (j < v.names.size() ? "'" + v.names[j] + "'" : "primal " + std::to_string(j));
    r.how = std::move(how);
    cache::report_mismatch(v.options, r);
  }
  cache::report_match(v.report.who + "'s backward", compiled.size());
  return eager;
}

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
  // Their geometry too: an out= op resizes an `out` of another shape (ATen's
  // resize_output), so a run may leave a written input with other sizes.
  std::vector<at::Tensor> before;
  struct Geometry {
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
  };
  std::vector<Geometry> geometry;
  for (size_t j : served->recompute_clones) {
    const at::Tensor& t = primals.at(j);
    before.push_back(t.detach().clone());
    geometry.push_back({t.sizes().vec(), t.strides().vec(), t.storage_offset()});
  }
  // Puts them back (without moving the version counters a saved tensor is checked
  // against) and the random numbers, so that a run starts from the state the call found.
  auto restore = [&] {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < served->recompute_clones.size(); ++k) {
      const at::Tensor& p = primals.at(served->recompute_clones[k]);
      const Geometry& was = geometry[k];
      if (p.sizes() != was.sizes || p.strides() != was.strides || p.storage_offset() != was.offset) {
        p.unsafeGetTensorImpl()->set_sizes_and_strides(was.sizes, was.strides, was.offset);
      }
      p.variable_data().copy_(before[k]);
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
