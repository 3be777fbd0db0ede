// Compiled autograd runtime (include/tcap/compiled_autograd.h).
//
// Note [Compiled autograd]
// Every backward()/grad() on a thread with a guard reaches handle(): through the engine
// hook (Note [Intercepting backward()]) or the guard's explicit backward()/grad(). It
// walks the autograd graph (Note [The backward key]) and looks the key up:
//  - a hit runs the entry's compiled graph on this call's root gradients and saved
//    tensors, with this call's hook objects serving the call_hook nodes (Note [Opaque
//    hooks]); each gradient the graph delivers to a leaf is handed to that leaf's real
//    AccumulateGrad node, which accumulates with the engine's own steal/clone/add rules;
//    without retain_graph the graph's saved variables are released as the engine would;
//  - a miss runs the real engine once while recording it: the walk's tensors are the
//    graph's inputs, hooks are wrapped into opaque call_hook nodes, an observer pre-hook
//    on every AccumulateGrad names the value delivered to it. The graph is the dataflow
//    slice that computes those values and calls the hooks (AccumulateGrad's own ops are
//    left out), compiled with the guard's backend.
// A miss on sizes alone marks the changed sizes dynamic: when the graphs recorded at the
// two sizes differ only by integers that follow the changed sizes (Note [Dynamic sizes] in cache/dynamic_sizes.h),
// later sizes are served by patching those integers, without running the engine.
// create_graph=true, graphs the walk cannot describe, and the cache-size limit run the
// plain engine, with the reason in the log.
#include <tcap/compiled_autograd.h>

#include <tcap/graph_json.h>
#include <tcap/interpreter.h>

#include "autograd/markers.h"
#include "autograd/walk.h"
#include "capture/armed.h"
#include "capture/hooks.h"
#include "capture/recorder.h"
#include "capture/session.h"
#include "compiler/pipeline.h"
#include "ir/op_facts.h"
#include "passes/int_patches.h"
#include "aot/replay_node.h"
#include "cache/entry_cache.h"
#include "cache/unused_options.h"
#include "cache/verify.h"
#include "interp/hook_runner.h"
#include "support/logging.h"

#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "autograd/ca_runtime.h"

namespace tcap {
namespace ca {

using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

std::string fingerprint(const CompiledAutogradOptions& o) {
  std::ostringstream s;
  s << o.compile.backend << '|' << o.compile.cache_size_limit << '|' << o.compile.dynamic << '|' << o.compile.name
    << '|' << o.compile.dump_dir << '|' << o.compile.cuda_graphs << '|' << o.compile.check_new_sizes;
  // A bw_compiler is told apart by its type (and its address when it is a plain function);
  // two different capturing lambdas of one type need different names.
  if (const auto& c = o.compile.bw_compiler) {
    s << "|bw:" << c.target_type().name();
    if (auto* const* fp = c.target<Executable (*)(const ir::Graph&)>()) s << '@' << reinterpret_cast<const void*>(*fp);
  }
  return s.str();
}

std::mutex g_caches_mutex;
std::map<std::string, std::shared_ptr<Cache>>& caches() {
  static auto* m = new std::map<std::string, std::shared_ptr<Cache>>();
  return *m;
}

std::shared_ptr<Cache> cache_for(const CompiledAutogradOptions& o) {
  std::lock_guard<std::mutex> lock(g_caches_mutex);
  auto& slot = caches()[fingerprint(o)];
  if (!slot) slot = std::make_shared<Cache>(o);
  return slot;
}

variable_list Runtime::eager(const Request& r, const std::string& why) {
  count(&CompileStats::eager_calls);
  TCAP_LOG(CompiledAutograd, "compiled autograd: this backward runs eagerly: " << why);
  cache::report_fallback("compiled autograd", "this backward: " + why);
  return r.run();
}

std::string Runtime::miss_reason(const ca::BackwardWalk& w, const cache::Lookup& l) const {
  std::ostringstream s;
  if (l.size_miss_of) {
    const auto& sizes = l.size_miss_of->guards.sizes;
    for (size_t k = 0; k < l.changed.size(); ++k) {
      const size_t i = l.changed[k];
      if (k) s << "\n";
      s << "Cache miss due to changed shapes: marking size idx " << i << " of " << w.label(w.sizes[i].node)
        << " as dynamic (" << sizes[i] << " -> " << w.sizes[i].value << ")";
    }
    return s.str();
  }
  // The first node whose part of the key differs from every cached entry.
  size_t node = 0;
  std::vector<size_t> previous;
  for (const auto& base : *cache_->entries.entries()) {
    const auto& e = static_cast<const BackwardEntry&>(*base);
    const std::string& key = e.guards.structure;
    previous.push_back(key.size());
    size_t i = 0;
    while (i < w.node_key_end.size() && i < e.node_key_end.size() && w.node_key_end[i] == e.node_key_end[i] &&
           w.key().compare(0, w.node_key_end[i], key, 0, e.node_key_end[i]) == 0) {
      ++i;
    }
    node = std::max(node, i);
  }
  node = std::min(node, w.nodes.size() - 1);
  s << "Cache miss due to new autograd node: " << w.label(static_cast<uint32_t>(node)) << " with key size "
    << w.key_size << ", previous key sizes=[";
  for (size_t k = 0; k < previous.size(); ++k) s << (k ? ", " : "") << previous[k];
  s << "]";
  return s.str();
}

// A backward through the serving loop (Note [The serving loop]).
struct Runtime::ServedCall {
  using Out = variable_list;
  Runtime& rt;
  const Request& r;
  ca::PooledWalk pooled;
  ca::BackwardWalk* w = nullptr;
  cache::CallView call_view;
  std::optional<capture::GraphLock> edit;

  std::optional<Out> before() {
    if (r.create_graph) return rt.eager(r, "create_graph=true (double backward needs the engine's graph)");
    const edge_list none;
    w = &pooled.walk();
    ca::walk_backward(r.root, r.outputs ? *r.outputs : none, r.accumulate_grad, *w);
    if (!w->why_not.empty()) return rt.eager(r, "cannot compile this backward: " + w->why_not);
    thread_local std::vector<int64_t> sizes;
    sizes.clear();
    for (const auto& sz : w->sizes) sizes.push_back(sz.value);
    call_view.structure = w->key();  // a structure that could not be compiled runs eagerly (the serving loop)
    call_view.sizes = &sizes;
    return std::nullopt;
  }
  const cache::CallView& view() const { return call_view; }
  const std::vector<at::Tensor>& primals() const {
    static const std::vector<at::Tensor> none;  // a backward's guards are its structure and sizes
    return none;
  }

  // A hit whose specialization to new sizes fails is not served (it is recaptured).
  std::optional<Out> replay(const cache::Lookup& found, bool first) {
    auto e = std::static_pointer_cast<const BackwardEntry>(found.hit);
    const bool in_background = rt.in_background();
    auto hit = in_background ? rt.specialize_in_background(e, found.key) : rt.specialize(e, found.key);
    if (!hit && in_background && !e->specialized->failed(found.key)) {
      // Note [Specializations in the background]: being made; the engine runs this one.
      rt.count(&CompileStats::eager_calls);
      return r.run();
    }
    if (!hit) return std::nullopt;
    const VerifyOptions v = cache::verify_options_for(rt.opts());
    if (first && rt.cache_->verifier.next(v)) {
      // The verified run wraps the graph's hooks to tape them (Note [Verifying a compiled backward]).
      if (!edit) edit.emplace(capture::GraphLock::Mode::Edit);
      return rt.verified_replay(r, *hit, *w, v);
    }
    return rt.replay(r, *hit, *w);
  }
  std::optional<Out> after_miss(bool*) { return std::nullopt; }
  void explain(cache::Lookup& miss, std::string&) const { miss.first_miss = rt.miss_reason(*w, miss); }
  // The capture adds observers to the AccumulateGrad nodes, which other threads' graphs
  // may share: it runs alone.
  bool exclusive() {
    edit.emplace(capture::GraphLock::Mode::Edit);
    return true;
  }
  Out capture(const cache::Lookup& miss) {
    TCAP_LOG(CompiledAutogradVerbose, miss.first_miss);
    return rt.capture(r, *w, std::static_pointer_cast<const BackwardEntry>(miss.size_miss_of), miss.changed);
  }
  Out eager(const std::string& why) {
    TCAP_LOG(CompiledAutograd, "compiled autograd: this backward runs eagerly: " << why);
    return r.run();
  }
  std::optional<Out> check(cache::SizeCheckRecording* recorded) {
    if (!edit) edit.emplace(capture::GraphLock::Mode::Edit);  // the recording adds observers, as a capture does
    return rt.check(r, *w, recorded);
  }
};

variable_list Runtime::serve(const Request& r) {
  // Note [Backwards and graph edits on several threads]: the walk reads the nodes' hook
  // lists and the engine runs them, which a capture on another thread may be editing.
  capture::GraphLock read(capture::GraphLock::Mode::Read);
  ServedCall c{*this, r, {}, nullptr, {}, {}};
  return cache_->entries.serve_call(c);
}

}  // namespace ca

using torch::autograd::edge_list;
using torch::autograd::variable_list;

struct CompiledAutogradGuard::Impl {
  explicit Impl(CompiledAutogradOptions o) : runtime(ca::cache_for(o)), handler_scope(&runtime) {
    if (o.use_engine_hook) {
      try {
        lease = std::make_unique<capture::EngineHookLease>(&capture::capture_backward_driver);
      } catch (const std::exception& e) {
        TCAP_LOG(CompiledAutograd, "compiled autograd: the engine hook could not be installed ("
                                       << ca::first_line(e.what()) << "); only the guard's backward()/grad() are compiled");
      }
    }
  }
  ca::Runtime runtime;
  capture::BackwardHandlerScope handler_scope;
  std::unique_ptr<capture::EngineHookLease> lease;

  variable_list explicit_call(const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& grads,
                              bool keep_graph, bool create_graph, bool accumulate, const edge_list& outputs) {
    TORCH_CHECK(grads.empty() || grads.size() == tensors.size(), "tcap compiled autograd: got ", grads.size(),
                " gradients for ", tensors.size(), " tensors");
    edge_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i];
      TORCH_CHECK(t.requires_grad(), "tcap compiled autograd: element ", i,
                  " of tensors does not require grad and does not have a grad_fn");
      roots.push_back(torch::autograd::impl::gradient_edge(t));
      if (i < grads.size() && grads[i].defined()) {
        root_grads.push_back(grads[i]);
      } else {
        TORCH_CHECK(t.numel() == 1, "tcap compiled autograd: grad can be implicitly created only for scalar outputs");
        root_grads.push_back(at::ones_like(t, c10::MemoryFormat::Preserve));
      }
    }
    if (lease) {  // the engine hook is ours: the engine hands the call to the runtime
      return torch::autograd::Engine::get_default_engine().execute(roots, root_grads, keep_graph, create_graph,
                                                                    accumulate, outputs);
    }
    ca::Request r;
    r.root = std::make_shared<torch::autograd::GraphRoot>(roots, root_grads);
    r.outputs = &outputs;
    r.accumulate_grad = accumulate;
    r.keep_graph = keep_graph;
    r.create_graph = create_graph;
    r.run = [&] {
      return torch::autograd::Engine::get_default_engine().execute(roots, root_grads, keep_graph, create_graph,
                                                                    accumulate, outputs);
    };
    r.prepare_capture = [] {};
    capture::BackwardHandlerScope not_reentrant(nullptr);
    return runtime.serve(r);
  }
};

CompiledAutogradGuard::CompiledAutogradGuard(CompileOptions options)
    : CompiledAutogradGuard(CompiledAutogradOptions{std::move(options), true}) {}

namespace {
// Note [Options a front door does not use].
CompiledAutogradOptions checked(CompiledAutogradOptions o) {
  cache::refuse_unused_options(o.compile, cache::FrontDoor::CompiledAutograd);
  return o;
}
}  // namespace

CompiledAutogradGuard::CompiledAutogradGuard(CompiledAutogradOptions options)
    : impl_(std::make_unique<Impl>(checked(std::move(options)))) {}

CompiledAutogradGuard::~CompiledAutogradGuard() = default;

bool CompiledAutogradGuard::engine_hook_installed() const { return impl_->lease != nullptr; }

void CompiledAutogradGuard::backward(const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& grad_tensors,
                                     std::optional<bool> retain_graph, bool create_graph) {
  impl_->explicit_call(tensors, grad_tensors, retain_graph.value_or(create_graph), create_graph, true, {});
}

std::vector<at::Tensor> CompiledAutogradGuard::grad(const std::vector<at::Tensor>& outputs,
                                                    const std::vector<at::Tensor>& inputs,
                                                    const std::vector<at::Tensor>& grad_outputs,
                                                    std::optional<bool> retain_graph, bool create_graph,
                                                    bool allow_unused) {
  edge_list out_edges;
  for (const auto& t : inputs) {
    TORCH_CHECK(t.requires_grad(), "tcap compiled autograd: an input of grad() does not require grad");
    out_edges.push_back(torch::autograd::impl::gradient_edge(t));
  }
  auto res = impl_->explicit_call(outputs, grad_outputs, retain_graph.value_or(create_graph), create_graph, false,
                                  out_edges);
  for (size_t i = 0; i < res.size() && !allow_unused; ++i) {
    TORCH_CHECK(res[i].defined(), "tcap compiled autograd: one of the differentiated Tensors appears to not have "
                                  "been used in the graph. Set allow_unused=true if this is the desired behavior.");
  }
  return res;
}

CompiledAutogradStats CompiledAutogradGuard::stats() const { return impl_->runtime.cache().entries.stats().read(); }

std::vector<ir::Graph> CompiledAutogradGuard::graphs() const {
  std::vector<ir::Graph> out;
  for (const auto& e : *impl_->runtime.cache().entries.entries()) out.push_back(static_cast<const ca::BackwardEntry&>(*e).graph);
  return out;
}

void reset_compiled_autograd() {
  std::lock_guard<std::mutex> lock(ca::g_caches_mutex);
  ca::caches().clear();
}

}  // namespace tcap
