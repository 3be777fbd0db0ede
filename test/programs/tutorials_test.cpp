// The seed tutorials' scenarios as small training programs:
//   - the Dynamo / AOTAutograd tutorials' MLP: Linear(10, 5), ReLU, Linear(5, 2), Softmax,
//     mse_loss against a target, SGD;
//   - the AOTAutograd tutorial's cos(cos(a + b + c + d)): b, c, d are parameters, a the
//     batch, the sum as loss, SGD;
//   - the compiled-autograd tutorial's Linear(10, 10) with loss = model(x).sum(), where x
//     requires grad and carries a tensor hook (grad + 10); x.grad is returned by the step.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same kernels as eager; the
// slack covers the fused LLVM kernels' rounding of cos and softmax.
#include "programs/tutorials.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace tutorials;

const ProgramFactory kMlp = [] { return std::make_unique<TutorialMlp>(); };
const ProgramFactory kCosCos = [] { return std::make_unique<TutorialCosCos>(); };
const ProgramFactory kHook = [] { return std::make_unique<TutorialHook>(); };

TCAP_PROGRAM_TEST(ProgramTutorialMlp, Capture, kMlp, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramTutorialMlp, Compile, kMlp, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramTutorialMlp, CompileLlvm, kMlp, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramTutorialMlp, CompileStep, kMlp, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramTutorialMlp, CompileStepLlvm, kMlp, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramTutorialMlp, CompiledAutograd, kMlp, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramTutorialMlp, CompiledAutogradLlvm, kMlp, kSteps, kTol, Mode::CompiledAutograd, "llvm")

TCAP_PROGRAM_TEST(ProgramTutorialCosCos, Capture, kCosCos, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramTutorialCosCos, Compile, kCosCos, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramTutorialCosCos, CompileLlvm, kCosCos, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramTutorialCosCos, CompileStep, kCosCos, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramTutorialCosCos, CompileStepLlvm, kCosCos, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramTutorialCosCos, CompiledAutograd, kCosCos, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramTutorialCosCos, CompiledAutogradLlvm, kCosCos, kSteps, kTol, Mode::CompiledAutograd, "llvm")

TCAP_PROGRAM_TEST(ProgramTutorialHook, Capture, kHook, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramTutorialHook, Compile, kHook, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramTutorialHook, CompileLlvm, kHook, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramTutorialHook, CompileStep, kHook, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramTutorialHook, CompileStepLlvm, kHook, kSteps, kTol, Mode::CompileStep,
                  "llvm")
TCAP_PROGRAM_TEST(ProgramTutorialHook, CompiledAutograd, kHook, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramTutorialHook, CompiledAutogradLlvm, kHook, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
