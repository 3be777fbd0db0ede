#include "capture/hooks.h"

#include "capture/armed.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "support/logging.h"

#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function_hook.h>

#include <mutex>
#include <optional>
#include <unordered_set>

namespace tcap::capture {
namespace {

using torch::autograd::FunctionPostHook;
using torch::autograd::FunctionPreHook;
using torch::autograd::variable_list;

// Notifies every recording session on this thread around one hook call.
class HookCall {
 public:
  HookCall(ir::HookKind kind, const std::string& node_name, int slot) : slot_(slot) {
    for (Session* s : thread_sessions()) {
      if (s->recording()) open_.emplace_back(s, s->begin_hook(kind, node_name, slot));
    }
  }
  void finish(const variable_list& in, const variable_list& node_in, const variable_list& out) {
    for (auto& [s, id] : open_) {
      if (slot_ >= 0) s->end_opaque_hook(id, in, node_in, out);
      else s->end_hook(id, in, out);
    }
    open_.clear();
  }
  ~HookCall() {
    for (auto& [s, id] : open_) s->abort_hook(id);
  }

 private:
  int slot_;
  std::vector<std::pair<Session*, int>> open_;
};

// An opaque hook's body runs with the recording key off (Note [Opaque hooks]).
struct MaybeHidden {
  explicit MaybeHidden(int slot) {
    if (slot >= 0) guard.emplace(recording_key());
  }
  std::optional<c10::impl::ExcludeDispatchKeyGuard> guard;
};

struct RecordingPreHook : FunctionPreHook {
  RecordingPreHook(std::unique_ptr<FunctionPreHook> inner, ir::HookKind kind, std::string node, int slot)
      : inner(std::move(inner)), kind(kind), node(std::move(node)), slot(slot) {}
  variable_list operator()(const variable_list& grads) override {
    HookCall call(kind, node, slot);
    variable_list out;
    {
      MaybeHidden hidden(slot);
      out = (*inner)(grads);
    }
    call.finish(grads, {}, out);
    return out;
  }
  std::unique_ptr<FunctionPreHook> inner;
  ir::HookKind kind;
  std::string node;
  int slot;
};

struct RecordingPostHook : FunctionPostHook {
  RecordingPostHook(std::unique_ptr<FunctionPostHook> inner, std::string node, int slot)
      : inner(std::move(inner)), node(std::move(node)), slot(slot) {}
  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    HookCall call(ir::HookKind::PostHook, node, slot);
    variable_list out;
    {
      MaybeHidden hidden(slot);
      out = (*inner)(outputs, inputs);
    }
    call.finish(outputs, slot >= 0 ? inputs : variable_list{}, out);
    return out;
  }
  std::unique_ptr<FunctionPostHook> inner;
  std::string node;
  int slot;
};

// Calls f on every node reachable from root, once each.
template <class F>
void for_each_node(const NodePtr& root, F&& f) {
  std::vector<torch::autograd::Node*> todo{root.get()};
  std::unordered_set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    f(n);
    for (const auto& e : n->next_edges()) {
      if (e.function) todo.push_back(e.function.get());
    }
  }
}

template <class Wrapper, class Inner>
std::unique_ptr<Inner> unwrap(std::unique_ptr<Inner>& slot) {
  if (auto* w = dynamic_cast<Wrapper*>(slot.get())) return std::move(w->inner);
  return std::move(slot);
}

}  // namespace

HookWrapScope::HookWrapScope(const NodePtr& root, const SlotOf* slots, const NodeLabeler* label)
    : slots_(slots), label_(label) {
  for_each_node(root, [this](torch::autograd::Node* n) { wrap(n); });
}

HookWrapScope::~HookWrapScope() {
  for (const auto& keep : nodes_) restore(keep.get());
}

int HookWrapScope::slot_of(const void* hook) const {
  if (!slots_) return -1;
  auto it = slots_->find(hook);
  return it == slots_->end() ? -1 : it->second;
}

void HookWrapScope::wrap(torch::autograd::Node* n) {
  // The node's label only for nodes that have hooks: most have none.
  std::string name;
  bool named = false;
  auto label = [&]() -> const std::string& {
    if (!named) {
      name = label_ && *label_ ? (*label_)(*n) : node_name(*n);
      named = true;
    }
    return name;
  };
  for (auto& h : n->tensor_pre_hooks()) {
    if (dynamic_cast<ObserverPreHook*>(h.get())) continue;
    const int slot = slot_of(h.get());
    h = std::make_unique<RecordingPreHook>(std::move(h), ir::HookKind::TensorPreHook, label(), slot);
  }
  for (auto& [k, h] : n->retains_grad_hooks()) {
    const int slot = slot_of(h.get());
    h = std::make_unique<RecordingPreHook>(std::move(h), ir::HookKind::RetainsGradHook, label(), slot);
  }
  for (auto& h : n->pre_hooks()) {
    if (dynamic_cast<ObserverPreHook*>(h.get())) continue;
    const int slot = slot_of(h.get());
    h = std::make_unique<RecordingPreHook>(std::move(h), ir::HookKind::PreHook, label(), slot);
  }
  for (auto& h : n->post_hooks()) {
    if (dynamic_cast<ObserverPostHook*>(h.get())) continue;
    const int slot = slot_of(h.get());
    h = std::make_unique<RecordingPostHook>(std::move(h), label(), slot);
  }
  if (named) {
    nodes_.push_back(n->getptr());
    TCAP_LOG(Capture, "wrapped the hooks of " << name);
  }
}

void HookWrapScope::restore(torch::autograd::Node* n) {
  for (auto& h : n->tensor_pre_hooks()) h = unwrap<RecordingPreHook>(h);
  for (auto& [k, h] : n->retains_grad_hooks()) h = unwrap<RecordingPreHook>(h);
  for (auto& h : n->pre_hooks()) h = unwrap<RecordingPreHook>(h);
  for (auto& h : n->post_hooks()) h = unwrap<RecordingPostHook>(h);
}

namespace {

variable_list copies(const variable_list& v) {
  variable_list out;
  out.reserve(v.size());
  for (const auto& t : v) out.push_back(t.defined() ? t.detach().clone() : at::Tensor());
  return out;
}

// Note [Hooks called once under verify]: one call of a hook that receives `grads`,
// recording, played, or passed over; `call` calls the real hook.
template <class Call>
variable_list taped_call(HookTape* tape, HookTapeScope::Mode mode, int slot, const variable_list& grads, Call&& call) {
  switch (mode) {
    case HookTapeScope::Mode::PassOver: return grads;
    case HookTapeScope::Mode::Play:
      if (auto out = tape->play(slot, grads)) return *out;
      return call();
    case HookTapeScope::Mode::Record: break;
  }
  variable_list out = call();
  tape->record(slot, grads, out);
  return out;
}

struct TapePreHook : FunctionPreHook {
  TapePreHook(std::unique_ptr<FunctionPreHook> inner, HookTape* tape, HookTapeScope::Mode mode, int slot)
      : inner(std::move(inner)), tape(tape), mode(mode), slot(slot) {}
  variable_list operator()(const variable_list& grads) override {
    return taped_call(tape, mode, slot, grads, [&] { return (*inner)(grads); });
  }
  std::unique_ptr<FunctionPreHook> inner;
  HookTape* tape;
  HookTapeScope::Mode mode;
  int slot;
};

struct TapePostHook : FunctionPostHook {
  TapePostHook(std::unique_ptr<FunctionPostHook> inner, HookTape* tape, HookTapeScope::Mode mode, int slot)
      : inner(std::move(inner)), tape(tape), mode(mode), slot(slot) {}
  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    return taped_call(tape, mode, slot, outputs, [&] { return (*inner)(outputs, inputs); });
  }
  std::unique_ptr<FunctionPostHook> inner;
  HookTape* tape;
  HookTapeScope::Mode mode;
  int slot;
};

void unwrap_tapes(std::vector<std::unique_ptr<FunctionPreHook>>& hooks) {
  for (auto& h : hooks) h = unwrap<TapePreHook>(h);
}

}  // namespace

void HookTape::record(int slot, const variable_list& in, const variable_list& out) {
  // Copies: the engine may steal a gradient into .grad and accumulate into it later.
  Call c{copies(in), copies(out)};
  std::lock_guard<std::mutex> lock(mutex_);
  calls_[slot].push_back(std::move(c));
}

std::optional<variable_list> HookTape::play(int slot, const variable_list& in) {
  variable_list now = copies(in);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(slot);
  if (it == calls_.end() || it->second.empty()) return std::nullopt;
  Call c = std::move(it->second.front());
  it->second.pop_front();
  played_.push_back({slot, std::move(c.in), std::move(now)});
  return std::move(c.out);
}

std::vector<HookTape::Played> HookTape::played() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return played_;
}

HookTapeScope::HookTapeScope(const NodePtr& root, const HookWrapScope::SlotOf& slots, HookTape* tape, Mode mode)
    : tape_(tape), mode_(mode) {
  for_each_node(root, [this, &slots](torch::autograd::Node* n) { wrap(n, slots); });
}

HookTapeScope::HookTapeScope(std::vector<LeafHook> leaf_hooks, HookTape* tape, Mode mode) : tape_(tape), mode_(mode) {
  for (auto& h : leaf_hooks) {
    auto* list = leaf_tensor_hook_list(h.leaf);
    if (!list || h.index >= list->size() || !(*list)[h.index]) continue;
    auto& slot = (*list)[h.index];
    slot = std::make_unique<TapePreHook>(std::move(slot), tape_, mode_, h.slot);
    leaves_.push_back(std::move(h.leaf));
  }
}

void HookTapeScope::wrap(torch::autograd::Node* n, const HookWrapScope::SlotOf& slots) {
  bool wrapped = false;
  auto slot_of = [&](const void* h) {
    auto it = slots.find(h);
    return it == slots.end() ? -1 : it->second;
  };
  for (auto& h : n->tensor_pre_hooks()) {
    if (const int k = slot_of(h.get()); k >= 0) {
      h = std::make_unique<TapePreHook>(std::move(h), tape_, mode_, k);
      wrapped = true;
    }
  }
  for (auto& [i, h] : n->retains_grad_hooks()) {
    if (const int k = slot_of(h.get()); k >= 0) {
      h = std::make_unique<TapePreHook>(std::move(h), tape_, mode_, k);
      wrapped = true;
    }
  }
  for (auto& h : n->pre_hooks()) {
    if (const int k = slot_of(h.get()); k >= 0) {
      h = std::make_unique<TapePreHook>(std::move(h), tape_, mode_, k);
      wrapped = true;
    }
  }
  for (auto& h : n->post_hooks()) {
    if (const int k = slot_of(h.get()); k >= 0) {
      h = std::make_unique<TapePostHook>(std::move(h), tape_, mode_, k);
      wrapped = true;
    }
  }
  if (wrapped) nodes_.push_back(n->getptr());
}

HookTapeScope::~HookTapeScope() {
  for (const auto& n : nodes_) {
    unwrap_tapes(n->tensor_pre_hooks());
    for (auto& [i, h] : n->retains_grad_hooks()) h = unwrap<TapePreHook>(h);
    unwrap_tapes(n->pre_hooks());
    for (auto& h : n->post_hooks()) h = unwrap<TapePostHook>(h);
  }
  for (const auto& t : leaves_) {
    if (auto* list = leaf_tensor_hook_list(t)) unwrap_tapes(*list);
  }
}

namespace {

struct Armed {
  std::mutex mutex;
  std::vector<std::pair<std::weak_ptr<BackwardWatcher>, std::unique_ptr<EngineHookLease>>> watchers;
};
Armed& armed() {
  static Armed* a = new Armed();  // leaked: watchers may outlive static destruction order
  return *a;
}

std::vector<std::shared_ptr<BackwardWatcher>> armed_watchers() {
  std::vector<std::shared_ptr<BackwardWatcher>> out;
  auto& a = armed();
  std::lock_guard<std::mutex> lock(a.mutex);
  for (auto& [w, lease] : a.watchers) {
    if (auto p = w.lock(); p && !p->done()) out.push_back(std::move(p));
  }
  return out;
}

// Pushes armed sessions on this thread for one backward (Note [Armed sessions]).
class ArmedScope {
 public:
  ArmedScope(const BackwardCall& call, std::vector<std::shared_ptr<BackwardWatcher>> ws) {
    for (auto& w : ws) {
      if (w->claim()) watchers_.push_back(std::move(w));
    }
    if (watchers_.empty()) return;
    auto& autograd_tls = c10::AutogradState::get_tls_state();
    prev_multithreading_ = autograd_tls.get_multithreading_enabled();
    autograd_tls.set_multithreading_enabled(false);
    for (auto& w : watchers_) {
      w->session().set_recording(false);
      push_session(&w->session());
      w->session().begin_backward({});
    }
    call.include_in_thread_locals(recording_key());
  }
  void finish(bool ok) {
    if (done_) return;
    done_ = true;
    for (auto& w : watchers_) {
      w->session().end_backward();
      w->session().set_recording(false);
      pop_session(&w->session());
    }
    if (!watchers_.empty()) c10::AutogradState::get_tls_state().set_multithreading_enabled(prev_multithreading_);
    // Finished before the claim goes: backward_finished writes the session (under the
    // capture's mutex), and a backward on another thread may claim it as soon as the claim
    // is released and write it too (set_recording above, without that mutex).
    for (auto& w : watchers_) {
      struct Release {
        BackwardWatcher& w;
        ~Release() { w.release_claim(); }
      } release{*w};
      w->backward_finished(ok);
    }
  }
  ~ArmedScope() { finish(false); }
  const std::vector<std::shared_ptr<BackwardWatcher>>& watchers() const { return watchers_; }

 private:
  std::vector<std::shared_ptr<BackwardWatcher>> watchers_;
  bool prev_multithreading_ = true;
  bool done_ = false;
};

}  // namespace

void arm_watcher(const std::shared_ptr<BackwardWatcher>& w) {
  auto lease = std::make_unique<EngineHookLease>(&capture_backward_driver);
  auto& a = armed();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.watchers.emplace_back(w, std::move(lease));
}

void disarm_watcher(const BackwardWatcher* w) {
  std::vector<std::unique_ptr<EngineHookLease>> leases;  // released after the lock
  auto& a = armed();
  std::lock_guard<std::mutex> lock(a.mutex);
  for (auto it = a.watchers.begin(); it != a.watchers.end();) {
    auto p = it->first.lock();
    if (!p || p.get() == w) {
      leases.push_back(std::move(it->second));
      it = a.watchers.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {
thread_local BackwardHandler* tls_handler = nullptr;
}  // namespace

BackwardHandlerScope::BackwardHandlerScope(BackwardHandler* h) : prev_(tls_handler) { tls_handler = h; }
BackwardHandlerScope::~BackwardHandlerScope() { tls_handler = prev_; }

variable_list capture_backward_driver(const BackwardCall& call) {
  std::vector<Session*> sessions;
  for (Session* s : thread_sessions()) {
    if (s->recording() && s->options().record_backward) sessions.push_back(s);
  }
  // Armed sessions follow plain backward() calls only: grad() and inputs= skip them.
  const bool plain = call.accumulate_grad && (call.outputs == nullptr || call.outputs->empty());
  auto watchers = plain ? armed_watchers() : std::vector<std::shared_ptr<BackwardWatcher>>{};
  if (sessions.empty() && watchers.empty()) {
    if (BackwardHandler* h = tls_handler) {
      BackwardHandlerScope not_reentrant(nullptr);  // a backward inside a hook runs plainly
      return h->handle(call);  // takes the graph lock as it needs it
    }
    GraphLock read(GraphLock::Mode::Read);
    return call.run();
  }
  if (tls_handler) {
    TCAP_LOG(CompiledAutograd, "compiled autograd: this backward runs eagerly: a capture on this thread is recording it");
  }
  // Hooks of every node reachable from the roots are wrapped below (Note [Backwards and
  // graph edits on several threads]).
  GraphLock edit(GraphLock::Mode::Edit);
  ArmedScope armed_scope(call, std::move(watchers));
  const auto root_grads = call.root_grads();
  // The innermost recording session that asked for opaque hooks decides which hooks stay
  // opaque (compile_step: the hooks registered on its parameters before the step).
  const HookWrapScope::SlotOf* slots = nullptr;
  for (auto it = sessions.rbegin(); it != sessions.rend() && !slots; ++it) slots = (*it)->opaque_hooks();
  HookWrapScope wrap(call.root, slots);
  for (Session* s : sessions) {
    if (call.roots) s->note_backward_roots(*call.roots, call.keep_graph());
    s->begin_backward(root_grads);
  }
  struct End {
    std::vector<Session*>& ss;
    ~End() {
      for (Session* s : ss) s->end_backward();
    }
  } end{sessions};
  auto out = call.run();
  armed_scope.finish(true);
  return out;
}

}  // namespace tcap::capture
