// How the interpreter calls hooks whose bodies were not recorded, and where it reports the
// values it read on the host.
//
// Note [Opaque hooks]
// Capture records a hook's body as ordinary nodes (Hook::slot == -1): replay runs those
// nodes, and the CallHook node only passes the results on. Compiled autograd instead
// records a hook as one opaque CallHook (Hook::slot >= 0) and must call the real hook
// object of the *current* backward at replay: hooks are registered again on every
// forward, they may have side effects (logging a gradient norm, setting .grad through
// retain_grad), and the tensors they return flow on. The runtime that owns those hook
// objects installs a HookRunner for the duration of a replay; the interpreter hands it
// the slot, the gradients the hook receives and, for a node post-hook, the gradients the
// node received. A graph with opaque hooks run without a runner fails with a clear error.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <vector>

namespace tcap::interp {

using HookRunner = std::function<std::vector<at::Tensor>(
    int slot, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& node_inputs)>;

// RAII: `runner` serves opaque CallHook nodes run on this thread while the scope lives.
class HookRunnerScope {
 public:
  explicit HookRunnerScope(const HookRunner* runner);
  ~HookRunnerScope();
  HookRunnerScope(const HookRunnerScope&) = delete;
  HookRunnerScope& operator=(const HookRunnerScope&) = delete;

 private:
  const HookRunner* prev_;
};

const HookRunner* current_hook_runner();

// RAII: an executable run on this thread while the scope lives stores the values its
// graph read on the host (Interpreter::host_values) into `sink` (compile_step's
// last_call()). Not filled by a user's compiler.
class HostValuesScope {
 public:
  explicit HostValuesScope(std::vector<c10::IValue>* sink);
  ~HostValuesScope();
  HostValuesScope(const HostValuesScope&) = delete;
  HostValuesScope& operator=(const HostValuesScope&) = delete;

 private:
  std::vector<c10::IValue>* prev_;
};

std::vector<c10::IValue>* host_values_sink();

}  // namespace tcap::interp
