// An LSTM language model (the word_language_model example's shape): Embedding, a
// two-layer nn::LSTM, a Linear decoder and cross_entropy over the next token, trained with
// Adam.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same kernels as eager; the
// slack covers the matmuls' reductions (thread split) and the fused LLVM kernels'
// rounding of the gates, carried through Adam.
#include "programs/lstm_lm.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace lstm;
const ProgramFactory kLstm = [] { return std::make_unique<LstmProgram>(); };

TCAP_PROGRAM_TEST(ProgramLstm, Capture, kLstm, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramLstm, Compile, kLstm, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramLstm, CompileLlvm, kLstm, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramLstm, CompileStep, kLstm, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramLstm, CompileStepLlvm, kLstm, kSteps, kTol, Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramLstm, CompiledAutograd, kLstm, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramLstm, CompiledAutogradLlvm, kLstm, kSteps, kTol, Mode::CompiledAutograd, "llvm")

}  // namespace
}  // namespace tcap::programs
