// Verified calls of compile_step (verify mode; Note [Verifying a compiled step]).
#pragma once

#include "step/optimizers.h"
#include "step/step_inputs.h"
#include "cache/verify.h"
#include "capture/hooks.h"

#include <tcap/stance.h>

#include <functional>
#include <string>
#include <vector>

namespace tcap::step {

// One verified step: what it reads and how to run it both ways.
struct StepCheck {
  const StepInputs* g = nullptr;               // the call's gathered tensors (with names)
  std::vector<at::Tensor> primals;             // g->ts, then the held tensors
  std::vector<std::string> names;              // per primal
  std::vector<const OptimizerAdapter*> opts;
  // The compiled step; its opaque hooks take the tape's calls.
  std::function<std::vector<at::Tensor>(capture::HookTape* tape)> replay;
  std::function<std::vector<at::Tensor>()> eager;   // the step's own code
  std::vector<capture::HookTapeScope::LeafHook> hooks;  // the step's opaque hooks, by slot
  std::vector<std::string> hook_names;                  // per hook: its tensor's name
  cache::Tolerances tolerances;
  VerifyOptions options;
  cache::VerifyReport report;                  // who and the likely cause
};

// Runs the step eagerly, keeps what it produced, puts everything back as it was, runs the
// compiled step, compares, puts eager's results back and returns eager's outputs. A
// difference is reported per check.options.
std::vector<at::Tensor> verified_step(const StepCheck& check);

}  // namespace tcap::step
