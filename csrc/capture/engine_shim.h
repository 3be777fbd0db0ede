// The one place tcap touches the autograd engine's internal hook
// (Engine::set_compiled_autograd). See Note [Intercepting backward()].
//
// Note [Intercepting backward()]
// Engine::execute, after building the GraphTask and a GraphRoot and computing the
// dependencies, hands the whole backward to a process-wide function pointer when one is
// installed (PyTorch's compiled-autograd hook). tcap installs one while any capture that
// records backward is alive. Its driver may observe the graph (wrap hooks, mark the
// backward phase) and then runs the graph task exactly as the engine would have
// (execute_with_graph_task, wait, replay warnings), so behaviour is unchanged.
// The hook's signature changed across releases (GraphTask& -> const GraphTask& in 2.6,
// shared_ptr<Node> -> intrusive_ptr<Node> in 2.13): it is checked at compile time here.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <vector>

namespace torch::autograd {
struct GraphTask;
}

namespace tcap::capture {

using NodePtr = std::shared_ptr<torch::autograd::Node>;

// What the driver receives for one backward()/grad() call.
struct BackwardCall {
  NodePtr root;                                   // a GraphRoot
  std::shared_ptr<torch::autograd::GraphTask> task;
  bool accumulate_grad = true;                    // backward() (true) or grad() (false)
  const torch::autograd::edge_list* outputs = nullptr;
  std::vector<at::Tensor> root_grads() const;     // the gradients fed to the roots
  bool keep_graph() const;                         // retain_graph
  bool create_graph() const;                       // the task runs with grad mode on
  // Adds `key` to the dispatch keys included in the task's thread-local snapshot (the
  // engine runs every node under that snapshot) and turns autograd threads off there;
  // everything else in the snapshot (grad mode = create_graph, ...) stays.
  void include_in_thread_locals(c10::DispatchKey key) const;
  // Runs the task as Engine::execute would have without a hook; returns grad()'s results.
  torch::autograd::variable_list run() const;
};

using BackwardDriver = torch::autograd::variable_list (*)(const BackwardCall&);

// While at least one lease is alive, every backward()/grad() in the process goes through
// `driver` (which must call BackwardCall::run()). The previous (null) hook is restored
// when the last lease ends.
class EngineHookLease {
 public:
  explicit EngineHookLease(BackwardDriver driver);
  ~EngineHookLease();
  EngineHookLease(const EngineHookLease&) = delete;
  EngineHookLease& operator=(const EngineHookLease&) = delete;
};

}  // namespace tcap::capture
