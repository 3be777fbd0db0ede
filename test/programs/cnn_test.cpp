// An MNIST-style CNN (pytorch/examples cpp/mnist): two Conv2d + BatchNorm2d + ReLU +
// max_pool2d blocks, Dropout (p = 0, so results stay checkable), two Linear layers,
// log_softmax + nll_loss, trained with SGD with momentum on random 16x16 images, in every
// mode against eager.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps. The compiled graphs run the
// same ATen kernels as eager; the slack covers reductions (BatchNorm statistics, the
// convolution's weight gradient) whose order depends on the thread split, and the fused
// LLVM kernels' different rounding of pointwise chains, carried through momentum.
#include "programs/cnn.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace cnn;
const ProgramFactory kCnn = [] { return std::make_unique<Cnn>(); };

TCAP_PROGRAM_TEST(ProgramCnn, Capture, kCnn, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramCnn, Compile, kCnn, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramCnn, CompileLlvm, kCnn, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramCnn, CompileStep, kCnn, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramCnn, CompileStepLlvm, kCnn, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramCnn, CompiledAutograd, kCnn, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramCnn, CompiledAutogradLlvm, kCnn, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
