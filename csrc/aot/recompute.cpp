// Recomputing a region's forward (replay_function.h, saved_capsule.h): gradients by
// recomputation, the checks that a recompute reads what the forward read, and the RNG
// states a recompute or a verified call replays.
#include "aot/saved_capsule.h"

#include "cache/verify.h"

#include <tcap/interpreter.h>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <mutex>
#include <optional>

namespace tcap::aot {

using torch::autograd::variable_list;

RngStates RngStates::save(const std::vector<c10::Device>& devices) {
  RngStates r;
  for (const auto& d : devices) {
    at::Generator g = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    r.states_.emplace_back(g, g.get_state());
  }
  return r;
}

void RngStates::restore() const {
  for (const auto& [g, s] : states_) {
    at::Generator gen = g;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s);
  }
}

std::vector<c10::Device> devices_of(const ir::Graph& g) {
  std::vector<c10::Device> ds;
  for (const auto& v : g.values()) {
    if (std::find(ds.begin(), ds.end(), v.meta.device) == ds.end()) ds.push_back(v.meta.device);
  }
  if (ds.empty()) ds.push_back(c10::kCPU);
  return ds;
}

variable_list recompute_gradients(const ir::Graph& forward, const std::vector<size_t>& written,
                                  const std::vector<at::Tensor>& primals, const variable_list& grads, size_t num_outputs,
                                  bool create_graph, std::vector<at::Tensor>* outputs) {
  at::AutoGradMode grad_on(true);
  std::vector<at::Tensor> args;
  std::vector<at::Tensor> diff_args;
  std::vector<size_t> diff_index;
  for (size_t j = 0; j < primals.size(); ++j) {
    at::Tensor t = primals[j];
    if (std::find(written.begin(), written.end(), j) != written.end()) t = t.detach().clone();
    if (t.requires_grad()) {
      at::Tensor a = create_graph ? t.view_as(t) : t.detach().requires_grad_(true);
      diff_args.push_back(a);
      diff_index.push_back(j);
      args.push_back(a);
    } else {
      args.push_back(t);
    }
  }
  Interpreter interp(forward, /*differentiable=*/true);
  interp.keep_values(false);
  auto outs = interp.run(args);
  if (outputs) *outputs = outs;
  std::vector<at::Tensor> os, gs;
  for (size_t k = 0; k < num_outputs && k < grads.size(); ++k) {
    if (grads[k].defined() && outs[k].requires_grad()) {
      os.push_back(outs[k]);
      gs.push_back(grads[k]);
    }
  }
  variable_list result(primals.size());
  if (os.empty() || diff_args.empty()) return result;
  auto gi = torch::autograd::grad(os, diff_args, gs, /*retain_graph=*/create_graph, create_graph,
                                  /*allow_unused=*/true);
  for (size_t k = 0; k < diff_index.size(); ++k) result[diff_index[k]] = gi[k];
  return result;
}

// Note [What a recompute reads]
// A backward that recomputes its forward (a double backward, a gradient the capture never
// saw, tangents that alias otherwise) must compute from what the forward saw, as eager's
// backward computes from its saved values. Two things can differ by then:
//   * a primal the forward wrote in place (a BatchNorm's running statistics, an input
//     edited by the function): the recompute starts from a copy made before the forward
//     wrote it, not from the written tensor, so it writes the same values again into a
//     copy and computes what the forward computed;
//   * a primal the program changed in place after the forward: its version counter moved.
//     The recompute would read the new values where eager's backward reads the values its
//     forward saved, so it stops with eager's error for a saved tensor modified in place,
//     naming the input. (Eager raises the same wherever its backward saved that tensor;
//     where it did not, tcap refuses a backward eager would run: never a wrong gradient.)
// A write through .data() moves no version counter and cannot be seen here; an entry whose
// backward is planned to recompute (no compiled backward) therefore runs its forward
// through autograd instead (Note [Entries without a compiled backward]), and the min-cut
// partition never recomputes from a primal (Note [Recomputing from primals]), so that only
// the rare recomputes above read primals after the forward.
void check_recompute_reads(const RegionEntry& e, const SavedCapsule& capsule, const std::vector<at::Tensor>& primals,
                           const std::string& why) {
  for (size_t j = 0; j < primals.size() && j < capsule.primal_versions.size(); ++j) {
    if (!primals[j].defined()) continue;
    if (std::find(e.recompute_clones.begin(), e.recompute_clones.end(), j) != e.recompute_clones.end()) continue;
    const uint32_t now = primals[j]._version();
    if (now == capsule.primal_versions[j]) continue;
    const std::string name = j < e.guards.tensors.size() ? "'" + e.guards.tensors[j].name + "'"
                                                         : "held tensor " + std::to_string(j - e.guards.tensors.size());
    TORCH_CHECK(false,
                "one of the variables needed for gradient computation has been modified by an inplace operation: [",
                primals[j].toString(), " ", primals[j].sizes(), "] is at version ", now, "; expected version ",
                capsule.primal_versions[j], " instead. (tcap: the backward of the compiled function '", e.fn_name,
                "' recomputes its forward (", why, ") and the forward reads ", name,
                ", changed in place since the forward ran.)");
  }
}

variable_list recompute_backward(const RegionEntry& e, std::vector<at::Tensor> primals, const SavedCapsule& capsule,
                                 const variable_list& grads, const RngStates* rng, bool create_graph,
                                 std::vector<at::Tensor>* outputs) {
  for (size_t k = 0; k < e.recompute_clones.size() && k < capsule.before_writes.size(); ++k) {
    if (capsule.before_writes[k].defined()) primals[e.recompute_clones[k]] = capsule.before_writes[k];
  }
  std::optional<RngStates> current;
  if (rng) {
    current = RngStates::save(devices_of(e.part.forward));
    rng->restore();
  }
  struct Restore {
    std::optional<RngStates>& s;
    ~Restore() {
      if (s) s->restore();
    }
  } restore{current};
  variable_list result =
      recompute_gradients(e.part.forward, e.recompute_clones, primals, grads, e.part.num_user_outputs, create_graph, outputs);
  return result;
}

// Note [A recompute that does not reproduce the forward]
// What check_recompute_reads cannot see, a write through .data() or set_data() (moving no
// version counter; LibTorch's optimizers write so), shows in what the recompute computes:
// the forward's values it saved for the compiled backward are recomputed too, and they
// differ. Eager's backward would compute from its own saved values (those of the forward,
// and the new values of the tensors it saved by reference), which tcap cannot reproduce
// from primals alone, so such a backward stops with an error instead of returning
// gradients of other values. Compared with the tolerance of fused kernels (Note [Verify
// tolerances]: the compiled forward may round otherwise than ATen); a change within it
// changes the gradients within it too. Not seen: a change that reaches no saved value (the
// forward saves what its compiled backward needs, and min-cut saves every value computed
// from a primal that the backward needs, Note [Recomputing from primals]).
void check_recompute_reproduces(const RegionEntry& e, const SavedCapsule& capsule, const std::vector<at::Tensor>& outs,
                                const std::vector<at::Tensor>& from_context, const std::string& why) {
  cache::Tolerances tol;
  tol.exact = false;
  at::NoGradGuard no_grad;
  const size_t n = e.part.num_user_outputs;
  size_t next_context = 0;
  for (size_t k = 0; k < capsule.saved.size() && n + k < outs.size(); ++k) {
    at::Tensor forward_value = capsule.saved[k];
    const bool in_context = std::find(capsule.in_context.begin(), capsule.in_context.end(), k) != capsule.in_context.end();
    if (in_context) forward_value = next_context < from_context.size() ? from_context[next_context++] : at::Tensor();
    const at::Tensor& now = outs[n + k];
    if (!forward_value.defined() || !now.defined() || now.sizes() != forward_value.sizes()) continue;
    std::string how = cache::compare_tensors(now.detach(), forward_value.detach(), tol);
    TORCH_CHECK(how.empty(), "tcap: the backward of the compiled function '", e.fn_name, "' (entry ", e.id,
                ") recomputes its forward (", why, "), and saved value ", k, " of the forward comes out otherwise (",
                how, "): a tensor the forward reads was changed since the forward without moving its version "
                "counter (a write through .data() or set_data(), as LibTorch's optimizers write). Eager's backward "
                "would read the values its forward saved, which tcap does not keep; run the backward before the "
                "change, or this function eagerly for it (tcap::StanceGuard(tcap::Stance::ForceEager)).");
  }
}

}  // namespace tcap::aot
