#include "capture/engine_shim.h"

#include "support/logging.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/input_buffer.h>

#include <torch/csrc/autograd/utils/warnings.h>

#include <ATen/ThreadLocalState.h>
#include <c10/core/GradMode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <mutex>
#include <type_traits>

// Note [Replaying backward warnings]
// Engine::execute replays the warnings its worker threads gathered through
// DelayWarningHandler::replay_warnings(), which libtorch does not export. The standard
// explicit-instantiation rule (access checks do not apply to the names in an explicit
// instantiation) gives this file a pointer to the handler's private queue, and
// replay_backward_warnings() does what replay_warnings() does.
namespace tcap::capture {
namespace {
template <auto Member>
struct PrivateAccess {
  friend constexpr auto warnings_member() { return Member; }
};
constexpr auto warnings_member();
template struct PrivateAccess<&torch::autograd::utils::DelayWarningHandler::warnings_>;

void replay_backward_warnings(torch::autograd::utils::DelayWarningHandler& h) {
  auto& queue = h.*warnings_member();
  for (const auto& w : queue) c10::warn(w);
  queue.clear();
}
}  // namespace
}  // namespace tcap::capture

namespace tcap::capture {
namespace {

using torch::autograd::Engine;
using torch::autograd::GraphTask;
using torch::autograd::variable_list;

// See Note [Intercepting backward()]: the 2.6 - 2.12 signature.
using ExpectedHook = variable_list (*)(const std::shared_ptr<torch::autograd::Node>&,
                                       const GraphTask&, bool,
                                       const torch::autograd::edge_list&);
static_assert(std::is_same_v<Engine::compiled_autograd_fn, ExpectedHook>,
              "tcap: Engine::compiled_autograd_fn changed in this LibTorch; update engine_shim.cpp");

std::mutex g_mutex;
int g_leases = 0;
std::atomic<BackwardDriver> g_driver{nullptr};  // read by the hook without the mutex

variable_list engine_hook(const std::shared_ptr<torch::autograd::Node>& root, const GraphTask& task,
                          bool accumulate_grad, const torch::autograd::edge_list& outputs) {
  BackwardCall call;
  call.root = root;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): the engine owns it mutably.
  call.task = const_cast<GraphTask&>(task).shared_from_this();
  call.accumulate_grad = accumulate_grad;
  call.outputs = &outputs;
  BackwardDriver driver = g_driver.load();
  return driver ? driver(call) : call.run();
}

}  // namespace

std::vector<at::Tensor> BackwardCall::root_grads() const {
  if (auto* gr = dynamic_cast<torch::autograd::GraphRoot*>(root.get())) return gr->outputs;
  return {};
}

bool BackwardCall::keep_graph() const { return task->keep_graph_; }

bool BackwardCall::create_graph() const {
  at::ThreadLocalStateGuard as_the_task(task->thread_locals_);
  return at::GradMode::is_enabled();
}

void BackwardCall::include_in_thread_locals(c10::DispatchKey key) const {
  at::ThreadLocalStateGuard as_the_task(task->thread_locals_);
  c10::impl::tls_set_dispatch_key_included(key, true);
  c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
  task->thread_locals_ = at::ThreadLocalState();
}

variable_list BackwardCall::run() const {
  auto fut = Engine::get_default_engine().execute_with_graph_task(
      task, root, torch::autograd::InputBuffer(variable_list()));
  fut->wait();
  replay_backward_warnings(task->warning_handler_);
  return fut->value().toTensorVector();
}

EngineHookLease::EngineHookLease(BackwardDriver driver) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_driver == nullptr || g_driver == driver,
              "tcap: another backward driver is installed");
  if (g_leases++ == 0) {
    g_driver = driver;
    Engine::set_compiled_autograd(&engine_hook);
  }
}

EngineHookLease::~EngineHookLease() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_leases == 0) {
    try {
      Engine::set_compiled_autograd(nullptr);
      g_driver = nullptr;
    } catch (const std::exception& e) {
      // The hook stays installed; with no session on a thread it only runs the engine.
      TCAP_LOG(Capture, "could not uninstall the engine hook (kept, harmless): " << e.what());
    }
  }
}

}  // namespace tcap::capture
