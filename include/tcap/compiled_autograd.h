// Compiled autograd: capture and compile the whole backward of a backward() call, hooks
// included, across forward pieces compiled separately or not at all (the C++ counterpart
// of torch._dynamo.compiled_autograd).
//
//   tcap::CompileOptions bw;  bw.backend = "auto";
//   for (...) {
//     auto loss = model->forward(x).sum();       // eager, or tcap::compile'd pieces
//     tcap::CompiledAutogradGuard ca(bw);        // backward() calls in scope go to tcap
//     loss.backward();                           // 1st: engine runs, recorded, compiled
//   }                                            // later: the compiled backward runs
//
// Each backward() walks the autograd graph to a structural key (node types, topology,
// constants, dtypes, hooks, sizes). A miss runs the real engine once while recording it
// into one graph (hooks as call_hook nodes); a hit runs the compiled graph on this step's
// saved tensors and hooks and accumulates into .grad as the engine does. Recompiles say
// why under TCAP_LOGS=recompiles and compiled_autograd_verbose. See docs/compiled-autograd.md.
#pragma once

#include <tcap/compile.h>
#include <tcap/graph.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tcap {

// The stats of every front door (include/tcap/compile.h): `calls` counts the backward()
// and grad() calls the guard saw, `replays` those served by a compiled backward,
// `lookup_us` the time spent walking the graph and looking up the cache.
using CompiledAutogradStats = CompileStats;

struct CompiledAutogradOptions {
  // Backend, cache_size_limit, dynamic, name and dump_dir apply to the backward graphs;
  // bw_compiler, when set, compiles them instead of the backend (torch's
  // compiled_autograd.enable(compiler_fn)); partitioner and fw_compiler are not used
  // (there is no forward to partition). Guards share a cache when these options are the
  // same; bw_compilers are told apart by type (and address, for plain functions), so two
  // different capturing lambdas of one type need different names.
  CompileOptions compile;
  // Route the autograd engine through tcap (a forwarding engine, docs/architecture.md) so
  // that plain loss.backward() and torch::autograd::grad() are intercepted. When false, or
  // when that cannot be done, only the guard's own backward()/grad() are compiled.
  bool use_engine_hook = true;
};

// RAII, per thread. Guards with the same options share one cache for the life of the
// process, so a guard made per training step keeps its compiled backwards.
class CompiledAutogradGuard {
 public:
  explicit CompiledAutogradGuard(CompileOptions options = {});
  explicit CompiledAutogradGuard(CompiledAutogradOptions options);
  ~CompiledAutogradGuard();
  CompiledAutogradGuard(const CompiledAutogradGuard&) = delete;
  CompiledAutogradGuard& operator=(const CompiledAutogradGuard&) = delete;

  // The explicit path: torch::autograd::backward / grad through this guard's cache.
  void backward(const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& grad_tensors = {},
                std::optional<bool> retain_graph = std::nullopt, bool create_graph = false);
  std::vector<at::Tensor> grad(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& grad_outputs = {},
                               std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                               bool allow_unused = false);

  bool engine_hook_installed() const;
  // Of the cache this guard uses (shared with guards of the same options).
  CompiledAutogradStats stats() const;
  // The captured backward graph of every compiled entry, in capture order.
  std::vector<ir::Graph> graphs() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Drops every compiled-autograd cache (tests; a process that changes models).
void reset_compiled_autograd();

}  // namespace tcap
