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

#include <functional>
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

}  // namespace tcap::capture
