// Backends of tcap::compile (and later compiled autograd): turn a forward or backward
// graph into an Executable.
//   eager  the interpreter (eager_backend)
//   llvm   fusion (fuse/fusion.h) + cpu_llvm kernels, other ops through the interpreter
//   auto   llvm for CPU graphs when LLVM is available, else eager (logged)
#pragma once

#include <tcap/compile.h>

#include <string>

namespace tcap {

// `what` names the graph in logs and dumps ("fn.0.forward"); `dump_dir` ("" = none)
// receives the fused graph and each kernel's kernel IR and LLVM IR.
Executable compile_with_backend(const std::string& backend, const ir::Graph& g, const std::string& what,
                                const std::string& dump_dir);

}  // namespace tcap
