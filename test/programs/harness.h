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

#include <tcap/capture.h>
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/interpreter.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tcap::programs {

using Tensors = std::vector<at::Tensor>;
using Forward = std::function<at::Tensor(const at::Tensor&)>;

enum class Mode { Eager, Capture, Compile, CompileStep, CompiledAutograd };

struct ModeSpec {
  Mode mode = Mode::Eager;
  std::string backend = "eager";
  std::string name() const;
};

class Program {
 public:
  virtual ~Program() = default;
  virtual std::string name() const = 0;
  // The models (parameters and buffers compared; compile_step's models) and optimizers.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> modules() = 0;
  virtual std::vector<torch::optim::Optimizer*> optimizers() = 0;
  // The batch of a step: the same tensors for every run (a generator seeded per step).
  virtual Tensors batch(int step) = 0;
  // Host-side work before a step (a learning-rate schedule).
  virtual void before_step(int /*step*/) {}
  // The training step: returns the losses (scalar tensors).
  virtual Tensors train_step(const Tensors& batch) = 0;
  // Compile mode: route forward(i, .) through tcap::compile; returns the compiled functions.
  virtual std::vector<std::shared_ptr<CompiledFunction>> compile_forwards(const CompileOptions& options) = 0;
  // The part of a parameter compared with eager (all of it unless a program says why not).
  virtual at::Tensor comparable(const std::string& /*name*/, const at::Tensor& param) { return param; }
  // Options a program needs for compile_step (observe_host_values, with its reason).
  virtual void adjust_step_options(CompileOptions& /*options*/) {}

  // Host-side side effects of a step (gradient norms logged by hooks, clip_grad_norm_'s
  // result): compared with eager as a multiset per step.
  std::vector<double> host_log;

 protected:
  at::Tensor forward(size_t i, const at::Tensor& x) { return forwards_.at(i)(x); }
  std::vector<Forward> forwards_;
};

// Declared as a program's first member: seeds LibTorch before its models are built, so
// every run starts from the same initial weights.
struct Seed {
  explicit Seed(uint64_t seed) { torch::manual_seed(seed); }
};

using ProgramFactory = std::function<std::unique_ptr<Program>()>;

struct RunResult {
  std::vector<Tensors> losses;                     // per step
  std::vector<std::vector<double>> host_logs;      // per step, sorted
  std::map<std::string, at::Tensor> params, grads, buffers;
  std::vector<at::Tensor> optimizer_state;         // per optimizer, per parameter, per field
  int served = 0;                                  // calls served by compiled graphs
  int calls = 0;
  double us_per_step = 0;                          // steady state: the second half of the steps
  std::vector<std::string> problems;               // capture replay mismatches
};

struct Tolerance {
  double rtol = 1e-4;
  double atol = 1e-5;
};

// Runs `steps` steps of a fresh program in one mode.
RunResult run_program(const ProgramFactory& make, const ModeSpec& mode, int steps);

// Runs eager and `mode`, compares everything, checks the 80% bar and prints the timing line.
void check_program(const ProgramFactory& make, const ModeSpec& mode, int steps, Tolerance tol);

// A generator seeded for one step of one program.
at::Generator step_generator(uint64_t program_seed, int step);

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
