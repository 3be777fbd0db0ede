// A small transformer language model: token Embedding plus a learned positional
// Embedding, two nn::TransformerEncoderLayer (nn::MultiheadAttention inside, dropout 0)
// under a causal mask, a Linear head and cross_entropy, trained with AdamW. Hooks on
// every parameter log the gradient's norm on the host (g.norm().item<double>()), as a
// training loop that watches its gradients does; the logged norms are compared with
// eager's as a multiset per step (the engine may run the leaves' hooks in another order).
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 over 20 steps: the same kernels as eager; the
// slack covers the matmuls' and softmax's reductions (thread split) and the fused LLVM
// kernels' rounding, carried through AdamW. One exception: the key third of each
// attention's in_proj_bias is left out of the parameter comparison (its .grad and AdamW
// state are still compared). Softmax is invariant to a shift that is the same for every
// key, so that bias's true gradient is exactly zero and its computed .grad is rounding
// noise (~1e-9); AdamW divides by the root of that noise squared, so each step moves it by
// about +-lr in a direction the noise picks, and any other rounding (the fused kernels)
// picks other directions: up to 2 * lr * steps apart with nothing wrong.
#include "programs/transformer_lm.h"

#include "programs/harness.h"

namespace tcap::programs {
namespace {

using namespace transformer;
const ProgramFactory kTransformer = [] { return std::make_unique<TransformerProgram>(); };

TCAP_PROGRAM_TEST(ProgramTransformer, Capture, kTransformer, kSteps, kTol, Mode::Capture)
TCAP_PROGRAM_TEST(ProgramTransformer, Compile, kTransformer, kSteps, kTol, Mode::Compile)
TCAP_PROGRAM_TEST(ProgramTransformer, CompileLlvm, kTransformer, kSteps, kTol, Mode::Compile, "llvm")
TCAP_PROGRAM_TEST(ProgramTransformer, CompileStep, kTransformer, kSteps, kTol, Mode::CompileStep)
TCAP_PROGRAM_TEST(ProgramTransformer, CompileStepLlvm, kTransformer, kSteps, kTol,
                  Mode::CompileStep, "llvm")
TCAP_PROGRAM_TEST(ProgramTransformer, CompiledAutograd, kTransformer, kSteps, kTol, Mode::CompiledAutograd)
TCAP_PROGRAM_TEST(ProgramTransformer, CompiledAutogradLlvm, kTransformer, kSteps, kTol, Mode::CompiledAutograd,
                  "llvm")

}  // namespace
}  // namespace tcap::programs
