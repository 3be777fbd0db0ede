// The overhead programs (programs/overhead.h): the seed MLP with Adam at batch 1, and an
// Adam step over 100 small parameters, in every mode against eager.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same ATen kernels as eager
// in the eager backend; the slack covers the fused LLVM kernels' rounding (softmax, Adam's
// sqrt and division), carried through Adam's moments.
#include "programs/overhead.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace overhead;

const ProgramFactory kMlpAdam = [] { return mlp_small_adam(); };
const ProgramFactory kAdam100 = [] { return std::make_unique<Adam100>(); };

TCAP_PROGRAM_TEST(ProgramMlpSmallAdam, Compile, kMlpAdam, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramMlpSmallAdam, CompileStep, kMlpAdam, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramMlpSmallAdam, CompileStepLlvm, kMlpAdam, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramAdam100, CompileStep, kAdam100, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramAdam100, CompileStepLlvm, kAdam100, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramAdam100, CompiledAutograd, kAdam100, kSteps, kTol, Mode::CompiledAutograd)

}  // namespace
}  // namespace tcap::programs
