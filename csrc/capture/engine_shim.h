// The one place tcap touches the autograd engine's internals: it puts its own Engine in
// front of the default one (set_default_engine_stub). See Note [Intercepting backward()].
//
// Note [Intercepting backward()]
// Every backward()/grad() in C++ reaches Engine::get_default_engine().execute(roots,
// grads, keep_graph, create_graph, accumulate_grad, outputs). LibTorch lets one replace
// the default engine (set_default_engine_stub; Python's PythonEngine is installed that
// way). On the first lease tcap installs a forwarding engine: its execute() hands the
// call to tcap's driver while a lease is alive, and otherwise (and for every other
// entry point) forwards to the engine that was the default before, so the engine's
// worker threads, ready queues and semantics stay that engine's own. The driver may
// observe the graph (wrap hooks, mark the backward phase, compile it) and then runs it
// through the previous engine (BackwardCall::run).
//
// Why not Engine::set_compiled_autograd (PyTorch's compiled-autograd hook, which tcap
// used before): Engine::execute guards that hook with a best-effort counter of threads
// "in compiled autograd" that is raised and dropped around the hook call without a
// lock, so two threads entering backward() at the same moment fail with "Re-entrant into
// Compiled Autograd ... not yet supported" (Guard.ConcurrentBackwardsFromManyThreads
// failed about one run in eight). The hook is process-wide, so even threads that never
// capture were exposed. Its signature also changes across releases; execute()'s has not.
//
// The forwarding engine stays installed once installed (a thread may hold a reference
// to it at any time); with no lease it costs one atomic load per backward().
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <memory>
#include <vector>

namespace torch::autograd {
struct Engine;
}

namespace tcap::capture {

using NodePtr = std::shared_ptr<torch::autograd::Node>;

// What the driver receives for one backward()/grad() call.
struct BackwardCall {
  const torch::autograd::edge_list* roots = nullptr;
  NodePtr root;                                   // a GraphRoot over roots and the checked gradients
  bool accumulate_grad = true;                    // backward() (true) or grad() (false)
  const torch::autograd::edge_list* outputs = nullptr;
  std::vector<at::Tensor> root_grads() const;     // the gradients fed to the roots
  bool keep_graph() const { return keep_graph_; }      // retain_graph
  bool create_graph() const { return create_graph_; }  // the backward runs with grad mode on
  // Makes run() include `key` in the dispatch keys of the thread-local state the engine
  // runs every node under, with autograd threads off there; the rest of that state is the
  // calling thread's, as for any backward().
  void include_in_thread_locals(c10::DispatchKey key) const;
  // Runs the backward on the engine as it would have run without tcap; returns grad()'s
  // results.
  torch::autograd::variable_list run() const;

 private:
  friend class ForwardingEngine;
  bool keep_graph_ = false;
  bool create_graph_ = false;
  torch::autograd::Engine* next_ = nullptr;  // the engine that runs it
  mutable c10::DispatchKeySet include_;
};

using BackwardDriver = torch::autograd::variable_list (*)(const BackwardCall&);

// Note [Backwards and graph edits on several threads]
// To observe a backward, tcap edits the hook lists of autograd nodes: a capture wraps every
// hook reachable from the roots (HookWrapScope) and compiled autograd's capture adds an
// observer to every AccumulateGrad node it reaches (ca::Markers). Nodes can be shared by
// backwards on several threads: two models' graphs that share leaf parameters share their
// AccumulateGrad nodes (Hogwild training, one model served by a thread pool). The engine
// reads those lists without a lock while it runs a node, and compiled autograd's walk reads
// them to describe the graph, so an edit made while another thread's backward or walk reads
// the same list could free a hook under it (this crashed about one run in fifty).
// GraphLock makes the two exclusive: every backward that reaches tcap's forwarding engine
// holds it to read (any number at once, no wait between them), and an edit holds it alone.
// Edits are captures: the first calls of a compiled function, a compiled backward's first
// run, a CaptureGuard's backward; replays never edit, so steady-state backwards on many
// threads never wait for each other. A waiting edit goes first: backwards that start after
// it wait for it (a lock that let readers in ahead would starve a capture behind threads
// that are always in a backward). A backward started from inside another (a hook calling
// backward(), or a reentrant backward on a device thread) runs under its outer one's hold
// and takes none of its own: it could not wait for an edit its outer backward blocks.
class GraphLock {
 public:
  enum class Mode { Read, Edit };
  explicit GraphLock(Mode mode);
  ~GraphLock();
  GraphLock(const GraphLock&) = delete;
  GraphLock& operator=(const GraphLock&) = delete;

 private:
  enum class Held { None, Read, Edit, ReadGivenUpForEdit } held_ = Held::None;
};

// While at least one lease is alive, every backward()/grad() in the process goes through
// `driver` (which must call BackwardCall::run()).
class EngineHookLease {
 public:
  explicit EngineHookLease(BackwardDriver driver);
  ~EngineHookLease();
  EngineHookLease(const EngineHookLease&) = delete;
  EngineHookLease& operator=(const EngineHookLease&) = delete;
};

// The hooks registered on a leaf that requires grad (Tensor::register_hook): the tensor
// pre-hooks its AccumulateGrad node runs before accumulating, by object (the engine reads
// them from the tensor, so they outlive any one backward). Empty for other tensors.
std::vector<torch::autograd::FunctionPreHook*> leaf_tensor_hooks(const at::Tensor& t);
// The same hooks as the list the engine reads, to wrap them for a while (Note [Hooks called
// once under verify], capture/hooks.h). nullptr for a tensor that is not such a leaf.
std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>>* leaf_tensor_hook_list(const at::Tensor& t);
// Whether a post-accumulate-grad hook is registered on the leaf t.
bool has_post_accumulate_grad_hook(const at::Tensor& t);

// Note [Recorded post-accumulate-grad hooks]
// A replayed training step (compile_step) writes .grad itself and never runs
// AccumulateGrad, so a parameter's post-accumulate-grad hook would be skipped. A hook
// that derives from RecordedGradHook promises instead that, while every capture on its
// thread records collectives (capture::records_collectives()), it does its work through
// recorded operators only (the gradient all-reduce of tcap::DistributedDataParallel, as
// tcap_dist:: ops), so the captured graph holds its effect and a replay redoes it.
// record_key() names what the hook would record now (DDP: whether it reduces, outside
// no_sync()); compile_step guards it with the step's structure, so another key is
// another cache entry.
struct RecordedGradHook : torch::autograd::PostAccumulateGradHook {
  virtual int64_t record_key() const = 0;
};
// The leaf t's post-accumulate-grad hook if it is a RecordedGradHook, else nullptr.
const RecordedGradHook* recorded_grad_hook(const at::Tensor& t);

}  // namespace tcap::capture
