// Backends of tcap::compile (and later compiled autograd): turn a forward or backward
// graph into an Executable.
//   eager  the interpreter (eager_backend)
//   llvm   fusion (fuse/fusion.h) + cpu_llvm kernels, other ops through the interpreter
//   auto   llvm for CPU graphs when LLVM is available, else eager (logged)
#pragma once

#include <tcap/compile.h>

#include <c10/core/Device.h>

#include <functional>
#include <string>

namespace tcap {

namespace fuse {
struct FusedGroup;
}
namespace runtime {
struct FusedKernel;
}

// Makes a fused group's kernel: fills `fk.cpu` or `fk.cuda`; throws c10::Error to leave
// the group's ops to ATen (the fusion pass logs why).
using KernelMaker = std::function<void(const fuse::FusedGroup& fg, runtime::FusedKernel& fk)>;

// The fusion pass for the tensors on `device`, each group's kernel made by `make_kernel`
// and registered for `tcap::fused` for the executable's lifetime; the other ops run as in
// eager_backend. What the llvm and cuda backends are (and the tests' CUDA host emulator).
Executable fused_backend(const ir::Graph& g, const std::string& what, const std::string& dump_dir,
                         const c10::Device& device, const KernelMaker& make_kernel);

// `what` names the graph in logs and dumps ("fn.0.forward"); `dump_dir` ("" = none)
// receives the fused graph and each kernel's kernel IR and LLVM IR.
Executable compile_with_backend(const std::string& backend, const ir::Graph& g, const std::string& what,
                                const std::string& dump_dir);

}  // namespace tcap
