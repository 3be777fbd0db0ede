// Note [Replaying a compiled region]
// A hit calls ReplayFunction::apply(TensorList primals, entry). Its forward runs the
// compiled forward graph (below autograd) and saves what the partition chose; its
// backward runs the compiled backward graph and returns one gradient per primal. The
// engine then routes those gradients to the real AccumulateGrad nodes, so .grad,
// leaf hooks and optimizers behave as in eager. Two cases recompute instead: a double
// backward (create_graph=true: the compiled backward makes no graph) and a gradient
// arriving for an output whose gradient the capture never saw. Both re-run the recorded
// forward through autograd from the primals (RNG state restored, mutated buffers cloned)
// and differentiate it with torch::autograd::grad, which is exact and differentiable.
#include "aot/replay_function.h"

#include "aot/region.h"
#include "aot/replay_node.h"
#include "aot/saved_capsule.h"
#include "aot/verify_region.h"
#include "capture/engine_shim.h"
#include "capture/hooks.h"
#include "support/logging.h"

#include <tcap/interpreter.h>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/custom_class.h>

#include <algorithm>
#include <mutex>
#include <optional>

namespace tcap::aot {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Entry = RegionEntry;

struct EntryHolder : torch::CustomClassHolder {
  explicit EntryHolder(std::shared_ptr<const Entry> e) : entry(std::move(e)) {}
  std::shared_ptr<const Entry> entry;
};

struct RngCapsule : torch::CustomClassHolder {
  RngStates rng;
};

c10::intrusive_ptr<SavedCapsule> saved_capsule(const AutogradContext& ctx) {
  return c10::static_intrusive_pointer_cast<SavedCapsule>(ctx.saved_data.at("saved").toCapsule());
}

// Runs the compiled forward of `e` on `ins` (grad mode off) and splits what it returns:
// the user outputs (returned), the saved values into a new capsule (Note [Saved tensors
// of a compiled region]), and the saved values that are also outputs into `in_context`,
// to be kept as SavedVariables by the node. The capsule keeps `ins` as the primals.
variable_list run_forward(const Entry& e, std::vector<at::Tensor> ins, c10::intrusive_ptr<SavedCapsule>* capsule_out,
                          variable_list* in_context) {
  std::vector<at::Tensor> before_writes;  // Note [What a recompute reads]
  before_writes.reserve(e.recompute_clones.size());
  for (size_t j : e.recompute_clones) {
    before_writes.push_back(ins[j].defined() ? ins[j].detach().clone() : at::Tensor());
  }
  std::vector<at::Tensor> outs;
  {
    at::AutoGradMode grad_off(false);
    outs = e.fw(ins);
  }
  for (size_t j : e.mutated_primals) torch::autograd::impl::bump_version(ins[j]);
  const size_t n = e.part.num_user_outputs;
  TORCH_CHECK(outs.size() == n + e.part.saved.size(), "tcap: the compiled forward of '", e.fn_name, "' returned ",
              outs.size(), " tensors, expected ", n + e.part.saved.size());
  variable_list user(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(n));
  auto capsule = c10::make_intrusive<SavedCapsule>();
  capsule->saved.assign(std::make_move_iterator(outs.begin() + static_cast<std::ptrdiff_t>(n)),
                        std::make_move_iterator(outs.end()));
  capsule->versions.resize(capsule->saved.size());
  for (size_t k = 0; k < capsule->saved.size(); ++k) {
    at::Tensor& t = capsule->saved[k];
    if (!t.defined()) continue;
    const bool is_output = std::any_of(user.begin(), user.end(), [&](const at::Tensor& u) {
      return u.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
    });
    if (is_output) {
      capsule->in_context.push_back(k);
      in_context->push_back(std::move(t));
      t = at::Tensor();
    } else {
      capsule->versions[k] = t._version();
    }
  }
  capsule->primal_versions.resize(ins.size());
  for (size_t j = 0; j < ins.size(); ++j) capsule->primal_versions[j] = ins[j].defined() ? ins[j]._version() : 0;
  capsule->before_writes = std::move(before_writes);
  capsule->primals = std::move(ins);
  if (e.guards.held.size() > 0) {
    std::vector<at::Tensor> held_refs = capsule->primals;
    held_refs.insert(held_refs.end(), capsule->saved.begin(), capsule->saved.end());
    capsule->own_refs = cache::OwnRefsLease(e.guards.held, held_refs);
  }
  *capsule_out = std::move(capsule);
  return user;
}

// The backward of a region (both node kinds): the compiled backward on the saved values
// and the incoming gradients, or the recompute when it cannot serve (double backward, a
// gradient the capture never saw). One gradient per primal. `grads` is the engine's own
// list: each gradient is moved into the executable, which frees it at its last use.
// `from_context`: the in-context saved values, unpacked (called only when needed).
template <class Grads, class FromContext>
variable_list region_backward(const Entry& e, SavedCapsule& capsule, const RngStates* rng, Grads&& grads,
                              FromContext&& from_context) {
  const bool create_graph = at::GradMode::is_enabled();
  std::string why;
  if (create_graph) why = "create_graph=true (double backward)";
  else if (!e.has_backward) why = "no compiled backward (the capture saw no backward)";
  for (size_t k = 0; k < grads.size() && why.empty(); ++k) {
    if (grads[k].defined() && !e.tangent_present[k]) {
      why = "a gradient arrived for output " + std::to_string(k) + ", which had none when captured";
    }
  }
  for (const auto& [a, b] : e.aliased_tangents) {  // Note [Tangents that alias]
    if (!why.empty()) break;
    const auto& ga = grads.at(static_cast<size_t>(a));
    const auto& gb = grads.at(static_cast<size_t>(b));
    if (!ga.defined() || !gb.defined() || !tangents_alias(ga, gb)) {
      why = "the gradients of outputs " + std::to_string(a) + " and " + std::to_string(b) +
            " were one tensor when captured and are not now";
    }
  }
  if (!why.empty()) {
    // Note [Autograd Functions in a region] (region_entry.cpp).
    TORCH_CHECK(e.autograd_function.empty(), "tcap: '", e.fn_name, "' entry ", e.id, "'s backward cannot run: ", why,
                " needs a recompute of the forward, which calls an autograd Function (", e.autograd_function,
                " ran inside it) whose derivative a recompute cannot reproduce; run this call eagerly "
                "(tcap::StanceGuard with Stance::ForceEager) or call backward() without create_graph");
    cache::report_fallback("'" + e.fn_name + "' entry " + std::to_string(e.id) + "'s backward",
                           "it recomputes eagerly: " + why);
    e.stats->count(&CompileStats::backward_fallbacks);
    TORCH_CHECK(!capsule.released, torch::autograd::ERR_BACKWARD_TWICE);
    check_recompute_reads(e, capsule, capsule.primals, why);
    std::vector<at::Tensor> outs;
    variable_list result = recompute_backward(e, capsule.primals, capsule, grads, rng, create_graph, &outs);
    check_recompute_reproduces(e, capsule, outs, capsule.in_context.empty() ? std::vector<at::Tensor>() : from_context(), why);
    if (!torch::autograd::get_current_graph_task_keep_graph()) capsule.release();
    return result;
  }
  // Without retain_graph the executable gets the only references to the saved values
  // that are not outputs, and frees each at its last use.
  std::vector<at::Tensor> ins =
      capsule.unpack(capsule.in_context.empty() ? std::vector<at::Tensor>() : from_context(), e.fn_name,
                     /*take=*/!torch::autograd::get_current_graph_task_keep_graph());
  ins.reserve(ins.size() + e.part.tangent_of.size());
  for (int k : e.part.tangent_of) {
    auto& g = grads.at(static_cast<size_t>(k));
    if (g.defined()) {
      ins.push_back(std::move(g));
    } else {
      // An output that got no gradient this time: a zero tangent (it had one at capture).
      const auto& m = e.joint.graph.value(e.joint.graph.output_values().at(static_cast<size_t>(k))).meta;
      ins.push_back(at::zeros(c10::IntArrayRef(m.sizes), at::TensorOptions().dtype(m.dtype).device(m.device)));
    }
  }
  auto outs = e.bw(std::move(ins));
  TORCH_CHECK(outs.size() == e.part.grad_of.size(), "tcap: the compiled backward of '", e.fn_name, "' returned ",
              outs.size(), " gradients, expected ", e.part.grad_of.size());
  variable_list result(e.joint.num_primals);
  for (size_t k = 0; k < outs.size(); ++k) result[static_cast<size_t>(e.part.grad_of[k])] = std::move(outs[k]);
  return result;
}

// The general replay: a torch::autograd::Function, for the calls ReplayNode does not take
// (Note [The replay node]).
struct ReplayFunction : torch::autograd::Function<ReplayFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList primals, std::shared_ptr<const Entry> e) {
    if (e->has_rng) {
      auto cap = c10::make_intrusive<RngCapsule>();
      cap->rng = RngStates::save(devices_of(e->part.forward));
      ctx->saved_data["rng"] = c10::IValue::make_capsule(cap);
    }
    c10::intrusive_ptr<SavedCapsule> capsule;
    variable_list in_context;
    variable_list user = run_forward(*e, std::vector<at::Tensor>(primals.begin(), primals.end()), &capsule, &in_context);
    ctx->save_for_backward(in_context);
    ctx->saved_data["saved"] = c10::IValue::make_capsule(std::move(capsule));
    ctx->saved_data["entry"] = c10::IValue::make_capsule(c10::make_intrusive<EntryHolder>(e));
    variable_list nondiff;
    for (size_t k = 0; k < user.size(); ++k) {
      if (!e->output_differentiable[k]) nondiff.push_back(user[k]);
    }
    if (!nondiff.empty()) ctx->mark_non_differentiable(nondiff);
    ctx->set_materialize_grads(false);
    return user;
  }

  // `grads` is CppNode_apply_functional's own list (custom_function.h passes its local
  // backward_inputs as an lvalue in 2.11 and never reads it after): taking it by reference
  // lets the compiled backward hold the only reference to each incoming gradient, and free
  // it at its last use, as the engine does. A list passed as an rvalue or a const one binds
  // too (then the gradients are moved or copied from there).
  template <class Grads>
  static variable_list backward(AutogradContext* ctx, Grads&& grads) {
    auto holder = c10::static_intrusive_pointer_cast<EntryHolder>(ctx->saved_data["entry"].toCapsule());
    c10::intrusive_ptr<RngCapsule> cap;
    if (ctx->saved_data.count("rng")) cap = c10::static_intrusive_pointer_cast<RngCapsule>(ctx->saved_data["rng"].toCapsule());
    variable_list result = region_backward(*holder->entry, *saved_capsule(*ctx), cap ? &cap->rng : nullptr,
                                           std::forward<Grads>(grads), [&] { return ctx->get_saved_variables(); });
    result.emplace_back();  // the entry argument's
    return result;
  }
};

// Note [The replay node]
// A replay that needs a gradient used to go through ReplayFunction::apply. Most of what
// torch::autograd::Function adds there is for arbitrary user functions: the context's
// saved_data map (three capsules by string key), a VariableInfo per input and output, a
// demangled name per backward call, the is-a-tensor mask of the arguments. A region's
// primals are all tensors, its outputs fresh, and its backward handles undefined
// gradients itself, so ReplayNode, an autograd Node of tcap's own, keeps just the entry,
// the capsule, the RNG state and the saved outputs (as SavedVariables, which knows they
// are outputs of this node and holds no reference cycle), and wraps the outputs with
// LibTorch's own _wrap_outputs (an output that is an input, or a view, is treated exactly as
// Function::apply treats it). Calls under functorch keep ReplayFunction, whose check
// refuses them as before. Compiled autograd and the double backward recognise both node
// types (is_replay_node_type, describe_replay_node).
struct ReplayNode final : torch::autograd::Node {
  std::shared_ptr<const Entry> entry;
  c10::intrusive_ptr<SavedCapsule> capsule;
  std::vector<torch::autograd::SavedVariable> saved_outputs;  // capsule->in_context's, in order
  std::optional<RngStates> rng;
  std::shared_ptr<RegionVerify> verify;  // a verified replay's (Note [Verifying a compiled region])
  // As CppNode: apply and release_variables may race (LibTorch's Note [Thread Safety on
  // Autograd Node], torch/csrc/autograd/function.h).
  std::mutex mu;

  std::string name() const override { return "tcap::CompiledRegionBackward"; }

  std::vector<at::Tensor> unpack_outputs() {
    std::vector<at::Tensor> out;
    out.reserve(saved_outputs.size());
    const auto self = shared_from_this();
    for (const auto& sv : saved_outputs) out.push_back(sv.unpack(self));
    return out;
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mu);
    if (verify) {
      std::shared_ptr<RegionVerify> v = verify;
      // After a create_graph backward, the eager gradients handed on carry eager's forward
      // graph, which a later backward may run (and free) before it reaches this node: a
      // later backward of this node runs the compiled backward, unverified.
      if (!torch::autograd::get_current_graph_task_keep_graph() || at::GradMode::is_enabled()) verify.reset();
      const variable_list incoming = grads;  // the compiled backward takes grads' tensors
      variable_list compiled = region_backward(*entry, *capsule, rng ? &*rng : nullptr, grads, [&] { return unpack_outputs(); });
      return verified_gradients(*v, incoming, std::move(compiled));  // Note [Verifying a compiled region]
    }
    return region_backward(*entry, *capsule, rng ? &*rng : nullptr, grads, [&] { return unpack_outputs(); });
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mu);
    saved_outputs.clear();
    verify.reset();
  }
};

// Note [Edges only where a gradient flows]
// Eager's autograd graph links a parameter only where an op read it differentiably: a
// parameter of the module given that the function never reads (a branch switched off, a
// head not used in this forward), or reads only through ops without a derivative, has no
// edge, so the engine never reaches its AccumulateGrad, its hooks never run and its .grad
// stays undefined. The replay node links exactly the primals its compiled backward
// returns a gradient for (PartitionResult::grad_of); an edge to any other would make the
// engine run that parameter's hooks with an undefined gradient (a hook `g * 2` then
// raises) and count it in the graph task's dependencies. A tensor passed at several
// positions (f(a, a)) gets its summed gradient at one of them; its edges at the others
// stay, as they were (dropping them lost that gradient in the engine: the node it reached
// ran with none, Contract.OneTensorAtTwoPositionsIsNoMismatch).
torch::autograd::edge_list edges_to_gradients(const Entry& e, const std::vector<at::Tensor>& primals) {
  torch::autograd::edge_list edges = torch::autograd::collect_next_edges(primals);
  std::vector<bool> flows(edges.size(), false);
  for (int j : e.part.grad_of) {
    if (static_cast<size_t>(j) < flows.size()) flows[static_cast<size_t>(j)] = true;
  }
  const auto linked_without_gradient = [&](size_t j) { return !flows[j] && edges[j].is_valid(); };
  // On every replay that needs a gradient: most link only primals that get one.
  bool any = false;
  for (size_t j = 0; j < edges.size() && !any; ++j) any = linked_without_gradient(j);
  if (!any) return edges;
  // A tensor passed at several positions has one edge at each; its gradient comes at one
  // of them (the capture sums the contributions there), and the others keep their edge.
  std::vector<std::pair<const torch::autograd::Node*, uint32_t>> reached;
  for (size_t j = 0; j < edges.size(); ++j) {
    if (flows[j] && edges[j].is_valid()) reached.emplace_back(edges[j].function.get(), edges[j].input_nr);
  }
  for (size_t j = 0; j < edges.size(); ++j) {
    if (!linked_without_gradient(j)) continue;
    const std::pair<const torch::autograd::Node*, uint32_t> at{edges[j].function.get(), edges[j].input_nr};
    if (std::find(reached.begin(), reached.end(), at) == reached.end()) edges[j] = torch::autograd::Edge();
  }
  return edges;
}

variable_list replay_through_node(const std::shared_ptr<const Entry>& e, const std::vector<at::Tensor>& primals,
                                  std::shared_ptr<RegionVerify> verify) {
  std::shared_ptr<ReplayNode> node(new ReplayNode(), torch::autograd::deleteNode);
  node->entry = e;
  node->verify = std::move(verify);
  node->set_next_edges(edges_to_gradients(*e, primals));
  if (e->has_rng) node->rng = RngStates::save(devices_of(e->part.forward));
  variable_list in_context;
  variable_list user = run_forward(*e, primals, &node->capsule, &in_context);
  std::unordered_set<at::TensorImpl*> nondiff;
  for (size_t k = 0; k < user.size(); ++k) {
    if (!e->output_differentiable[k] && user[k].defined()) nondiff.insert(user[k].unsafeGetTensorImpl());
  }
  std::vector<std::optional<at::Tensor>> raw(user.begin(), user.end());
  auto wrapped = torch::autograd::_wrap_outputs(
      primals, nondiff, /*dirty_inputs=*/{}, raw, node,
      [](const variable_list&, const variable_list&) -> variable_list {
        TORCH_CHECK(false, "tcap: forward-mode AD through a compiled region is not supported");
      },
      /*to_save_if_setup_context=*/{}, [](const at::Tensor& x) { return x.view_as(x); }, /*pure_view=*/false);
  node->saved_outputs.reserve(in_context.size());
  for (const auto& t : in_context) {
    const bool is_output = t.grad_fn().get() == node.get();
    node->saved_outputs.emplace_back(t, is_output);
  }
  variable_list out;
  out.reserve(wrapped.size());
  for (auto& w : wrapped) out.push_back(w.has_value() ? std::move(*w) : at::Tensor());
  return out;
}

}  // namespace

namespace {

// Note [Entries without a compiled backward]
// An entry compiled from a capture that saw no backward (its first calls passed without
// one) has no backward of its own: a backward reaching one of its calls would recompute
// the forward from the primals (Note [What a recompute reads]), and a write through
// .data() between the two (LibTorch's optimizers write so), which moves no version
// counter, would make that recompute read the new weights where eager's backward reads
// what its forward saved. So a call of such an entry that needs a gradient (grad mode on,
// a primal requires grad) runs the entry's forward graph through autograd, op by op as
// eager does: autograd saves eager's values, raises eager's errors for tensors changed in
// place, and a double backward differentiates eager's own nodes. Guards are checked and no
// user code runs; it is as fast as eager, not faster, and says so once per entry. Calls
// that need no gradient (no_grad, InferenceMode, inputs and parameters that do not require
// grad) replay the compiled forward.
std::vector<at::Tensor> forward_through_autograd(const Entry& e, const std::vector<at::Tensor>& primals) {
  if (!e.logged_forward_through_autograd.exchange(true)) {
    TCAP_LOG(GraphBreaks, "'" << e.fn_name << "' entry " << e.id
                              << " has no compiled backward (its capture saw none): calls that need a gradient run "
                                 "its forward through autograd, so that a backward reads the values the forward "
                                 "saw; run calls that need no gradient under torch::NoGradGuard to replay the "
                                 "compiled forward");
  }
  at::AutoGradMode grad_on(true);
  Interpreter interp(e.part.forward, /*differentiable=*/true);
  interp.keep_values(false);
  // Values read on the host that the compiled forward checks as it runs (an inline guard,
  // cache::HostReads) are checked here too: a changed one throws HostValueChanged, and
  // the call runs another way.
  interp.check_host_values(e.guards.host.mode() == cache::HostReads::Mode::Inline);
  std::vector<at::Tensor> outs = interp.run(primals);
  outs.resize(e.part.num_user_outputs);
  return outs;
}

}  // namespace

std::vector<at::Tensor> replay_region(const std::shared_ptr<const RegionEntry>& e, const std::vector<at::Tensor>& primals,
                                      std::shared_ptr<RegionVerify> verify) {
  // A replay that stops at a changed host value (an inline guard, cache::HostReads) must
  // leave the random number generators as it found them: the call then runs another way.
  std::optional<RngStates> rng;
  if (e->has_rng && e->guards.host.mode() == cache::HostReads::Mode::Inline) rng = RngStates::save(devices_of(e->part.forward));
  try {
    std::vector<at::Tensor> outs;
    if (e->use_function && !e->has_backward && at::GradMode::is_enabled() &&
        torch::autograd::any_variable_requires_grad(primals)) {
      outs = forward_through_autograd(*e, primals);
    } else if (e->use_function) {
      const bool node_takes_it = at::GradMode::is_enabled() && !at::functorch::functorchTLSAccessor() &&
                                 torch::autograd::any_variable_requires_grad(primals);
      outs = node_takes_it ? replay_through_node(e, primals, std::move(verify))
                           : ReplayFunction::apply(at::TensorList(primals), e);
    } else {
      outs = e->fw(primals);
      for (size_t j : e->mutated_primals) torch::autograd::impl::bump_version(primals[j]);
      outs.resize(e->part.num_user_outputs);
    }
    e->stats->count(&CompileStats::replays);
    return outs;
  } catch (const HostValueChanged&) {
    if (rng) rng->restore();
    throw;
  }
}

bool is_replay_node_type(const std::type_info& t) {
  return t == typeid(ReplayNode) || t == typeid(torch::autograd::CppNode<ReplayFunction>);
}

bool describe_replay_node(const torch::autograd::Node& node, std::string& key, std::vector<at::Tensor>& tensors,
                          std::vector<c10::IValue>& keep_alive) {
  const Entry* e = nullptr;
  SavedCapsule* capsule = nullptr;
  std::vector<at::Tensor> from_context;
  if (typeid(node) == typeid(ReplayNode)) {
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): reading the saved state only.
    auto& rn = const_cast<ReplayNode&>(static_cast<const ReplayNode&>(node));
    std::lock_guard<std::mutex> lock(rn.mu);
    e = rn.entry.get();
    capsule = rn.capsule.get();
    if (!capsule->in_context.empty()) from_context = rn.unpack_outputs();
    // The entry, by address: kept alive through a capsule holding it.
    keep_alive.push_back(c10::IValue::make_capsule(c10::make_intrusive<EntryHolder>(rn.entry)));
  } else if (typeid(node) == typeid(torch::autograd::CppNode<ReplayFunction>)) {
    const auto* cpp = static_cast<const torch::autograd::CppNode<ReplayFunction>*>(&node);
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): reading the context only.
    auto& ctx = const_cast<torch::autograd::AutogradContext&>(cpp->ctx_);
    const c10::IValue& entry = ctx.saved_data.at("entry");
    e = static_cast<const EntryHolder*>(entry.toCapsule().get())->entry.get();
    keep_alive.push_back(entry);
    capsule = saved_capsule(ctx).get();
    if (!capsule->in_context.empty()) from_context = ctx.get_saved_variables();
  } else {
    return false;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(e);
  key.append(reinterpret_cast<const char*>(&address), sizeof(address));
  for (auto& t : capsule->unpack(from_context, e->fn_name, /*take=*/false)) tensors.push_back(std::move(t));
  for (const auto& t : capsule->primals) tensors.push_back(t);
  return true;
}

void release_replay_node(torch::autograd::Node& node) {
  if (typeid(node) == typeid(ReplayNode)) {
    auto& rn = static_cast<ReplayNode&>(node);
    std::lock_guard<std::mutex> lock(rn.mu);
    rn.capsule->release();
  } else if (typeid(node) == typeid(torch::autograd::CppNode<ReplayFunction>)) {
    auto& cpp = static_cast<torch::autograd::CppNode<ReplayFunction>&>(node);
    saved_capsule(cpp.ctx_)->release();
  }
}

}  // namespace tcap::aot
