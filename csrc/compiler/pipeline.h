// The compiler, one stage a line (Note [The compile pipeline] in pipeline.cpp): what
// tcap::compile, compile_step and compiled autograd do with a graph once they have
// captured it.
//
//   compile_joint   joint graph -> partition -> forward / backward, each through compile_graph
//   compile_graph   graph -> the user's compiler, or: target -> fuse (decompose, group,
//                   lower to kernel IR, generate kernels) -> reuse buffers -> executable
//                   -> CUDA graphs
//
// Backends (CompileOptions::backend, Note [The backend table] in backends.cpp): Eager (the
// interpreter, no kernels), Llvm (fused CPU kernels, cpu_llvm), Cuda (fused CUDA kernels,
// NVRTC), Auto (cuda for CUDA graphs, llvm for CPU graphs where available, else eager,
// logged).
#pragma once

#include "compiler/backends.h"  // KernelMaker, Target

#include <tcap/compile.h>

#include <string>

namespace tcap {
namespace compiler {

struct CompiledJoint {
  PartitionResult part;
  Executable forward;
  Executable backward;  // empty when the joint graph has no backward
};

// `name` prefixes the graphs' names in logs and dumps ("fn.0" -> "fn.0.forward").
// `check_host_values`: the forward checks its host-value guards inline (below).
CompiledJoint compile_joint(const JointGraph& joint, bool has_backward, const CompileOptions& options,
                            const std::string& name, bool check_host_values = false);

// `user` (a fw_compiler or bw_compiler), when set, replaces the backend. `what` names the
// graph in logs and dumps; kernels are dumped under CompileOptions::dump_dir (or
// $TCAP_DUMP_DIR). With `check_host_values` the executable compares every value it reads
// on the host with the recorded one and throws HostValueChanged at the first that
// differs (Interpreter::check_host_values; not with a user compiler).
Executable compile_graph(const ir::Graph& g, const CompileOptions& options, const std::string& what,
                         const GraphCompiler& user = nullptr, bool check_host_values = false);

// Note [GEMMs through oneDNN]: g with the float32 CPU products that measure faster
// through oneDNN routed there, as the llvm backend does after fusion (g itself when none
// is, or TCAP_ONEDNN_GEMMS=0); each decision logged under `fusion`, prefixed by `what`.
ir::Graph gemms_through_onednn(const ir::Graph& g, const std::string& what);
// Note [ReLU inside the product]: g with each ReLU that is the only reader of such a
// product inside it, as the llvm backend does before fusion.
ir::Graph relu_inside_gemms(const ir::Graph& g, const std::string& what);

// Note [Horizontal kernels]: g with each run of adjacent independent kernels launched as
// one, as the llvm backend does last (g itself when none is, or TCAP_HORIZONTAL_KERNELS=0).
ir::Graph horizontal_kernels(const ir::Graph& g, const std::string& what);

}  // namespace compiler

// The fusion pass for the tensors on `device`, each group's kernel made by `make_kernel`
// and owned by the executable (Note [A compiled graph owns its kernels]); the other ops
// run as in eager_backend. The llvm and cuda targets of compile_graph, and the tests' CUDA host
// emulator.
Executable fused_backend(const ir::Graph& g, const std::string& what, const std::string& dump_dir,
                         const c10::Device& device, const KernelMaker& make_kernel);

}  // namespace tcap
