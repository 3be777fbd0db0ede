// Backward capture: the driver that the engine hook calls for every backward() while a
// capture is alive, and the hook wrappers that turn autograd hooks into call_hook nodes.
//
// Note [Hooks become call_hook nodes]
// Before the engine runs a captured backward, every hook reachable from the roots
// (tensor pre-hooks, retain_grad hooks, node pre- and post-hooks; a leaf's hooks are its
// AccumulateGrad node's tensor pre-hooks) is wrapped. The wrapper tells the sessions on
// this thread that a hook body starts (its ops are recorded with Node::hook set), calls
// the real hook, then records one CallHook node: inputs, the hook's results, and new
// values that later ops read, so the gradient visibly flows through the hook. The
// wrappers are removed again when the backward ends, also on error.
#pragma once

#include "capture/engine_shim.h"

#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace tcap::capture {

torch::autograd::variable_list capture_backward_driver(const BackwardCall& call);

// Compiled autograd's entry point: while a handler is set on a thread (and no capture
// there records the backward), every backward()/grad() the engine hook sees on that thread
// goes to it instead of the engine. A handler must eventually run the call or replace it.
struct BackwardHandler {
  virtual ~BackwardHandler() = default;
  virtual torch::autograd::variable_list handle(const BackwardCall& call) = 0;
};
class BackwardHandlerScope {
 public:
  explicit BackwardHandlerScope(BackwardHandler* h);
  ~BackwardHandlerScope();
  BackwardHandlerScope(const BackwardHandlerScope&) = delete;
  BackwardHandlerScope& operator=(const BackwardHandlerScope&) = delete;

 private:
  BackwardHandler* prev_;
};

// Wraps every hook reachable from `root` into a recording wrapper for its lifetime (Note
// [Hooks become call_hook nodes]); hooks found in `slots` (by object address) become
// opaque call_hook nodes with that slot (Note [Opaque hooks]). Hooks tcap attaches itself
// (observers) are left alone. `label` names the autograd nodes in the recorded hooks.
class HookWrapScope {
 public:
  using SlotOf = std::unordered_map<const void*, int>;
  using NodeLabeler = std::function<std::string(const torch::autograd::Node&)>;
  explicit HookWrapScope(const NodePtr& root, const SlotOf* slots = nullptr, const NodeLabeler* label = nullptr);
  ~HookWrapScope();
  HookWrapScope(const HookWrapScope&) = delete;
  HookWrapScope& operator=(const HookWrapScope&) = delete;

 private:
  int slot_of(const void* hook) const;
  void wrap(torch::autograd::Node* n);
  static void restore(torch::autograd::Node* n);
  const SlotOf* slots_;
  const NodeLabeler* label_;
  std::vector<NodePtr> nodes_;
};

// Note [Hooks called once under verify]
// A verified call runs a compiled backward and eager's on one call. Hooks the compiled code
// calls as objects (compiled autograd's opaque call_hook nodes, compile_step's parameter
// hooks) would then run twice: a counting hook counts twice, a retain_grad .grad doubles, a
// hook that scales a parameter's gradient is applied to eager's .grad once more. So eager's
// side calls the real hooks, each call taped (the gradients the hook received and those it
// returned), and the compiled side calls none: each call it makes of a taped hook takes the
// hook's next taped call and returns its results, and what it received is kept beside what
// eager's call received, for the verifier to compare (a difference upstream of a hook is
// found there, not hidden by the hook's results). A hook eager's side did not call runs for
// real. Where eager's side differentiates with torch::autograd::grad on the primals (a
// verified tcap::compile region), the primals' own hooks would run there and again when
// eager's gradients are handed on to them, so they are passed over in that grad call.
struct HookTape {
  struct Played {
    int slot;
    torch::autograd::variable_list taped_in;  // what eager's call of the hook received
    torch::autograd::variable_list in;        // what the compiled side's call received
  };
  void record(int slot, const torch::autograd::variable_list& in, const torch::autograd::variable_list& out);
  // The results of the next taped call of `slot`, given what the hook receives now (kept
  // in played()); nullopt where no taped call is left.
  std::optional<torch::autograd::variable_list> play(int slot, const torch::autograd::variable_list& in);
  std::vector<Played> played() const;

 private:
  struct Call {
    torch::autograd::variable_list in, out;
  };
  mutable std::mutex mutex_;  // the engine may run hooks on its device threads
  std::unordered_map<int, std::deque<Call>> calls_;
  std::vector<Played> played_;
};

// While alive, the hooks named by `slots` (by object address) record into, or play from,
// `tape`; PassOver returns each such hook's gradients unchanged without calling it. Over
// every node reachable from a root, or over leaves' own hooks (Tensor::register_hook on a
// parameter: the list its AccumulateGrad node reads).
class HookTapeScope {
 public:
  enum class Mode { Record, Play, PassOver };
  struct LeafHook {
    at::Tensor leaf;
    size_t index;  // in the leaf's hook list
    int slot;
  };
  HookTapeScope(const NodePtr& root, const HookWrapScope::SlotOf& slots, HookTape* tape, Mode mode);
  HookTapeScope(std::vector<LeafHook> leaf_hooks, HookTape* tape, Mode mode);
  ~HookTapeScope();
  HookTapeScope(const HookTapeScope&) = delete;
  HookTapeScope& operator=(const HookTapeScope&) = delete;

 private:
  void wrap(torch::autograd::Node* n, const HookWrapScope::SlotOf& slots);
  HookTape* tape_;
  Mode mode_;
  std::vector<NodePtr> nodes_;
  std::vector<at::Tensor> leaves_;
};

}  // namespace tcap::capture
