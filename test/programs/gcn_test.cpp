// A GCN trained full-batch on one fixed graph with a loss over its train mask
// (out.index({train_mask}): a size that comes from the mask's values), Adam.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same kernels as eager; the
// slack covers the matmuls' reductions and the fused LLVM kernels' rounding, carried through
// Adam.
#include "programs/gcn.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

const ProgramFactory kGcn = [] { return std::make_unique<gcn::GcnProgram>(); };

TCAP_PROGRAM_TEST(ProgramGcn, Capture, kGcn, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramGcn, Compile, kGcn, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramGcn, CompileLlvm, kGcn, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramGcn, CompileStep, kGcn, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramGcn, CompileStepLlvm, kGcn, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramGcn, CompiledAutograd, kGcn, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramGcn, CompiledAutogradLlvm, kGcn, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
