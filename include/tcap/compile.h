// tcap::compile: capture a function's forward and backward once, partition them, and
// replay them on later calls through a torch::autograd::Function (the AOTAutograd of tcap).
//
//   auto f = tcap::compile([](const std::vector<at::Tensor>& in) {
//     return std::vector<at::Tensor>{torch::cos(torch::cos(in[0] + in[1]))};
//   });
//   auto y = (*f)({a, b})[0];         // 1st call: runs eagerly and records the forward
//   y.sum().backward();               // ... and this backward; then compiles the region
//   auto y2 = (*f)({a, b})[0];        // later calls: guards checked, compiled replay
//
//   auto m = tcap::compile(model);    // a module: parameters and buffers are inputs
//   auto out = m->forward(x);
//
// What cannot be compiled runs eagerly and says why (TCAP_LOGS=graph_breaks); each
// recompile says why (TCAP_LOGS=recompiles). See docs/compile.md.
//
// The contract (docs/compile.md, "What a replay re-reads and what it freezes"): a replay
// re-reads the inputs, the modules it was given (parameters, buffers, tree, training
// flags, options), the tensors it read from outside its inputs (their current contents)
// and global autograd/ATen state, and guards every value read on the host. Host values and
// tensor variables the function reaches through its closure, a module's own members, and
// the flags and options of modules it was not given are frozen at capture, as JAX's jit
// freezes Python state. TCAP_VERIFY=1 checks every replay against eager.
#pragma once

#include <tcap/graph.h>
#include <tcap/partition.h>
#include <tcap/stance.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace tcap {

// A compiled graph: takes the graph's inputs in order, returns its outputs in order. The
// inputs are taken by value: a caller that moves them in (compiled autograd, after the
// autograd graph released its saved tensors) lets the built-in backends free each input
// after its last use, as the engine frees a node's saved tensors once the node has run.
using Executable = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)>;
// Turns a forward or backward graph into an Executable (aot_function's fw_compiler /
// bw_compiler). The graph may be rewritten freely as long as its inputs and outputs keep
// their meaning.
using GraphCompiler = std::function<Executable(const ir::Graph&)>;

// The built-in backend that runs a graph through the dispatcher (tcap::Interpreter).
Executable eager_backend(const ir::Graph& g);
// Fuses pointwise ops and reductions into kernels generated with LLVM (docs/fusion.md);
// everything else runs as in eager_backend. Throws if LLVM is unavailable.
Executable llvm_backend(const ir::Graph& g);

struct CompileOptions {
  std::string name = "fn";                   // used in logs and dump file names
  // "eager" (the interpreter), "llvm" (fused CPU kernels), "cuda" (fused CUDA kernels
  // through NVRTC, for graphs on one CUDA device), "auto" (cuda for CUDA graphs and llvm
  // for CPU graphs where available, else eager, logged).
  std::string backend = "eager";
  Partitioner partitioner = Partitioner::MinCut;
  GraphCompiler fw_compiler;                 // overrides the backend for forward graphs
  GraphCompiler bw_compiler;                 // overrides the backend for backward graphs
  int cache_size_limit = 8;                  // compiled entries; then the function stays eager
  bool dynamic = true;                       // mark dims that change as dynamic (see docs)
  std::string dump_dir;                      // write joint/forward/backward graphs here (JSON)
  // Replay each compiled graph on a CUDA device as a CUDA graph after a warm-up call, for
  // launch-bound models (Note [CUDA graphs of compiled regions]; docs/codegen-cuda.md).
  // Graphs that cannot be (hooks, in-place writes to inputs, host reads, explicit generators,
  // CPU tensors) run as usual, logged under graph_breaks. Outputs are copies.
  bool cuda_graphs = false;
  // A value read on the host (item(), equal(), is_nonzero()) is a guard: a call where it
  // differs recaptures, since host code may branch on it. With observe_host_values, a
  // value that changes between two captures which record the same graph otherwise is
  // taken as read for the host's own use (a logged loss.item(), the norm clip_grad_norm_
  // returns): the newer entry stops guarding it and replaces the older one (logged under
  // recompiles). This is a promise by the program: host code that branches on such a
  // value at other values than the two seen would not be noticed (docs/limitations.md).
  bool observe_host_values = false;
  // compile_step: run each optimizer's update of all its parameters as one multi-tensor
  // ATen call (_fused_adam_, _fused_adamw_, _fused_sgd_) instead of the per-parameter ops
  // torch::optim records: Python's fused=True, and opt-in for the same reason. Results
  // agree with eager to rounding, not bitwise, and Adam amplifies rounding where a
  // gradient is near zero (a bias before BatchNorm), so a run drifts from eager's; off,
  // the recorded ops replay eager's bits (Note [Fused optimizer steps]).
  bool fused_optimizers = false;
  // tcap::compile(fn, options): the modules fn uses. Their parameters and buffers become
  // inputs of every graph (an optimizer's in-place update needs no recompile), and their
  // tree, training flags and options are guarded, as tcap::compile(module) does for its
  // module (Note [Module state guards]). A module fn reaches without being named here is
  // part of its closure: its tensors are held and watched, its flags and options frozen
  // (docs/compile.md, "What a replay re-reads and what it freezes").
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  // Verify mode for this function, step or backward (include/tcap/stance.h); unset: the
  // thread's (StanceGuard), else the process's (TCAP_VERIFY).
  std::optional<VerifyOptions> verify;
};

struct CompileStats {
  int captures = 0;        // calls that ran eagerly while recording
  int compiles = 0;        // entries built
  int replays = 0;         // calls served by a compiled entry
  int eager_calls = 0;     // calls run eagerly (pending backward, fallback, cache limit)
  int recompiles = 0;      // guard misses that led to a new capture
  int backward_fallbacks = 0;  // compiled backwards that ran the eager recompute instead
  int verified = 0;    // replays checked against eager (verify mode)
};

// One compiled entry, for inspection (tests, benchmarks, tools).
struct CompiledEntryInfo {
  JointGraph joint;
  PartitionResult partition;
  std::vector<std::string> guards;  // readable guards ("x: f32[4, 10] stride [10, 1] ...")
  double compile_ms = 0;
};

class CompiledFunction {
 public:
  using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
  struct Impl;
  explicit CompiledFunction(std::unique_ptr<Impl> impl);
  ~CompiledFunction();

  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);
  // For single-input single-output functions and modules.
  at::Tensor forward(const at::Tensor& x);

  CompileStats stats() const;
  std::vector<CompiledEntryInfo> entries() const;
  // Why the function runs eagerly now ("" if it does not).
  std::string eager_reason() const;

 private:
  friend std::shared_ptr<CompiledFunction> compile(std::shared_ptr<torch::nn::Module>, Fn, CompileOptions);
  std::unique_ptr<Impl> impl_;
};

std::shared_ptr<CompiledFunction> compile_function(CompiledFunction::Fn fn, CompileOptions options = {});

// Any callable taking and returning std::vector<at::Tensor> (not a module holder).
template <class F,
          std::enable_if_t<std::conjunction_v<
                               std::negation<std::is_base_of<torch::detail::ModuleHolderIndicator, std::decay_t<F>>>,
                               std::is_constructible<CompiledFunction::Fn, F>>,
                           int> = 0>
std::shared_ptr<CompiledFunction> compile(F&& fn, CompileOptions options = {}) {
  return compile_function(CompiledFunction::Fn(std::forward<F>(fn)), std::move(options));
}

// A module's parameters and buffers become inputs of every graph (so optimizer updates
// are seen without recompiling); they are guarded by identity, and every submodule's
// training flag is guarded too.
std::shared_ptr<CompiledFunction> compile(std::shared_ptr<torch::nn::Module> module,
                                          CompiledFunction::Fn fn, CompileOptions options = {});

// A module with a Tensor forward(Tensor): compiled->forward(x).
template <class M>
std::shared_ptr<CompiledFunction> compile(const torch::nn::ModuleHolder<M>& holder,
                                          CompileOptions options = {}) {
  std::shared_ptr<M> impl = holder.ptr();
  std::weak_ptr<M> weak = impl;
  return compile(std::static_pointer_cast<torch::nn::Module>(impl),
                 [weak](const std::vector<at::Tensor>& in) {
                   return std::vector<at::Tensor>{weak.lock()->forward(in.at(0))};
                 },
                 std::move(options));
}

}  // namespace tcap
