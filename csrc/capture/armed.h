// Sessions that wait for a backward() called outside any capture (tcap::compile's first
// call records its forward, returns eager outputs, and records the backward of that
// region when the user runs it).
//
// Note [Armed sessions]
// While a watcher is armed, the engine hook is installed. For every plain backward() (not
// grad(), no inputs=) the driver pushes each armed session on the calling thread with
// recording off, puts the recording key into the graph task's thread-local snapshot (the
// engine restores that snapshot around every node), and runs the task. The watcher's own
// observer hooks turn recording on when the region's backward starts. After the task ends
// (normally or by an exception) backward_finished() is called once. A watcher is pushed by
// one backward at a time (claim()): two threads' backwards never record into one session
// at once. Observers act only in a backward that pushed their session on its own thread
// (Session::is_on_this_thread), so a grad() call, which pushes no armed session, leaves
// a waiting capture for the next plain backward().
#pragma once

#include "capture/engine_shim.h"

#include <torch/csrc/autograd/function_hook.h>

#include <atomic>
#include <memory>

namespace tcap::capture {

class Session;

class BackwardWatcher {
 public:
  virtual ~BackwardWatcher() = default;
  // One backward at a time pushes a watcher's session (see Note [Armed sessions]): a
  // backward on another thread at the same moment leaves it alone. True if this caller
  // now holds it.
  bool claim() {
    bool expected = false;
    return claimed_.compare_exchange_strong(expected, true);
  }
  void release_claim() { claimed_.store(false); }
  virtual Session& session() = 0;
  // After a backward() the session was pushed for; `ok` is false if it threw.
  virtual void backward_finished(bool ok) = 0;
  // A watcher that is done is skipped; disarm it later, outside any backward (removing
  // the engine hook from inside a backward is not allowed).
  virtual bool done() const = 0;

 private:
  std::atomic<bool> claimed_{false};
};

void arm_watcher(const std::shared_ptr<BackwardWatcher>& w);
// Not from inside a backward (see done()).
void disarm_watcher(const BackwardWatcher* w);

// Hooks tcap attaches itself: never wrapped into call_hook nodes.
struct ObserverPreHook : torch::autograd::FunctionPreHook {};
struct ObserverPostHook : torch::autograd::FunctionPostHook {};

}  // namespace tcap::capture
