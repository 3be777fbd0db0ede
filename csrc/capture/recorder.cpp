#include "capture/recorder.h"

#include "capture/session.h"
#include "capture/shape_rules.h"
#include "support/logging.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/flat_hash_map.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace tcap::capture {
namespace {

c10::DispatchKey g_key = c10::DispatchKey::Undefined;

// Everything the recorder keeps per thread, in one place: in a shared library each access
// to a thread_local is a call (__tls_get_addr), and the fallback runs per op.
struct ThreadState {
  std::vector<Session*> sessions;  // outermost first
  bool key_was_included = false;
  // Reused across ops, one per nested session: no per-op construction.
  std::vector<Session::Pending> pending;
  // Operator facts, keyed by the (stable) schema address: this thread's cache of the
  // process-wide registry.
  ska::flat_hash_map<const c10::FunctionSchema*, const OpInfo*> ops;
};

// A thread_local with a destructor is reached through an initialization check on every
// access; a plain pointer is not. The owner is touched once per thread.
thread_local ThreadState* tls_state = nullptr;

ThreadState& thread_state() {
  if (ThreadState* ts = tls_state) return *ts;
  struct Owner {
    ThreadState state;
    ~Owner() { tls_state = nullptr; }
  };
  thread_local Owner owner;
  tls_state = &owner.state;
  return owner.state;
}

// OpInfos live as long as the process: sessions keep pointers to them (Session::
// record_schema), and a session may outlive the thread that recorded into it.
const OpInfo& registered_op_info(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* registry = new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*registry)[&op.schema()];
  if (!slot) {
    slot = std::make_unique<OpInfo>(OpInfo::from(op));
    slot->id = static_cast<int>(registry->size()) - 1;  // the slot is already counted
  }
  return *slot;
}

const OpInfo& op_info(ThreadState& ts, const c10::OperatorHandle& op) {
  const OpInfo*& slot = ts.ops[&op.schema()];
  if (!slot) slot = &registered_op_info(op);
  return *slot;
}

// An op with a CompositeImplicitAutograd kernel may also have a kernel for the backend
// (silu_backward, mish_backward on CPU): then that kernel runs, and the op must be
// recorded like any other, since it calls no ATen op that could be recorded instead.
bool runs_backend_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet below) {
  const c10::DispatchKey k = c10::highestPriorityBackendTypeId(below);
  if (k != c10::DispatchKey::Undefined && op.hasKernelForDispatchKey(k)) return true;
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
}

void redispatch_hidden(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                       torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard hide(g_key);
  op.redispatchBoxed(below, stack);
}

void record_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                     torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, g_key);
  ThreadState& ts = thread_state();
  const auto& sessions = ts.sessions;
  // A thread can carry the key without a session (at::launch copies TLS): record nothing.
  const bool any = std::any_of(sessions.begin(), sessions.end(),
                               [](const Session* s) { return s->recording(); });
  if (!any) return redispatch_hidden(op, below, stack);
  const OpInfo& info = op_info(ts, op);
  if (info.composite_implicit && !runs_backend_kernel(op, below)) {
    // Its parts come back through the dispatcher with the key on and are recorded.
    op.redispatchBoxed(below, stack);
    return;
  }
  auto& pending = ts.pending;
  if (pending.size() < sessions.size()) pending.resize(sessions.size());
  for (size_t k = 0; k < sessions.size(); ++k) pending[k].reset();
  const auto args = torch::jit::last(*stack, info.num_arguments);
  for (size_t k = 0; k < sessions.size(); ++k) {
    if (sessions[k]->recording()) sessions[k]->before_op(info, args, pending[k]);
  }
  ShapeCheck shapes;  // Note [Output shapes that depend on values]
  {
    c10::impl::ExcludeDispatchKeyGuard hide(g_key);  // its meta tensors are not recorded
    shapes = before_op_shapes(info, args);
  }
  redispatch_hidden(op, below, stack);
  const auto rets = torch::jit::last(*stack, info.num_returns);
  for (size_t k = 0; k < sessions.size(); ++k) {
    if (pending[k].active) sessions[k]->after_op(info, rets, pending[k]);
  }
  if (shapes.probe) shapes.why = check_with_meta(op, info, shapes, rets, g_key);
  if (!shapes.why.empty()) {
    TCAP_LOG(Capture, "recorded " << info.qualified << ": " << shapes.why);
    for (size_t k = 0; k < sessions.size(); ++k) {
      if (pending[k].active) sessions[k]->note_unreplayable(shapes.why);
    }
  }
}

struct Registration {
  std::unique_ptr<torch::Library> lib;
  Registration() {
    auto& d = c10::Dispatcher::singleton();
    const c10::DispatchKey prefs[] = {c10::DispatchKey::Fake, c10::DispatchKey::DeferredInit,
                                      c10::DispatchKey::TESTING_ONLY_GenericMode};
    auto it = std::find_if(std::begin(prefs), std::end(prefs), [&](c10::DispatchKey k) {
      return !d.hasBackendFallbackForDispatchKey(k);
    });
    TORCH_CHECK(it != std::end(prefs),
                "tcap: cannot capture: the dispatch keys Fake, DeferredInit and "
                "TESTING_ONLY_GenericMode all have a fallback registered by another library "
                "(torchdistx?)");
    g_key = *it;
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", g_key, __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&record_fallback>());
    TCAP_LOG(Capture, "recording on dispatch key " << c10::toString(g_key));
  }
};

}  // namespace

c10::DispatchKey recording_key() {
  static Registration reg;
  return g_key;
}

void push_session(Session* s) {
  const c10::DispatchKey key = recording_key();
  ThreadState& ts = thread_state();
  if (ts.sessions.empty()) {
    ts.key_was_included = c10::impl::tls_is_dispatch_key_included(key);
    c10::impl::tls_set_dispatch_key_included(key, true);
  }
  ts.sessions.push_back(s);
}

void pop_session(Session* s) {
  ThreadState& ts = thread_state();
  auto it = std::find(ts.sessions.begin(), ts.sessions.end(), s);
  if (it == ts.sessions.end()) return;
  ts.sessions.erase(it);
  if (ts.sessions.empty()) {
    c10::impl::tls_set_dispatch_key_included(g_key, ts.key_was_included);
  }
}

const std::vector<Session*>& thread_sessions() { return thread_state().sessions; }

bool records_collectives() {
  const auto& sessions = thread_state().sessions;
  return !sessions.empty() && std::all_of(sessions.begin(), sessions.end(), [](const Session* s) {
           return s->recording() && s->records_collectives();
         });
}

MultithreadingOff::MultithreadingOff() : prev_(c10::AutogradState::get_tls_state().get_multithreading_enabled()) {
  c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
}

MultithreadingOff::~MultithreadingOff() { c10::AutogradState::get_tls_state().set_multithreading_enabled(prev_); }

RecordingScope::RecordingScope(Session* s) : s_(s) { push_session(s); }

RecordingScope::~RecordingScope() {
  s_->set_recording(false);
  pop_session(s_);
}

}  // namespace tcap::capture
