// A DCGAN-style pair (pytorch/examples cpp/dcgan): a generator of ConvTranspose2d +
// BatchNorm2d + ReLU ending in Tanh, a discriminator of Conv2d + LeakyReLU(0.2) (+
// BatchNorm2d), two Adams with betas (0.5, 0.999), BCE-with-logits losses; the
// discriminator trained on real images and fake.detach(), then the generator through the
// discriminator: ONE step per iteration (compile_step takes both models and optimizers).
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same kernels as eager; the
// slack covers the convolutions' and BatchNorm's reductions (thread split) and the fused
// LLVM kernels' rounding, carried through two Adams.
#include "programs/gan.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace gan;
const ProgramFactory kGan = [] { return std::make_unique<Gan>(); };

TCAP_PROGRAM_TEST(ProgramGan, Capture, kGan, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramGan, Compile, kGan, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramGan, CompileLlvm, kGan, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramGan, CompileStep, kGan, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramGan, CompileStepLlvm, kGan, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramGan, CompiledAutograd, kGan, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramGan, CompiledAutogradLlvm, kGan, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
