// The backends a graph can be compiled with, and where its kernels run (Note [The backend
// table] in backends.cpp).
#pragma once

#include <tcap/compile.h>

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tcap {

namespace fuse {
struct FusedGroup;
}
namespace runtime {
struct FusedKernel;
}

// Makes a fused group's kernel: sets `fk.compiled` (Note [A backend's kernel object]), or
// leaves it Compiling for later (the llvm backend's `later`); throws c10::Error to leave
// the group's ops to ATen (the fusion pass logs why).
using KernelMaker = std::function<void(const fuse::FusedGroup& fg, runtime::FusedKernel& fk)>;

namespace compiler {

// Where a graph's kernels run, with Backend::Auto resolved: no kernels (the interpreter
// alone), or one backend's kernels on one device.
struct Target {
  Backend::Kind kind = Backend::Eager;  // Eager, Llvm or Cuda
  c10::Device device = c10::kCPU;
  bool fuses() const { return kind != Backend::Eager; }
};

// The target for graph `g` (named `what` in messages). Throws when a backend other than
// Auto cannot compile `g` here; Auto falls back to Eager, logged under graph_breaks.
Target choose_target(const Backend& backend, const ir::Graph& g, const std::string& what);

// Makes the kernels of a fusing target. With `later` (llvm only), a kernel that needs an
// LLVM compile is left Compiling, for compile_later() (Note [Kernels compiled in the
// background]) or compile_now() at the graph's first run (Note [Kernels compiled at their
// first run]).
KernelMaker kernel_maker(const Target& t, bool later = false);

// Whether kernels of graphs compiled with `o` for target `t` compile in the background:
// CompileOptions::compile_in_background or TCAP_COMPILE_IN_BACKGROUND, for the llvm target.
bool compiles_in_background(const CompileOptions& o, const Target& t);

// Compiles the kernels `kernels` left Compiling on the background compile thread, and
// makes them Ready together; `what` names the graph in logs; writes each one's LLVM IR to
// `ll_paths[i]` where not empty.
void compile_later(const std::string& what, const std::vector<std::shared_ptr<runtime::FusedKernel>>& kernels,
                   const std::vector<std::string>& ll_paths = {});

// Compiles the kernels `kernels` left Compiling, in parallel on the calling thread and
// helpers, and makes them Ready (a kernel that cannot compile runs its ATen ops, logged
// under graph_breaks); writes each one's LLVM IR to `ll_paths[i]` where not empty.
void compile_now(const std::string& what, const std::vector<std::shared_ptr<runtime::FusedKernel>>& kernels,
                 const std::vector<std::string>& ll_paths);

}  // namespace compiler
}  // namespace tcap
