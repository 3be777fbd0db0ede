// Backward capture: the driver that the engine hook calls for every backward() while a
// capture is alive, and the hook wrappers that turn autograd hooks into call_hook nodes.
//
// Note [Hooks become call_hook nodes]
// Before the engine runs a captured backward, every hook reachable from the roots
// (tensor pre-hooks, retain_grad hooks, node pre- and post-hooks; a leaf's hooks are its
// AccumulateGrad node's tensor pre-hooks) is wrapped. The wrapper tells the sessions on
// this thread that a hook body starts (its ops are recorded with Node::hook set), calls
// the real hook, then records one CallHook node: inputs, the hook's results, and new
// values that later ops read, so the gradient visibly flows through the hook. The
// wrappers are removed again when the backward ends, also on error.
#pragma once

#include "capture/engine_shim.h"

namespace tcap::capture {

torch::autograd::variable_list capture_backward_driver(const BackwardCall& call);

}  // namespace tcap::capture
