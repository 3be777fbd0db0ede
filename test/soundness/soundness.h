// The state-change tier (docs/reliability.md, "State changes"): ordinary programs that
// change state between calls of a compiled function, step or backward. Each case runs a
// model compiled one way and its eager twin (the same weights, the same random numbers)
// call by call, changes the same state in both in the middle, and asserts that every call
// gives eager's answer: a guard recaptures, or tcap runs eagerly and says so, never a stale
// replay. The modes: tcap::compile of the module, tcap::compile of a function given the
// module through CompileOptions::modules, compile_step, compiled autograd; each with the
// eager and llvm backends.
//
// Tolerances: eager backend rtol 1e-5 atol 1e-6 (the same kernels; the slack covers ATen's
// own thread split), llvm rtol 1e-4 atol 1e-5 (generated kernels round differently).
#pragma once

#include <tcap/tcap.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/models.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tcap::soundness {

namespace nn = torch::nn;
using Tensors = std::vector<at::Tensor>;

// A model under test: a module with one tensor in, one out.
struct Net : nn::Module {
  virtual at::Tensor run(const at::Tensor& x) = 0;
};

enum class Mode { Compile, CompileFn, CompileStep, CompiledAutograd };
inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Compile: return "Compile";
    case Mode::CompileFn: return "CompileFn";
    case Mode::CompileStep: return "CompileStep";
    case Mode::CompiledAutograd: return "CompiledAutograd";
  }
  return "?";
}

struct Tol {
  double rtol, atol;
};
inline Tol tolerance(const std::string& backend) { return backend == "eager" ? Tol{1e-5, 1e-6} : Tol{1e-4, 1e-5}; }

// Runs one training call of `net` in `mode` (compiled) or eagerly (its twin), the same
// way: forward, mse loss against y, backward, and for CompileStep an SGD step.
class Runner {
 public:
  Runner(Mode mode, std::shared_ptr<Net> net, std::string backend, bool compiled);
  // The loss, after backward (and the optimizer step in CompileStep mode).
  at::Tensor call(const at::Tensor& x, const at::Tensor& y);
  // How many times tcap captured (so a test can see a change was noticed).
  int captures() const;
  CompileOptions options;

 private:
  Mode mode_;
  std::shared_ptr<Net> net_;
  bool compiled_;
  std::unique_ptr<torch::optim::SGD> opt_;
  std::shared_ptr<CompiledFunction> fn_;
  std::shared_ptr<CompiledStep> step_;
  at::Tensor step_body(const at::Tensor& x, const at::Tensor& y);
};

// Compares every parameter, its .grad and every buffer of two nets.
::testing::AssertionResult same_state(Net& a, Net& b, Tol tol);

}  // namespace tcap::soundness
