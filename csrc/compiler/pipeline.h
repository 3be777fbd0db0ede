// The compiler, one stage a line (Note [The compile pipeline] in pipeline.cpp): what
// tcap::compile, compile_step and compiled autograd do with a graph once they have
// captured it.
//
//   compile_joint   joint graph -> partition -> forward / backward, each through compile_graph
//   compile_graph   graph -> the user's compiler, or: target -> fuse (decompose, group,
//                   lower to kernel IR, generate kernels) -> reuse buffers -> executable
//                   -> CUDA graphs
//
// Backends (CompileOptions::backend): "eager" (the interpreter, no kernels), "llvm"
// (fused CPU kernels, cpu_llvm), "cuda" (fused CUDA kernels, NVRTC), "auto" (cuda for
// CUDA graphs, llvm for CPU graphs where available, else eager, logged).
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

// A graph some of whose scalar arguments are set per call (compile_step's host scalars,
// Note [Host scalars of optimizers]): `scalars[k]` is the value of argument
// `args[k].second` of node `args[k].first`. Interpreted, since fused kernels would bake
// the scalars in; buffers are reused as in compile_graph. `host_values`, when given,
// receives the values the run read on the host, in node order (Interpreter::host_values).
using ScalarExecutable = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>, const std::vector<double>& scalars,
                                                               std::vector<c10::IValue>* host_values)>;
ScalarExecutable compile_graph_with_scalars(const ir::Graph& g, const std::vector<std::pair<ir::NodeId, size_t>>& args,
                                            const CompileOptions& options, const std::string& what,
                                            bool check_host_values = false);

}  // namespace compiler

// Makes a fused group's kernel: fills `fk.cpu` or `fk.cuda`; throws c10::Error to leave
// the group's ops to ATen (the fusion pass logs why).
using KernelMaker = std::function<void(const fuse::FusedGroup& fg, runtime::FusedKernel& fk)>;

// The fusion pass for the tensors on `device`, each group's kernel made by `make_kernel`
// and registered for `tcap::fused` for the executable's lifetime; the other ops run as in
// eager_backend. The llvm and cuda targets of compile_graph, and the tests' CUDA host
// emulator.
Executable fused_backend(const ir::Graph& g, const std::string& what, const std::string& dump_dir,
                         const c10::Device& device, const KernelMaker& make_kernel);

}  // namespace tcap
