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

}  // namespace tcap::capture
