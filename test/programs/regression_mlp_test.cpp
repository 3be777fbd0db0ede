// A regression MLP (Linear + ReLU x2, Linear, mse_loss) trained with SGD + momentum under
// a hand-written learning-rate schedule (linear warm-up over 5 steps, then exponential
// decay, set on every param group before every step), with
// torch::nn::utils::clip_grad_norm_ between backward() and step(). The norm it returns is
// logged (compared with eager per step); a second variant ignores it, as most programs do.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same kernels as eager; the
// slack covers the matmuls' reductions (thread split) and the fused LLVM kernels'
// rounding, carried through momentum.
#include "programs/regression_mlp.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace regression;
const ProgramFactory kRegression = [] { return std::make_unique<RegressionMlp>(/*log_norm=*/true); };
const ProgramFactory kRegressionNoLog = [] { return std::make_unique<RegressionMlp>(/*log_norm=*/false); };

TCAP_PROGRAM_TEST(ProgramRegression, Capture, kRegression, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramRegression, Compile, kRegression, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramRegression, CompileLlvm, kRegression, kSteps, kTol, Mode::Compile, "llvm")
// A replayed compile_step runs the graph, not the step's C++ code: the norm is observed
// (observe_host_values) and the program logs it from CompiledStep::last_call() on replays.
TCAP_PROGRAM_TEST(ProgramRegression, CompileStep, kRegression, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramRegression, CompileStepLlvm, kRegression, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramRegressionNoLog, CompileStep, kRegressionNoLog, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramRegressionNoLog, CompileStepLlvm, kRegressionNoLog, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramRegression, CompiledAutograd, kRegression, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramRegression, CompiledAutogradLlvm, kRegression, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
