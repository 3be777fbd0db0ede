#include "capture/hooks.h"

#include "capture/recorder.h"
#include "capture/session.h"
#include "support/logging.h"

#include <torch/csrc/autograd/function_hook.h>

#include <unordered_set>

namespace tcap::capture {
namespace {

using torch::autograd::FunctionPostHook;
using torch::autograd::FunctionPreHook;
using torch::autograd::variable_list;

// Notifies every recording session on this thread around one hook call.
class HookCall {
 public:
  HookCall(ir::HookKind kind, const std::string& node_name) {
    for (Session* s : thread_sessions()) {
      if (s->recording()) open_.emplace_back(s, s->begin_hook(kind, node_name));
    }
  }
  void finish(const variable_list& in, const variable_list& out) {
    for (auto& [s, id] : open_) s->end_hook(id, in, out);
    open_.clear();
  }
  ~HookCall() {
    for (auto& [s, id] : open_) s->abort_hook(id);
  }

 private:
  std::vector<std::pair<Session*, int>> open_;
};

struct RecordingPreHook : FunctionPreHook {
  RecordingPreHook(std::unique_ptr<FunctionPreHook> inner, ir::HookKind kind, std::string node)
      : inner(std::move(inner)), kind(kind), node(std::move(node)) {}
  variable_list operator()(const variable_list& grads) override {
    HookCall call(kind, node);
    variable_list out = (*inner)(grads);
    call.finish(grads, out);
    return out;
  }
  std::unique_ptr<FunctionPreHook> inner;
  ir::HookKind kind;
  std::string node;
};

struct RecordingPostHook : FunctionPostHook {
  RecordingPostHook(std::unique_ptr<FunctionPostHook> inner, std::string node)
      : inner(std::move(inner)), node(std::move(node)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    HookCall call(ir::HookKind::PostHook, node);
    variable_list out = (*inner)(outputs, inputs);
    call.finish(outputs, out);
    return out;
  }
  std::unique_ptr<FunctionPostHook> inner;
  std::string node;
};

template <class Wrapper, class Inner>
std::unique_ptr<Inner> unwrap(std::unique_ptr<Inner>& slot) {
  if (auto* w = dynamic_cast<Wrapper*>(slot.get())) return std::move(w->inner);
  return std::move(slot);
}

// Wraps every hook reachable from a root for the lifetime of the object.
class HookWrapScope {
 public:
  explicit HookWrapScope(const NodePtr& root) {
    std::vector<torch::autograd::Node*> todo{root.get()};
    std::unordered_set<torch::autograd::Node*> seen;
    while (!todo.empty()) {
      torch::autograd::Node* n = todo.back();
      todo.pop_back();
      if (!n || !seen.insert(n).second) continue;
      wrap(n);
      for (const auto& e : n->next_edges()) {
        if (e.function) todo.push_back(e.function.get());
      }
    }
  }
  ~HookWrapScope() {
    for (const auto& keep : nodes_) restore(keep.get());
  }

 private:
  void wrap(torch::autograd::Node* n) {
    bool any = false;
    const std::string name = n->name();
    for (auto& h : n->tensor_pre_hooks()) {
      h = std::make_unique<RecordingPreHook>(std::move(h), ir::HookKind::TensorPreHook, name);
      any = true;
    }
    for (auto& [k, h] : n->retains_grad_hooks()) {
      h = std::make_unique<RecordingPreHook>(std::move(h), ir::HookKind::RetainsGradHook, name);
      any = true;
    }
    for (auto& h : n->pre_hooks()) {
      h = std::make_unique<RecordingPreHook>(std::move(h), ir::HookKind::PreHook, name);
      any = true;
    }
    for (auto& h : n->post_hooks()) {
      h = std::make_unique<RecordingPostHook>(std::move(h), name);
      any = true;
    }
    if (any) {
      nodes_.push_back(n->getptr());
      TCAP_LOG(Capture, "wrapped the hooks of " << name);
    }
  }
  static void restore(torch::autograd::Node* n) {
    for (auto& h : n->tensor_pre_hooks()) h = unwrap<RecordingPreHook>(h);
    for (auto& [k, h] : n->retains_grad_hooks()) h = unwrap<RecordingPreHook>(h);
    for (auto& h : n->pre_hooks()) h = unwrap<RecordingPreHook>(h);
    for (auto& h : n->post_hooks()) h = unwrap<RecordingPostHook>(h);
  }
  std::vector<NodePtr> nodes_;
};

}  // namespace

variable_list capture_backward_driver(const BackwardCall& call) {
  std::vector<Session*> sessions;
  for (Session* s : thread_sessions()) {
    if (s->recording() && s->options().record_backward) sessions.push_back(s);
  }
  if (sessions.empty()) return call.run();
  const auto root_grads = call.root_grads();
  HookWrapScope wrap(call.root);
  for (Session* s : sessions) s->begin_backward(root_grads);
  struct End {
    std::vector<Session*>& ss;
    ~End() {
      for (Session* s : ss) s->end_backward();
    }
  } end{sessions};
  return call.run();
}

}  // namespace tcap::capture
