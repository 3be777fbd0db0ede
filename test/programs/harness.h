// The harness of the real-programs tier: one program, written once as ordinary LibTorch
// code, run from the same seed and initial weights eagerly and in each tcap mode, and
// everything a user would look at compared with eager.
//
// A program (a subclass of Program) owns its models, optimizers and data generator; its
// train_step(batch) is the code a user writes (zero_grad, forward, loss, backward, step)
// and calls the models' forwards through forward(i, x), which compile mode routes
// through tcap::compile. The modes:
//   capture            the step under tcap::CaptureGuard; the captured graph (forward,
//                      backward and optimizer update) replayed with tcap::interpret on
//                      copies of the step's inputs gives the step's losses and gradients
//   compile            each model's forward through tcap::compile; loss, backward and
//                      optimizer eager around it
//   compile_step       the whole step through tcap::compile_step
//   compiled_autograd  eager forward, each backward() under tcap::CompiledAutogradGuard
// Every mode but capture runs under StanceGuard(Default, error_on_fallback=true), so a
// silent fallback to eager throws, and must serve at least 80% of its calls from compiled
// graphs. Each run prints one line: program, mode, eager us/step, mode us/step, ratio.
#pragma once

#include "programs/program.h"

#include <tcap/capture.h>
#include <tcap/interpreter.h>
#include <tcap/stance.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace tcap::programs {

struct ModeSpec {
  Mode mode = Mode::Eager;
  std::string backend = "eager";
  std::string name() const;
};


struct RunResult {
  std::vector<Tensors> losses;                     // per step
  std::vector<std::vector<double>> host_logs;      // per step, sorted
  std::map<std::string, at::Tensor> params, grads, buffers;
  std::vector<at::Tensor> optimizer_state;         // per optimizer, per parameter, per field
  int served = 0;                                  // calls served by compiled graphs
  int calls = 0;
  double us_per_step = 0;                          // steady state: the second half of the steps
  int64_t kernel_launches = 0;                     // generated kernels that ran in the steady state
  std::vector<std::string> problems;               // capture replay mismatches
};

struct Tolerance {
  double rtol = 1e-4;
  double atol = 1e-5;
};

// Runs `steps` steps of a fresh program in one mode.
RunResult run_program(const ProgramFactory& make, const ModeSpec& mode, int steps);

// Runs eager and `mode`, compares everything, checks the 80% bar and prints the timing line.
// What every program file runs (each file's header says why its tolerance holds for it).
inline constexpr int kSteps = 20;
inline const Tolerance kTol{1e-4, 1e-5};

void check_program(const ProgramFactory& make, const ModeSpec& mode, int steps, Tolerance tol);


}  // namespace tcap::programs

// One TEST per mode for a program: name, factory, steps, tolerance.
#define TCAP_PROGRAM_TEST(suite, test, factory, steps, tol, ...) \
  TEST(suite, test) { ::tcap::programs::check_program(factory, ::tcap::programs::ModeSpec{__VA_ARGS__}, steps, tol); }
// The same, for a mode that hits a tcap limitation: skipped with the reason; the check
// stays, to run again once the limitation is lifted.
#define TCAP_PROGRAM_TEST_SKIPPED(suite, test, reason, factory, steps, tol, ...)                  \
  TEST(suite, test) {                                                                            \
    if (std::getenv("TCAP_PROGRAMS_RUN_SKIPPED") == nullptr) GTEST_SKIP() << reason;            \
    ::tcap::programs::check_program(factory, ::tcap::programs::ModeSpec{__VA_ARGS__}, steps, tol); \
  }
