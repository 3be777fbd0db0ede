// Replaying a compiled backward (Note [Compiled autograd]), and verify mode's replay
// beside the engine (Note [Verifying a compiled backward]).
#include <tcap/compiled_autograd.h>

#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "autograd/markers.h"
#include "autograd/walk.h"
#include "capture/armed.h"
#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "compiler/pipeline.h"
#include "ir/op_facts.h"
#include "passes/int_patches.h"
#include "aot/replay_node.h"
#include "cache/entry_cache.h"
#include "cache/unused_options.h"
#include "cache/verify.h"
#include "interp/hook_runner.h"
#include "support/logging.h"

#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include "autograd/ca_runtime.h"

namespace tcap::ca {

using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

interp::HookRunner Runtime::hook_runner(const BackwardEntry& e, ca::BackwardWalk& w, c10::impl::LocalDispatchKeySet outer) const {
  TORCH_CHECK(w.hooks.size() == e.num_hooks, "compiled autograd: the backward has ", w.hooks.size(),
              " hooks, its compiled graph ", e.num_hooks);
  return [&e, &w, outer](int slot, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& node_in) {
    // As the engine runs hooks: default dispatch; grad mode is off for the whole replay.
    c10::impl::ForceDispatchKeyGuard keys(outer);
    const auto k = static_cast<size_t>(slot);
    if (k >= e.num_hooks) {
      // Note [Leaves accumulated where the engine would]
      ca::accumulate(*w.nodes[w.accumulate.at(k - e.num_hooks)], at::Tensor(in.at(0)));
      return std::vector<at::Tensor>{};
    }
    return ca::call_hook(w.hooks.at(k), in, node_in);
  };
}

// Note [Verifying a compiled backward]
// A verified hit (verify mode) runs the engine on the backward, as eager runs it (it
// accumulates into .grad, runs the hooks, frees the graph), then the compiled graph on the
// walk's tensors (the unpacked saved tensors, which the engine's release leaves alive)
// without accumulating. Each gradient the compiled graph would have handed a leaf is
// compared with what the engine added to that leaf's .grad (its value before, plus the
// gradient, as AccumulateGrad adds them), and grad()'s results with the engine's. The
// engine's results are kept. Hooks run once, in the engine (Note [Hooks called once under
// verify], capture/hooks.h): the compiled graph's call_hook nodes take the engine's taped
// results, and the gradients each received are compared with the engine's. A graph that
// accumulates leaves inside itself (Note [Leaves accumulated where the engine would]) is
// not verified: it would accumulate twice.
variable_list Runtime::verified_replay(const Request& r, const BackwardEntry& e, ca::BackwardWalk& w, const VerifyOptions& v) {
  if (e.accumulates_in_graph) {
    TCAP_LOG(Verify, "compiled autograd entry " << e.id << " is not verified: it accumulates leaves inside its graph");
    return replay(r, e, w);
  }
  count(&CompileStats::replays);
  count(&CompileStats::verified);
  std::vector<at::Tensor> before(w.accumulate.size());
  for (size_t i = 0; i < w.accumulate.size() && r.accumulate_grad; ++i) {
    if (e.acc_output.at(i) < 0) continue;
    const auto* acc = static_cast<const torch::autograd::AccumulateGrad*>(w.nodes[w.accumulate[i]]);
    const at::Tensor& g = acc->variable.grad();
    if (g.defined()) before[i] = g.detach().clone();
  }
  capture::HookTape tape;
  variable_list eager;
  {
    capture::HookWrapScope::SlotOf slots;
    for (size_t k = 0; k < w.hooks.size() && k < e.num_hooks; ++k) slots.emplace(w.hooks[k].object, static_cast<int>(k));
    capture::HookTapeScope taped(w.graph, slots, &tape, capture::HookTapeScope::Mode::Record);
    eager = r.run();
  }
  cache::Tolerances tol = cache::Tolerances::for_options(opts());
  cache::VerifyReport rep;
  rep.who = "compiled autograd entry " + std::to_string(e.id);
  rep.likely = "state the backward graph's key does not cover changed since the entry was captured: a host value a "
               "hook or a custom autograd function's backward reads through its closure, or a tensor one of them "
               "reads from outside the saved tensors (docs/compiled-autograd.md, \"Verify mode\")";
  if (!tol.exact) rep.likely += "; or a rounding difference of backend '" + std::string(opts().backend.name()) + "' beyond its tolerance";
  std::vector<at::Tensor> outs;
  try {
    at::AutoGradMode grad_mode(false);
    interp::HookRunner real = hook_runner(e, w, c10::impl::tls_local_dispatch_key_set());
    interp::HookRunner runner = [&](int slot, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& node_in) {
      if (auto out = tape.play(slot, in)) return *out;
      return real(slot, in, node_in);
    };
    interp::HookRunnerScope scope(&runner);
    outs = e.exe(w.tensors);
  } catch (const HostValueChanged& err) {
    // Not this entry's backward; the engine's ran and is the answer (rethrown, the serving
    // loop would run the backward a second time).
    TCAP_LOG(Verify, rep.who << " was not compared: " << err.what_without_backtrace());
    return eager;
  } catch (const c10::Error& err) {
    rep.what = "the compiled backward";
    rep.how = std::string("raised where the engine did not: ") + err.what_without_backtrace();
    cache::report_mismatch(v, rep);  // throws unless log_only
    return eager;
  }
  size_t compared = 0;
  at::NoGradGuard no_grad;
  for (const auto& p : tape.played()) {
    for (size_t j = 0; j < p.in.size() && j < p.taped_in.size(); ++j, ++compared) {
      std::string how = cache::compare_tensors(p.in[j], p.taped_in[j], tol);
      if (how.empty()) continue;
      const auto& h = w.hooks.at(static_cast<size_t>(p.slot));
      rep.what = "gradient " + std::to_string(j) + " a hook of " + w.label(h.node) + " receives";
      rep.how = std::move(how);
      cache::report_mismatch(v, rep);
      return eager;
    }
  }
  for (size_t i = 0; i < w.accumulate.size() && r.accumulate_grad; ++i) {
    const int p = e.acc_output.at(i);
    if (p < 0) continue;
    const auto* acc = static_cast<const torch::autograd::AccumulateGrad*>(w.nodes[w.accumulate[i]]);
    const at::Tensor& g = outs.at(static_cast<size_t>(p));
    const at::Tensor expect = before[i].defined() && g.defined() ? before[i].add_(g) : g;
    std::string how = cache::compare_tensors(expect, acc->variable.grad(), tol);
    ++compared;
    if (how.empty()) continue;
    rep.what = "the gradient accumulated into the leaf of " + w.label(w.accumulate[i]);
    rep.how = std::move(how);
    cache::report_mismatch(v, rep);
    return eager;
  }
  for (size_t j = 0; j < e.grad_output.size() && j < eager.size(); ++j) {
    const int p = e.grad_output[j];
    std::string how = cache::compare_tensors(p < 0 ? at::Tensor() : outs.at(static_cast<size_t>(p)), eager[j], tol);
    ++compared;
    if (how.empty()) continue;
    rep.what = "grad() result " + std::to_string(j);
    rep.how = std::move(how);
    cache::report_mismatch(v, rep);
    return eager;
  }
  cache::report_match(rep.who, compared);
  return eager;
}

variable_list Runtime::replay(const Request& r, const BackwardEntry& e, ca::BackwardWalk& w) {
  count(&CompileStats::replays);
  interp::HookRunner runner = hook_runner(e, w, c10::impl::tls_local_dispatch_key_set());
  // Note [Saved tensors freed as the backward runs]: without retain_graph, the engine
  // frees each node's saved tensors once the node has run. The compiled backward gets the
  // same peak memory by releasing the graph's saved variables up front and moving the
  // only remaining references (the walk's unpacked copies) into the executable, which
  // drops each at its last use. grad(outputs) and backward(inputs=...) run, and release,
  // only the nodes above the outputs (ca::nodes_run_for); the others keep their saved
  // tensors for a later backward, as with the engine.
  const bool release = !r.keep_graph;
  if (release) {
    const bool whole = r.outputs == nullptr || r.outputs->empty();
    const std::vector<char> runs = whole ? std::vector<char>() : ca::nodes_run_for(w, *r.outputs, r.accumulate_grad);
    for (size_t i = 0; i < w.nodes.size(); ++i) {
      if (whole || runs[i]) {
        w.nodes[i]->release_variables();
        aot::release_replay_node(*w.nodes[i]);
      }
    }
  }
  // The engine runs a backward with grad mode = create_graph, which is off here (a
  // create_graph backward runs eagerly): the graph's ops record no autograd history, and
  // AccumulateGrad may steal a fresh gradient instead of cloning it (it only steals with
  // grad mode off).
  at::AutoGradMode grad_mode(false);
  std::vector<at::Tensor> outs;
  {
    interp::HookRunnerScope scope(&runner);
    outs = e.exe(release ? std::move(w.tensors) : w.tensors);
  }
  variable_list result;
  if (r.accumulate_grad) {
    for (size_t i = 0; i < e.acc_output.size(); ++i) {
      const int p = e.acc_output[i];
      if (p < 0) continue;
      ca::accumulate(*w.nodes[w.accumulate[i]], std::move(outs[static_cast<size_t>(p)]));
    }
  }
  for (int p : e.grad_output) result.push_back(p < 0 ? at::Tensor() : outs[static_cast<size_t>(p)]);
  return result;
}

}  // namespace tcap::ca
