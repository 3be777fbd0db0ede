#include "capture/engine_shim.h"

#include "capture/recorder.h"
#include "support/logging.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/input_buffer.h>
#include <torch/csrc/autograd/variable.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>

namespace tcap::capture {

using torch::autograd::Engine;
using torch::autograd::edge_list;
using torch::autograd::variable_list;

// See Note [Intercepting backward()].
class ForwardingEngine final : public Engine {
 public:
  explicit ForwardingEngine(Engine& next) : next_(next) {}

  variable_list execute(const edge_list& roots, const variable_list& inputs, bool keep_graph, bool create_graph,
                        bool accumulate_grad, const edge_list& outputs) override;

  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(
      const std::shared_ptr<torch::autograd::GraphTask>& graph_task, std::shared_ptr<torch::autograd::Node> graph_root,
      torch::autograd::InputBuffer&& input_buffer) override {
    return next_.execute_with_graph_task(graph_task, std::move(graph_root), std::move(input_buffer));
  }
  std::unique_ptr<torch::autograd::AnomalyMetadata> make_anomaly_metadata() override {
    return next_.make_anomaly_metadata();
  }
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    return next_.get_default_saved_variable_hooks();
  }

 private:
  Engine& next_;
};

namespace {

std::mutex g_mutex;
int g_leases = 0;
std::atomic<BackwardDriver> g_driver{nullptr};  // read by execute() without the mutex
std::atomic<ForwardingEngine*> g_engine{nullptr};

Engine& forwarding_engine() { return *g_engine.load(std::memory_order_acquire); }

// Under g_mutex. Never uninstalled; see Note [Intercepting backward()].
void install_forwarding_engine() {
  if (g_engine.load() != nullptr) return;
  Engine& next = Engine::get_default_engine();
  // Leaked: a thread may reach it through the stub at any time, process exit included.
  g_engine.store(new ForwardingEngine(next), std::memory_order_release);
  torch::autograd::set_default_engine_stub(&forwarding_engine);
  TCAP_LOG(Capture, "installed tcap's forwarding autograd engine");
}

}  // namespace

namespace {

// See Note [Backwards and graph edits on several threads]: a readers-writer lock in which
// a waiting writer keeps new readers out.
class EditLock {
 public:
  void lock_read() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !writer_ && writers_waiting_ == 0; });
    ++readers_;
  }
  void unlock_read() {
    std::lock_guard<std::mutex> l(m_);
    if (--readers_ == 0 && writers_waiting_ > 0) cv_.notify_all();
  }
  void lock_edit() {
    std::unique_lock<std::mutex> l(m_);
    ++writers_waiting_;
    cv_.wait(l, [&] { return !writer_ && readers_ == 0; });
    --writers_waiting_;
    writer_ = true;
  }
  void unlock_edit() {
    std::lock_guard<std::mutex> l(m_);
    writer_ = false;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int readers_ = 0;
  int writers_waiting_ = 0;
  bool writer_ = false;
};

EditLock& edit_lock() {
  static auto* l = new EditLock();  // leaked: backwards may run during static destruction
  return *l;
}

thread_local int tls_read_depth = 0;
thread_local int tls_edit_depth = 0;

}  // namespace

GraphLock::GraphLock(Mode mode) {
  if (tls_edit_depth > 0) {  // this thread edits: everything it does is covered
    ++tls_edit_depth;
    held_ = Held::Edit;
    return;
  }
  if (mode == Mode::Read) {
    // Nested in a backward of this thread, or reentrant on a device thread: the outer
    // backward's hold covers it.
    if (tls_read_depth > 0 || torch::autograd::get_current_graph_task_id() != -1) return;
    edit_lock().lock_read();
    ++tls_read_depth;
    held_ = Held::Read;
    return;
  }
  if (tls_read_depth == 0 && torch::autograd::get_current_graph_task_id() != -1) {
    // An edit from inside a backward whose hold is on another thread (a device thread):
    // waiting here could wait for that backward, which waits for this one.
    return;
  }
  if (tls_read_depth > 0) {
    // This thread holds it to read (an edit from inside its own backward, or a lookup
    // that missed): give the read up while it edits, and take it again after.
    edit_lock().unlock_read();
    held_ = Held::ReadGivenUpForEdit;
  } else {
    held_ = Held::Edit;
  }
  edit_lock().lock_edit();
  ++tls_edit_depth;
}

GraphLock::~GraphLock() {
  switch (held_) {
    case Held::None: return;
    case Held::Read:
      --tls_read_depth;
      edit_lock().unlock_read();
      return;
    case Held::Edit:
      if (--tls_edit_depth == 0) edit_lock().unlock_edit();
      return;
    case Held::ReadGivenUpForEdit:
      if (--tls_edit_depth == 0) edit_lock().unlock_edit();
      edit_lock().lock_read();
      return;
  }
}

variable_list ForwardingEngine::execute(const edge_list& roots, const variable_list& inputs, bool keep_graph,
                                        bool create_graph, bool accumulate_grad, const edge_list& outputs) {
  // Note [Backwards and graph edits on several threads]: a plain backward reads the graph;
  // the driver takes what it needs itself.
  BackwardDriver driver = g_driver.load(std::memory_order_acquire);
  if (driver == nullptr) {
    GraphLock read(GraphLock::Mode::Read);
    return next_.execute(roots, inputs, keep_graph, create_graph, accumulate_grad, outputs);
  }
  // The checks (and casts) Engine::execute makes first, so the driver sees the gradients
  // the engine would run with; the engine repeats them on the checked list (no-ops).
  variable_list grads = inputs;
  torch::autograd::validate_outputs(roots, grads, [](const std::string& msg) { return msg; });
  BackwardCall call;
  call.roots = &roots;
  call.root = std::make_shared<torch::autograd::GraphRoot>(roots, std::move(grads));
  call.accumulate_grad = accumulate_grad;
  call.outputs = &outputs;
  call.keep_graph_ = keep_graph;
  call.create_graph_ = create_graph;
  call.next_ = &next_;
  return driver(call);
}

std::vector<at::Tensor> BackwardCall::root_grads() const {
  if (auto* gr = dynamic_cast<torch::autograd::GraphRoot*>(root.get())) return gr->outputs;
  return {};
}

void BackwardCall::include_in_thread_locals(c10::DispatchKey key) const { include_ = include_ | c10::DispatchKeySet(key); }

variable_list BackwardCall::run() const {
  // GraphTask's constructor snapshots this thread's state; every node runs under it.
  std::optional<c10::impl::IncludeDispatchKeyGuard> include;
  std::optional<MultithreadingOff> single_threaded;
  if (!include_.empty()) {
    include.emplace(include_);
    single_threaded.emplace();
  }
  return next_->execute(*roots, root_grads(), keep_graph_, create_graph_, accumulate_grad, *outputs);
}

EngineHookLease::EngineHookLease(BackwardDriver driver) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_driver == nullptr || g_driver == driver, "tcap: another backward driver is installed");
  install_forwarding_engine();
  if (g_leases++ == 0) g_driver = driver;
}

EngineHookLease::~EngineHookLease() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_leases == 0) g_driver = nullptr;
}

std::vector<torch::autograd::FunctionPreHook*> leaf_tensor_hooks(const at::Tensor& t) {
  std::vector<torch::autograd::FunctionPreHook*> out;
  // requires_grad() implies autograd metadata, so impl::hooks creates none.
  if (!t.defined() || !t.requires_grad() || !t.is_leaf()) return out;
  for (const auto& h : torch::autograd::impl::hooks(t)) {
    if (h) out.push_back(h.get());
  }
  return out;
}

std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>>* leaf_tensor_hook_list(const at::Tensor& t) {
  if (!t.defined() || !t.requires_grad() || !t.is_leaf()) return nullptr;
  return &torch::autograd::impl::hooks(t);
}

bool has_post_accumulate_grad_hook(const at::Tensor& t) {
  if (!t.defined() || !t.requires_grad() || !t.is_leaf()) return false;
  return torch::autograd::impl::post_acc_grad_hooks(t) != nullptr;
}

const RecordedGradHook* recorded_grad_hook(const at::Tensor& t) {
  if (!has_post_accumulate_grad_hook(t)) return nullptr;
  return dynamic_cast<const RecordedGradHook*>(torch::autograd::impl::post_acc_grad_hooks(t).get());
}

}  // namespace tcap::capture
