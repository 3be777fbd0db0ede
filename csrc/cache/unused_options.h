// Note [Options a front door does not use]
// One CompileOptions serves the three front doors, and not every field means something to
// each. A field a front door would ignore is refused when the front door is made (a
// c10::Error naming the field and what to do instead), never silently dropped:
// - tcap::compile: fused_optimizers (it runs no optimizer; compile_step does);
// - tcap::compile_step: bw_compiler (its step is one graph, forward, backward and update
//   together, compiled by fw_compiler when set), modules (its models are its first
//   argument);
// - compiled autograd: fw_compiler (there is no forward), fused_optimizers, modules (the
//   backward's leaves are whatever the graph reaches).
// A misspelt backend name is refused where it is written (tcap::Backend).
// The partitioner cannot be told apart from its default and is documented instead: only
// tcap::compile partitions (docs/compile.md).
#pragma once

#include <tcap/compile.h>

namespace tcap::cache {

enum class FrontDoor { Compile, CompileStep, CompiledAutograd };

// Throws c10::Error for the first field of `o` that `door` does not use.
void refuse_unused_options(const CompileOptions& o, FrontDoor door);

}  // namespace tcap::cache
