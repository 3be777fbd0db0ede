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
// (normally or by an exception) backward_finished() is called once.
#pragma once

#include "capture/engine_shim.h"

#include <torch/csrc/autograd/function_hook.h>

#include <memory>

namespace tcap::capture {

class Session;

class BackwardWatcher {
 public:
  virtual ~BackwardWatcher() = default;
  virtual Session& session() = 0;
  // After a backward() the session was pushed for; `ok` is false if it threw.
  virtual void backward_finished(bool ok) = 0;
  // A watcher that is done is skipped; disarm it later, outside any backward (removing
  // the engine hook from inside a backward is not allowed).
  virtual bool done() const = 0;
};

void arm_watcher(const std::shared_ptr<BackwardWatcher>& w);
// Not from inside a backward (see done()).
void disarm_watcher(const BackwardWatcher* w);

// Hooks tcap attaches itself: never wrapped into call_hook nodes.
struct ObserverPreHook : torch::autograd::FunctionPreHook {};
struct ObserverPostHook : torch::autograd::FunctionPostHook {};

}  // namespace tcap::capture
