#include "cache/unused_options.h"

#include <c10/util/Exception.h>

namespace tcap::cache {

void refuse_unused_options(const CompileOptions& o, FrontDoor door) {
  // A misspelt backend name is refused where it is written (tcap::Backend).
  switch (door) {
    case FrontDoor::Compile:
      TORCH_CHECK(!o.fused_optimizers, "tcap::compile: CompileOptions::fused_optimizers is an option of "
                  "tcap::compile_step (tcap::compile runs no optimizer); unset it");
      return;
    case FrontDoor::CompileStep:
      TORCH_CHECK(!o.bw_compiler, "tcap::compile_step: CompileOptions::bw_compiler is not used: the step is one "
                  "graph (forward, backward and optimizer update together), run without autograd; set fw_compiler "
                  "to compile it");
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
