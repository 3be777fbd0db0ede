// Verified calls of compile_step (verify mode; Note [Verifying a compiled step]).
#pragma once

#include "step/optimizers.h"
#include "step/step_inputs.h"
#include "cache/verify.h"

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
  std::function<std::vector<at::Tensor>()> replay;  // the compiled step
  std::function<std::vector<at::Tensor>()> eager;   // the step's own code
  cache::Tolerances tolerances;
  VerifyOptions options;
  cache::VerifyReport report;                  // who and the likely cause
};

// Runs the compiled step, keeps what it produced, puts everything back as it was, runs the
// step eagerly, compares, and returns eager's outputs (eager's state stays). A difference
// is reported per check.options.
std::vector<at::Tensor> verified_step(const StepCheck& check);

}  // namespace tcap::step
