// tcap::compile: capture a function's forward and backward once, partition them, and
// replay them on later calls through a torch::autograd::Function (the AOTAutograd of tcap).
//
//   auto f = tcap::compile([](const std::vector<at::Tensor>& in) {
//     return std::vector<at::Tensor>{torch::cos(torch::cos(in[0] + in[1]))};
//   });
//   auto y = f(a, b)[0];              // 1st call: runs eagerly and records the forward
//   y.sum().backward();               // ... and this backward; then compiles the region
//   auto y2 = f(a, b)[0];             // later calls: guards checked, compiled replay
//
//   auto m = tcap::compile(model);    // a module holder that forwards like the model
//   auto out = m->forward(x);         // or m(x); m->parameters(), m->eval(), m->to(...)
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

#include <array>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
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

// What compiles a graph when no user compiler is given (CompileOptions::backend):
//   Backend::Eager  the interpreter (ATen kernels, buffers reused), no kernels made
//   Backend::Llvm   fused CPU kernels generated with LLVM (docs/fusion.md)
//   Backend::Cuda   fused CUDA kernels through NVRTC, for graphs on one CUDA device
//   Backend::Auto   cuda for CUDA graphs, llvm for CPU graphs where available, else eager
//                   (logged)
// A backend may be written by name ("llvm", as the environment and tools spell it); an
// unknown name is refused where it is written. Which backends this build has, and why one
// is missing: compiler/backends.cpp (Note [The backend table]).
class Backend {
 public:
  enum Kind { Eager, Llvm, Cuda, Auto };
  /* implicit */ Backend(Kind kind = Eager) : kind_(kind) {}
  /* implicit */ Backend(const std::string& name);
  /* implicit */ Backend(const char* name) : Backend(std::string(name)) {}
  Kind kind() const { return kind_; }
  // "eager", "llvm", "cuda" or "auto".
  const char* name() const;
  // Whether this build and machine can compile with it now (`why` says why not); Auto
  // always can (it falls back to eager, logged).
  bool available(std::string* why = nullptr) const;
  friend bool operator==(const Backend& a, const Backend& b) { return a.kind_ == b.kind_; }
  friend bool operator!=(const Backend& a, const Backend& b) { return a.kind_ != b.kind_; }
  friend std::ostream& operator<<(std::ostream& os, const Backend& b) { return os << b.name(); }

 private:
  Kind kind_;
};

struct CompileOptions {
  std::string name = "fn";                   // used in logs and dump file names
  Backend backend = Backend::Eager;          // see Backend
  Partitioner partitioner = Partitioner::MinCut;
  // Override the backend: fw_compiler for forward graphs and compile_step's step graph
  // (one graph, its host scalars as inputs), bw_compiler for backward graphs.
  GraphCompiler fw_compiler;
  GraphCompiler bw_compiler;
  int cache_size_limit = 8;                  // compiled entries; then the function stays eager
  bool dynamic = true;                       // mark dims that change as dynamic (see docs)
  // Dims that never become dynamic, as torch._dynamo.mark_static: {input, dim} of the
  // inputs tcap::compile's function or compile_step's step is called with. A call that
  // changes one of them gets an entry of its own, specialized to its sizes, and no entry is
  // generalized across it (a dim that takes a few values, each worth its own kernels).
  // Compiled autograd has no inputs of its own: it ignores them.
  std::vector<std::pair<int, int>> static_dims;
  // A promise about one dim, as torch._dynamo.mark_dynamic(t, dim, min, max): no host code
  // of the function or step branches on the size of dim `dim` of input `input` while it is
  // within [min, max] (min >= 2: sizes 0 and 1 are never dynamic). Once an entry is dynamic
  // in that dim, its new sizes within the bounds are served without a check capture (Note
  // [Checking a new size]); sizes outside are checked as every other dim's are. Where the
  // promise is wrong, so is the answer: verify mode names the promise. A dim both static
  // and dynamic is an error. Compiled autograd has no inputs of its own: it ignores them.
  struct DynamicDim {
    int input = 0;
    int dim = 0;
    int64_t min = 2;
    int64_t max = std::numeric_limits<int64_t>::max();
  };
  std::vector<DynamicDim> dynamic_dims;
  // Note [Checking a new size]: host code may branch on a size (`if (x.size(0) > 64)`),
  // which tcap cannot see, so the first call at sizes a dynamic entry has not served runs
  // the function's own code while recording (an eager call, no compile) and the sizes are
  // served by the entry only if that records the entry's graph at those sizes; otherwise
  // they get an entry of their own. false is a promise that no host code of the function,
  // step or backward branches on its dynamic sizes: new sizes are served without running
  // it (docs/compile.md, "What a replay re-reads and what it freezes"; verify mode checks).
  bool check_new_sizes = true;
  std::string dump_dir;                      // write joint/forward/backward graphs here (JSON)
  // Replay each compiled graph on a CUDA device as a CUDA graph after a warm-up call, for
  // launch-bound models (Note [CUDA graphs of compiled regions]; docs/codegen-cuda.md).
  // Graphs that cannot be (hooks, in-place writes to inputs, host reads, explicit generators,
  // CPU tensors) run as usual, logged under graph_breaks. Outputs are copies.
  bool cuda_graphs = false;
  // llvm: kernels that need an LLVM compile are compiled on a background thread; until a
  // graph's kernels are ready, its fused groups run their own ATen ops, so no call waits
  // for LLVM (a server at a new batch size, a run whose sequence lengths vary). Results
  // agree with eager either way, but which calls ran kernels depends on timing, so two
  // runs need not be bitwise equal; hence off by default. TCAP_COMPILE_IN_BACKGROUND=1
  // turns it on for every graph. A graph's kernels start compiling at its first run;
  // tcap::wait_for_background_compiles() waits for those started (Note [Kernels compiled
  // in the background]). Every front door, either backend: a dynamic entry's
  // specialization to new sizes is made on that thread too, the calls at those
  // sizes running eagerly until it is ready (Note [Specializations in the background]).
  bool compile_in_background = false;
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

// What a front door did with its calls: tcap::compile, compile_step and compiled autograd
// count the same things (Note [The serving loop] in csrc/cache/entry_cache.h).
struct CompileStats {
  int calls = 0;           // calls seen
  int captures = 0;        // calls that ran eagerly while recording
  int compiles = 0;        // entries built (captures and specializations to new sizes)
  int replays = 0;         // calls served by a compiled entry
  int eager_calls = 0;     // calls run eagerly (stance, pending backward, fallback, cache limit)
  int recompiles = 0;      // guard misses that led to a new capture
  int backward_fallbacks = 0;  // compiled backwards that ran the eager recompute instead
  int verified = 0;        // replays checked against eager (verify mode)
  int size_checks = 0;     // first calls at new sizes of a dynamic entry, run and recorded to check them
  double lookup_us = 0;    // compiled autograd: time spent walking the graph and looking up
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
  std::unique_ptr<Impl> impl_;
};

// What tcap::compile(fn) returns: a handle to the compiled function, called as the
// function is: f(a, b) or f({a, b}); f->stats(), f->entries(). Like a module holder it
// shares its function when copied. (*f)({a, b}) calls it too, and it converts to the
// std::shared_ptr<CompiledFunction> it holds (ptr()).
class CompiledFn {
 public:
  CompiledFn() = default;
  /* implicit */ CompiledFn(std::shared_ptr<CompiledFunction> impl) : impl_(std::move(impl)) {}

  template <class... T,
            std::enable_if_t<std::conjunction_v<std::is_convertible<const T&, const at::Tensor&>...>, int> = 0>
  std::vector<at::Tensor> operator()(const at::Tensor& first, const T&... rest) const {
    return (*get())(std::vector<at::Tensor>{first, rest...});
  }
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const { return (*get())(inputs); }

  CompiledFunction* operator->() const { return get(); }
  CompiledFunction& operator*() const { return *get(); }
  const std::shared_ptr<CompiledFunction>& ptr() const { return impl_; }
  /* implicit */ operator std::shared_ptr<CompiledFunction>() const { return impl_; }
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  CompiledFunction* get() const {
    TORCH_CHECK(impl_, "tcap: calling an empty CompiledFn");
    return impl_.get();
  }
  std::shared_ptr<CompiledFunction> impl_;
};

CompiledFn compile_function(CompiledFunction::Fn fn, CompileOptions options = {});

// Any callable taking and returning std::vector<at::Tensor> (not a module holder).
template <class F,
          std::enable_if_t<std::conjunction_v<
                               std::negation<std::is_base_of<torch::detail::ModuleHolderIndicator, std::decay_t<F>>>,
                               std::is_constructible<CompiledFunction::Fn, F>>,
                           int> = 0>
CompiledFn compile(F&& fn, CompileOptions options = {}) {
  return compile_function(CompiledFunction::Fn(std::forward<F>(fn)), std::move(options));
}

// A module's parameters and buffers become inputs of every graph (so optimizer updates
// are seen without recompiling); they are guarded by identity, and every submodule's
// training flag is guarded too.
CompiledFn compile(std::shared_ptr<torch::nn::Module> module, CompiledFunction::Fn fn, CompileOptions options = {});

namespace detail {
// The outputs of a module's forward as a list, and back (Note [Compiled modules]).
inline void push_outputs(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void push_outputs(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... T>
void push_outputs(const std::tuple<T...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (push_outputs(e, out), ...); }, t);
}
template <class R>
struct Outputs;
template <>
struct Outputs<at::Tensor> {
  static constexpr size_t count = 1;
  static at::Tensor take(const std::vector<at::Tensor>& v, size_t& k) { return v.at(k++); }
};
template <>
struct Outputs<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> take(const std::vector<at::Tensor>& v, size_t& k) {
    std::vector<at::Tensor> out(v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    k = v.size();
    return out;
  }
};
template <class... T>
struct Outputs<std::tuple<T...>> {
  static std::tuple<T...> take(const std::vector<at::Tensor>& v, size_t& k) {
    return std::tuple<T...>{Outputs<T>::take(v, k)...};  // braces: in order
  }
};
template <class M, size_t... I>
auto call_forward(M& m, const std::vector<at::Tensor>& in, std::index_sequence<I...>) {
  return m.forward(in.at(I)...);
}
// The compiled functions of a module, one per forward arity (made at the first call of it).
class ArityFunctions {
 public:
  static constexpr size_t kMaxArity = 8;
  CompiledFunction* get(size_t arity) const {
    return arity < kMaxArity ? fns_[arity].load(std::memory_order_acquire) : nullptr;
  }
  CompiledFunction* get_or_make(size_t arity, const std::function<CompiledFn()>& make);
  std::vector<std::shared_ptr<CompiledFunction>> all() const;

 private:
  mutable std::mutex mutex_;
  std::array<std::atomic<CompiledFunction*>, kMaxArity> fns_{};
  std::vector<std::shared_ptr<CompiledFunction>> owned_;
};
// Sums of the functions' stats, their entries, the first eager reason.
CompileStats sum_stats(const std::vector<std::shared_ptr<CompiledFunction>>& fns);
std::vector<CompiledEntryInfo> all_entries(const std::vector<std::shared_ptr<CompiledFunction>>& fns);
std::string first_eager_reason(const std::vector<std::shared_ptr<CompiledFunction>>& fns);
}  // namespace detail

// Blocks until every kernel compile started in the background so far has finished
// (CompileOptions::compile_in_background; a graph's start at its first run): after it,
// those graphs run their kernels.
void wait_for_background_compiles();

// Note [Compiled modules]
// tcap::compile(model) returns a CompiledModule: a module holder (as torch::nn::Linear is)
// whose forward is the model's, compiled. The model is its one submodule, "module" (as
// DistributedDataParallel holds its model), so parameters(), buffers(), train()/eval(),
// to() and torch::save reach the model itself: an optimizer made from either sees the same
// tensors, and a submodule replaced in the model later is seen (named_parameters() names
// start with "module."; save model itself for its own names). forward takes tensors and
// returns what the model's forward returns (a Tensor, a vector of them, or a tuple of
// tensors); each number of arguments is compiled on its first call. A forward that takes
// anything else is compiled through tcap::compile(module, fn).
template <class M>
class CompiledModuleImpl : public torch::nn::Module {
 public:
  CompiledModuleImpl(std::shared_ptr<M> model, CompileOptions options)
      : model_(register_module("module", std::move(model))), options_(std::move(options)) {}

  template <class... T,
            std::enable_if_t<std::conjunction_v<std::is_convertible<const T&, const at::Tensor&>...>, int> = 0>
  auto forward(const at::Tensor& x, const T&... rest) const {
    using R = decltype(std::declval<M&>().forward(x, rest...));
    constexpr size_t n = 1 + sizeof...(T);
    CompiledFunction* f = fns_.get(n);
    if (f == nullptr) f = fns_.get_or_make(n, [this] { return make<n>(); });
    const std::vector<at::Tensor> outs = (*f)(std::vector<at::Tensor>{x, rest...});
    size_t k = 0;
    return detail::Outputs<R>::take(outs, k);
  }
  // The older call spelling: (*m)({x}) for a forward of one tensor.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const {
    TORCH_CHECK(inputs.size() == 1, "tcap: (*compiled)({...}) takes one tensor; call forward(a, b, ...)");
    std::vector<at::Tensor> out;
    detail::push_outputs(forward(inputs[0]), out);
    return out;
  }

  // The model compiled.
  const std::shared_ptr<M>& module() const { return model_; }
  // Over every forward arity called so far.
  CompileStats stats() const { return detail::sum_stats(fns_.all()); }
  std::vector<CompiledEntryInfo> entries() const { return detail::all_entries(fns_.all()); }
  std::string eager_reason() const { return detail::first_eager_reason(fns_.all()); }
  // The compiled function of forward with `arity` tensors (as compile(module, fn) makes it).
  CompiledFn function(size_t arity = 1) const {
    CompiledFunction* f = fns_.get(arity);
    if (f == nullptr) {
      TORCH_CHECK(arity == 1, "tcap: CompiledModule::function(", arity, "): forward has not been called with ", arity,
                  " tensors yet");
      f = fns_.get_or_make(1, [this] { return make<1>(); });
    }
    for (const auto& p : fns_.all()) {
      if (p.get() == f) return p;
    }
    return {};
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "tcap::CompiledModule(name=" << options_.name << ", backend=" << options_.backend << ")";
  }

 private:
  template <size_t N>
  CompiledFn make() const {
    std::shared_ptr<M> model = model_;
    return compile(std::static_pointer_cast<torch::nn::Module>(model_),
                   [model](const std::vector<at::Tensor>& in) {
                     TORCH_CHECK(in.size() == N, "tcap: a compiled forward of ", N, " tensors got ", in.size());
                     std::vector<at::Tensor> out;
                     detail::push_outputs(detail::call_forward(*model, in, std::make_index_sequence<N>{}), out);
                     return out;
                   },
                   options_);
  }
  std::shared_ptr<M> model_;
  CompileOptions options_;
  mutable detail::ArityFunctions fns_;  // made on first use, by any thread
};

template <class M>
class CompiledModule : public torch::nn::ModuleHolder<CompiledModuleImpl<M>> {
 public:
  using torch::nn::ModuleHolder<CompiledModuleImpl<M>>::ModuleHolder;
  // m(a, b): the compiled forward (ModuleHolder's call cannot see a template forward).
  template <class... T>
  auto operator()(const at::Tensor& x, const T&... rest) const {
    return this->ptr()->forward(x, rest...);
  }
  // The function of forward(x) (function(1)), for code that holds a
  // std::shared_ptr<CompiledFunction>.
  /* implicit */ operator std::shared_ptr<CompiledFunction>() const {
    return this->ptr()->function(1).ptr();
  }
};

// A module holder (torch::nn::Linear, a TORCH_MODULE of one's own, DistributedDataParallel):
// see Note [Compiled modules].
template <class M>
CompiledModule<M> compile(const torch::nn::ModuleHolder<M>& holder, CompileOptions options = {}) {
  return CompiledModule<M>(std::make_shared<CompiledModuleImpl<M>>(holder.ptr(), std::move(options)));
}

}  // namespace tcap
