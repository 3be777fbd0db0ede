#include "cache/unused_options.h"

#include <c10/util/Exception.h>

namespace tcap::cache {

void refuse_unused_options(const CompileOptions& o, FrontDoor door) {
  const char* who = door == FrontDoor::Compile       ? "tcap::compile"
                    : door == FrontDoor::CompileStep ? "tcap::compile_step"
                                                     : "tcap compiled autograd";
  // Checked here, not at the first compile: a misspelt backend would otherwise surface
  // only after a capture, as a compile error.
  TORCH_CHECK(o.backend == "eager" || o.backend == "llvm" || o.backend == "cuda" || o.backend == "auto", who,
              ": unknown backend '", o.backend, "' (eager, llvm, cuda or auto)");
  switch (door) {
    case FrontDoor::Compile:
      TORCH_CHECK(!o.fused_optimizers, "tcap::compile: CompileOptions::fused_optimizers is an option of "
                  "tcap::compile_step (tcap::compile runs no optimizer); unset it");
      return;
    case FrontDoor::CompileStep:
      TORCH_CHECK(!o.fw_compiler && !o.bw_compiler, "tcap::compile_step: CompileOptions::",
                  o.fw_compiler ? "fw_compiler" : "bw_compiler", " is not supported: the step is one graph whose "
                  "per-call scalars are patched in, which a user's compiler cannot take yet; choose a backend, or "
                  "compile the forward with tcap::compile");
      TORCH_CHECK(!o.cuda_graphs, "tcap::compile_step: CompileOptions::cuda_graphs is not supported yet; "
                  "tcap::compile replays compiled regions as CUDA graphs");
      TORCH_CHECK(o.modules.empty(), "tcap::compile_step: CompileOptions::modules is not used; the step's models "
                  "are compile_step's first argument");
      return;
    case FrontDoor::CompiledAutograd:
      TORCH_CHECK(!o.fw_compiler, "tcap compiled autograd: CompileOptions::fw_compiler is not used (a backward has "
                  "no forward graph); set bw_compiler");
      TORCH_CHECK(!o.fused_optimizers, "tcap compiled autograd: CompileOptions::fused_optimizers is an option of "
                  "tcap::compile_step; unset it");
      TORCH_CHECK(o.modules.empty(), "tcap compiled autograd: CompileOptions::modules is not used (the backward "
                  "reaches its leaves through the graph); unset it");
      return;
  }
}

}  // namespace tcap::cache
