// A small U-Net denoiser (residual Conv2d/GroupNorm/SiLU blocks, a strided convolution down,
// nearest upsampling and a concatenated skip up), mse_loss, AdamW, in every mode against
// eager.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the convolutions are ATen's in
// every mode; the group norms' sums run in another order in the llvm kernels (Note [Group
// norm as kernels]); AdamW carries the rounding.
#include "programs/unet.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

const ProgramFactory kUNet = [] { return std::make_unique<unet::UNetProgram>(); };

TCAP_PROGRAM_TEST(ProgramUNet, Capture, kUNet, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramUNet, Compile, kUNet, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramUNet, CompileLlvm, kUNet, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramUNet, CompileStep, kUNet, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramUNet, CompileStepLlvm, kUNet, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramUNet, CompiledAutograd, kUNet, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramUNet, CompiledAutogradLlvm, kUNet, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
