// The dispatcher side of capture: the recording dispatch key, its boxed fallback, and the
// per-thread stack of active sessions.
//
// Note [Recording below autograd]
// tcap records on DispatchKey::Fake (DESIGN.md D1), a mode key below Autograd, Autocast
// and ADInplaceOrView and above BackendSelect, enabled per thread through the TLS
// included set. The fallback therefore sees the kernels that actually run: composite ops
// are already decomposed above it, autocast casts are explicit. Every op that reaches it
// is recorded and redispatched below the key with the key excluded, so calls made inside
// kernels stay hidden. Composite-implicit ops still reach it when autograd keys are
// excluded (InferenceMode); those are redispatched with the key on, so their parts are
// recorded instead. The key is chosen at first use (Fake, DeferredInit,
// TESTING_ONLY_GenericMode: the first with no backend fallback registered) and the
// registration is owned by a function-local static, so nothing runs at load time.
#pragma once

#include <c10/core/DispatchKey.h>

#include <vector>

namespace tcap::capture {

class Session;

// Installs the fallback on first call; throws if every candidate key is taken.
c10::DispatchKey recording_key();

// Sessions alive on this thread, outermost first. Pushing the first session turns the
// recording key on for this thread; popping the last restores the thread's prior state.
void push_session(Session* s);
void pop_session(Session* s);
const std::vector<Session*>& thread_sessions();
// Whether sessions are alive on this thread and every one of them records collectives
// (Session::set_records_collectives; Note [Recorded post-accumulate-grad hooks]).
bool records_collectives();

// Turns autograd's worker threads off on this thread for a scope, so that the engine runs
// every node on the calling thread, where the sessions are (DESIGN.md D2).
class MultithreadingOff {
 public:
  MultithreadingOff();
  ~MultithreadingOff();
  MultithreadingOff(const MultithreadingOff&) = delete;
  MultithreadingOff& operator=(const MultithreadingOff&) = delete;

 private:
  bool prev_;
};

// Records into `s` on this thread for a scope, autograd threads off; on exit the session
// stops recording and is popped, then the thread's autograd setting is restored.
class RecordingScope {
 public:
  explicit RecordingScope(Session* s);
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;

 private:
  MultithreadingOff single_threaded_;
  Session* s_;
};

}  // namespace tcap::capture
