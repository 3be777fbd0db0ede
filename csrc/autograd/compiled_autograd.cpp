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

namespace tcap {
namespace {

using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// One backward() / grad() call, however it reached us.
struct Request {
  std::shared_ptr<Node> root;  // a GraphRoot
  const edge_list* outputs = nullptr;
  bool accumulate_grad = true;
  bool keep_graph = false;
  bool create_graph = false;
  std::function<variable_list()> run;          // the plain engine
  std::function<void()> prepare_capture;       // make run() record on this thread
};

// A compiled backward. Its guards (cache/guards.h) are the structure key of the autograd
// graph (Note [The backward key]) and the sizes the walk read, some of them dynamic
// (Note [Dynamic sizes]); grad mode and autocast are not guarded (the graph records each
// op's own grad mode, and the engine runs backward ops under the forward's autocast
// state, which the key holds per node).
//
// What a replay needs to know besides the graph, fixed once the entry is captured: a
// specialization to new sizes is a copy of this plan with the graph specialized, compiled.
struct BackwardPlan {
  std::vector<size_t> node_key_end;
  std::vector<int> acc_output;   // per AccumulateGrad (walk order): output position or -1
  // Opaque hook slots from here on are AccumulateGrad calls inside the graph (Note [Leaves
  // accumulated where the engine would]): slot num_hooks + i is AccumulateGrad i.
  size_t num_hooks = 0;
  bool accumulates_in_graph = false;  // some leaf is accumulated by a CallHook of the graph
  std::vector<int> grad_output;  // per grad() output edge: output position or -1
  std::vector<c10::IValue> keep_alive;
};

struct BackwardEntry : cache::Entry, BackwardPlan {
  ir::Graph graph;
  Executable exe;
  std::shared_ptr<cache::Specializations<BackwardEntry>> specialized = std::make_shared<cache::Specializations<BackwardEntry>>();
};

struct Cache {
  explicit Cache(const CompiledAutogradOptions& o)
      : options(o), entries("compiled autograd", o.compile.cache_size_limit, o.compile.dynamic, o.compile.check_new_sizes) {}
  CompiledAutogradOptions options;
  cache::EntryCache entries;
  std::mutex mutex;  // eager_keys
  std::set<std::string, std::less<>> eager_keys;  // structures that cannot be compiled (reason logged once)
  cache::VerifyCounter verifier;  // verify mode: which hits to check
};

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

using ca::first_line;

class Runtime : public capture::BackwardHandler {
 public:
  explicit Runtime(std::shared_ptr<Cache> c) : cache_(std::move(c)) {}
  variable_list handle(const capture::BackwardCall& call) override {
    Request r;
    r.root = call.root;
    r.outputs = call.outputs;
    r.accumulate_grad = call.accumulate_grad;
    r.keep_graph = call.keep_graph();
    r.create_graph = call.create_graph();
    r.run = [&call] { return call.run(); };
    r.prepare_capture = [&call] { call.include_in_thread_locals(capture::recording_key()); };
    return serve(r);
  }

  variable_list serve(const Request& r);
  Cache& cache() { return *cache_; }

 private:
  struct ServedCall;
  const CompileOptions& opts() const { return cache_->options.compile; }
  // The options' bw_compiler when set (torch's compiled_autograd.enable(compiler_fn)),
  // else the backend.
  Executable compile_backward(const ir::Graph& g, const std::string& what) const {
    return compiler::compile_graph(g, opts(), what, opts().bw_compiler);
  }
  void count(int CompileStats::*f) { cache_->entries.stats().count(f); }
  // Runs the plain engine for a backward tcap cannot compile: a fallback (logged, thrown
  // under error_on_fallback).
  variable_list eager(const Request& r, const std::string& why);
  variable_list replay(const Request& r, const BackwardEntry& e, ca::BackwardWalk& w);
  variable_list verified_replay(const Request& r, const BackwardEntry& e, ca::BackwardWalk& w, const VerifyOptions& v);
  interp::HookRunner hook_runner(const BackwardEntry& e, ca::BackwardWalk& w, c10::impl::LocalDispatchKeySet outer) const;
  variable_list capture(const Request& r, const ca::BackwardWalk& w, const std::shared_ptr<const BackwardEntry>& size_miss_of,
                        const std::vector<size_t>& changed);
  // One backward run by the engine while recording: its results, the entry's plan and
  // guards, and its graph; `why` says why no graph could be made of it.
  struct Recorded {
    variable_list results;
    std::shared_ptr<BackwardEntry> entry;
    ir::Graph graph;
    std::string why;
  };
  Recorded record(const Request& r, const ca::BackwardWalk& w);
  // Note [Checking a new size]: the backward run while recording, compared with dynamic
  // entry e's graph at class values `key`; returns the backward's results.
  variable_list check(const Request& r, const ca::BackwardWalk& w, const BackwardEntry& e, const std::vector<int64_t>& key,
                      std::string* verdict);
  std::shared_ptr<const BackwardEntry> specialize(const std::shared_ptr<const BackwardEntry>& e, const std::vector<int64_t>& key);
  std::string generalize(const BackwardEntry& a, BackwardEntry& b, const std::vector<size_t>& changed);
  std::string miss_reason(const ca::BackwardWalk& w, const cache::Lookup& l) const;
  std::shared_ptr<Cache> cache_;
};

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
    call_view.structure = w->key();
    call_view.sizes = &sizes;
    bool known_eager = false;
    {
      std::lock_guard<std::mutex> lock(rt.cache_->mutex);
      known_eager = rt.cache_->eager_keys.count(w->key()) > 0;
    }
    if (known_eager) return rt.eager(r, "this graph could not be compiled before (see the earlier log line)");
    return std::nullopt;
  }
  const cache::CallView& view() const { return call_view; }
  const std::vector<at::Tensor>& primals() const {
    static const std::vector<at::Tensor> none;  // a backward's guards are its structure and sizes
    return none;
  }

  // A hit whose specialization to new sizes fails is not served (it is recaptured).
  std::optional<Out> replay(const cache::Lookup& found, bool first) {
    auto hit = rt.specialize(std::static_pointer_cast<const BackwardEntry>(found.hit), found.key);
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
  std::optional<Out> check(const cache::Lookup& found, std::string* verdict) {
    if (!edit) edit.emplace(capture::GraphLock::Mode::Edit);  // the recording adds observers, as a capture does
    return rt.check(r, *w, static_cast<const BackwardEntry&>(*found.hit), found.key, verdict);
  }
};

variable_list Runtime::serve(const Request& r) {
  // Note [Backwards and graph edits on several threads]: the walk reads the nodes' hook
  // lists and the engine runs them, which a capture on another thread may be editing.
  capture::GraphLock read(capture::GraphLock::Mode::Read);
  ServedCall c{*this, r, {}, nullptr, {}, {}};
  return cache_->entries.serve_call(c);
}

interp::HookRunner Runtime::hook_runner(const BackwardEntry& e, ca::BackwardWalk& w, c10::impl::LocalDispatchKeySet outer) const {
  TORCH_CHECK(w.hooks.size() == e.num_hooks, "compiled autograd: the backward has ", w.hooks.size(),
              " hooks, its compiled graph ", e.num_hooks);
  return [&e, &w, outer](int slot, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& node_in) {
    // As the engine runs hooks: default dispatch; grad mode is off for the whole replay.
    c10::impl::ForceDispatchKeyGuard keys(outer);
    const auto k = static_cast<size_t>(slot);
    if (k >= e.num_hooks) {
      // Note [Leaves accumulated where the engine would]
      ca::accumulate(*w.nodes[w.accumulate.at(k - e.num_hooks)], at::Tensor(in.at(0)));
      return std::vector<at::Tensor>{};
    }
    return ca::call_hook(w.hooks.at(k), in, node_in);
  };
}

// Note [Verifying a compiled backward]
// A verified hit (verify mode) runs the engine on the backward, as eager runs it (it
// accumulates into .grad, runs the hooks, frees the graph), then the compiled graph on the
// walk's tensors (the unpacked saved tensors, which the engine's release leaves alive)
// without accumulating. Each gradient the compiled graph would have handed a leaf is
// compared with what the engine added to that leaf's .grad (its value before, plus the
// gradient, as AccumulateGrad adds them), and grad()'s results with the engine's. The
// engine's results are kept. Hooks run once, in the engine (Note [Hooks called once under
// verify], capture/hooks.h): the compiled graph's call_hook nodes take the engine's taped
// results, and the gradients each received are compared with the engine's. A graph that
// accumulates leaves inside itself (Note [Leaves accumulated where the engine would]) is
// not verified: it would accumulate twice.
variable_list Runtime::verified_replay(const Request& r, const BackwardEntry& e, ca::BackwardWalk& w, const VerifyOptions& v) {
  if (e.accumulates_in_graph) {
    TCAP_LOG(Verify, "compiled autograd entry " << e.id << " is not verified: it accumulates leaves inside its graph");
    return replay(r, e, w);
  }
  count(&CompileStats::replays);
  count(&CompileStats::verified);
  std::vector<at::Tensor> before(w.accumulate.size());
  for (size_t i = 0; i < w.accumulate.size() && r.accumulate_grad; ++i) {
    if (e.acc_output.at(i) < 0) continue;
    const auto* acc = static_cast<const torch::autograd::AccumulateGrad*>(w.nodes[w.accumulate[i]]);
    const at::Tensor& g = acc->variable.grad();
    if (g.defined()) before[i] = g.detach().clone();
  }
  capture::HookTape tape;
  variable_list eager;
  {
    capture::HookWrapScope::SlotOf slots;
    for (size_t k = 0; k < w.hooks.size() && k < e.num_hooks; ++k) slots.emplace(w.hooks[k].object, static_cast<int>(k));
    capture::HookTapeScope taped(w.graph, slots, &tape, capture::HookTapeScope::Mode::Record);
    eager = r.run();
  }
  cache::Tolerances tol = cache::Tolerances::for_options(opts());
  cache::VerifyReport rep;
  rep.who = "compiled autograd entry " + std::to_string(e.id);
  rep.likely = "state the backward graph's key does not cover changed since the entry was captured: a host value a "
               "hook or a custom autograd function's backward reads through its closure, or a tensor one of them "
               "reads from outside the saved tensors (docs/compiled-autograd.md, \"Verify mode\")";
  if (!tol.exact) rep.likely += "; or a rounding difference of backend '" + std::string(opts().backend.name()) + "' beyond its tolerance";
  std::vector<at::Tensor> outs;
  try {
    at::AutoGradMode grad_mode(false);
    interp::HookRunner real = hook_runner(e, w, c10::impl::tls_local_dispatch_key_set());
    interp::HookRunner runner = [&](int slot, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& node_in) {
      if (auto out = tape.play(slot, in)) return *out;
      return real(slot, in, node_in);
    };
    interp::HookRunnerScope scope(&runner);
    outs = e.exe(w.tensors);
  } catch (const HostValueChanged& err) {
    // Not this entry's backward; the engine's ran and is the answer (rethrown, the serving
    // loop would run the backward a second time).
    TCAP_LOG(Verify, rep.who << " was not compared: " << err.what_without_backtrace());
    return eager;
  } catch (const c10::Error& err) {
    rep.what = "the compiled backward";
    rep.how = std::string("raised where the engine did not: ") + err.what_without_backtrace();
    cache::report_mismatch(v, rep);  // throws unless log_only
    return eager;
  }
  size_t compared = 0;
  at::NoGradGuard no_grad;
  for (const auto& p : tape.played()) {
    for (size_t j = 0; j < p.in.size() && j < p.taped_in.size(); ++j, ++compared) {
      std::string how = cache::compare_tensors(p.in[j], p.taped_in[j], tol);
      if (how.empty()) continue;
      const auto& h = w.hooks.at(static_cast<size_t>(p.slot));
      rep.what = "gradient " + std::to_string(j) + " a hook of " + w.label(h.node) + " receives";
      rep.how = std::move(how);
      cache::report_mismatch(v, rep);
      return eager;
    }
  }
  for (size_t i = 0; i < w.accumulate.size() && r.accumulate_grad; ++i) {
    const int p = e.acc_output.at(i);
    if (p < 0) continue;
    const auto* acc = static_cast<const torch::autograd::AccumulateGrad*>(w.nodes[w.accumulate[i]]);
    const at::Tensor& g = outs.at(static_cast<size_t>(p));
    const at::Tensor expect = before[i].defined() && g.defined() ? before[i].add_(g) : g;
    std::string how = cache::compare_tensors(expect, acc->variable.grad(), tol);
    ++compared;
    if (how.empty()) continue;
    rep.what = "the gradient accumulated into the leaf of " + w.label(w.accumulate[i]);
    rep.how = std::move(how);
    cache::report_mismatch(v, rep);
    return eager;
  }
  for (size_t j = 0; j < e.grad_output.size() && j < eager.size(); ++j) {
    const int p = e.grad_output[j];
    std::string how = cache::compare_tensors(p < 0 ? at::Tensor() : outs.at(static_cast<size_t>(p)), eager[j], tol);
    ++compared;
    if (how.empty()) continue;
    rep.what = "grad() result " + std::to_string(j);
    rep.how = std::move(how);
    cache::report_mismatch(v, rep);
    return eager;
  }
  cache::report_match(rep.who, compared);
  return eager;
}

variable_list Runtime::replay(const Request& r, const BackwardEntry& e, ca::BackwardWalk& w) {
  count(&CompileStats::replays);
  interp::HookRunner runner = hook_runner(e, w, c10::impl::tls_local_dispatch_key_set());
  // Note [Saved tensors freed as the backward runs]: without retain_graph, the engine
  // frees each node's saved tensors once the node has run. The compiled backward gets the
  // same peak memory by releasing the graph's saved variables up front and moving the
  // only remaining references (the walk's unpacked copies) into the executable, which
  // drops each at its last use. grad(outputs) and backward(inputs=...) run, and release,
  // only the nodes above the outputs (ca::nodes_run_for); the others keep their saved
  // tensors for a later backward, as with the engine.
  const bool release = !r.keep_graph;
  if (release) {
    const bool whole = r.outputs == nullptr || r.outputs->empty();
    const std::vector<char> runs = whole ? std::vector<char>() : ca::nodes_run_for(w, *r.outputs, r.accumulate_grad);
    for (size_t i = 0; i < w.nodes.size(); ++i) {
      if (whole || runs[i]) {
        w.nodes[i]->release_variables();
        aot::release_replay_node(*w.nodes[i]);
      }
    }
  }
  // The engine runs a backward with grad mode = create_graph, which is off here (a
  // create_graph backward runs eagerly): the graph's ops record no autograd history, and
  // AccumulateGrad may steal a fresh gradient instead of cloning it (it only steals with
  // grad mode off).
  at::AutoGradMode grad_mode(false);
  std::vector<at::Tensor> outs;
  {
    interp::HookRunnerScope scope(&runner);
    outs = e.exe(release ? std::move(w.tensors) : w.tensors);
  }
  variable_list result;
  if (r.accumulate_grad) {
    for (size_t i = 0; i < e.acc_output.size(); ++i) {
      const int p = e.acc_output[i];
      if (p < 0) continue;
      ca::accumulate(*w.nodes[w.accumulate[i]], std::move(outs[static_cast<size_t>(p)]));
    }
  }
  for (int p : e.grad_output) result.push_back(p < 0 ? at::Tensor() : outs[static_cast<size_t>(p)]);
  return result;
}

// The nodes that compute `outputs` or call a hook, in graph order.
std::vector<ir::NodeId> live_nodes(const ir::Graph& g, const std::vector<ir::ValueId>& outputs) {
  std::vector<char> live(g.nodes().size(), 0);
  std::vector<ir::NodeId> todo;
  auto need = [&](ir::ValueId v) {
    if (v == ir::kNoValue) return;
    const ir::NodeId p = g.value(v).producer;
    if (!live[static_cast<size_t>(p)]) {
      live[static_cast<size_t>(p)] = 1;
      todo.push_back(p);
    }
  };
  for (ir::ValueId v : outputs) need(v);
  for (const auto& n : g.nodes()) {
    if (n.kind == ir::NodeKind::CallHook && !live[static_cast<size_t>(n.id)]) {
      live[static_cast<size_t>(n.id)] = 1;
      todo.push_back(n.id);
    }
  }
  while (!todo.empty()) {
    const ir::NodeId id = todo.back();
    todo.pop_back();
    ir::for_each_value(g.node(id).args, need);
  }
  std::vector<ir::NodeId> out;
  for (const auto& n : g.nodes()) {
    if (live[static_cast<size_t>(n.id)] && n.kind != ir::NodeKind::Input) out.push_back(n.id);
  }
  return out;
}

Runtime::Recorded Runtime::record(const Request& r, const ca::BackwardWalk& w) {
  Recorded out;
  capture::Session s(CaptureOptions{});
  std::unordered_map<const Node*, std::string> labels;
  for (uint32_t i = 0; i < w.nodes.size(); ++i) labels.emplace(w.nodes[i], w.label(i));
  capture::HookWrapScope::NodeLabeler labeler = [&labels](const Node& n) {
    auto it = labels.find(&n);
    return it == labels.end() ? n.name() : it->second;
  };
  s.set_node_labeler(labeler);
  std::vector<ir::ValueId> inputs;
  std::vector<ir::InputKind> kinds;
  std::vector<std::string> names;
  for (size_t k = 0; k < w.tensors.size(); ++k) {
    const uint32_t node = w.tensor_node[k];
    const bool tangent = node == 0;
    const std::string& type = *w.names[node];  // "MulBackward0", "torch::autograd::CppNode<...>"
    const size_t colon = type.rfind(':');
    names.push_back(tangent ? "tangents_" + std::to_string(k)
                            : type.substr(colon == std::string::npos ? 0 : colon + 1) + "_" + std::to_string(node) +
                                  "_saved_" + std::to_string(k));
    kinds.push_back(tangent ? ir::InputKind::Tangent : ir::InputKind::Saved);
    inputs.push_back(s.declare_input(w.tensors[k], names.back(), kinds.back()));
  }
  capture::HookWrapScope::SlotOf slots;
  for (size_t k = 0; k < w.hooks.size(); ++k) slots.emplace(w.hooks[k].object, static_cast<int>(k));

  variable_list& results = out.results;
  std::vector<ir::ValueId> delivered;
  std::vector<char> in_graph;
  {
    ca::Markers markers(w, &s, r.accumulate_grad);
    capture::HookWrapScope wrap(r.root, &slots, &labeler);
    capture::RecordingScope recording(&s);
    r.prepare_capture();
    s.begin_backward({});
    struct End {
      capture::Session& s;
      ~End() { s.end_backward(); }
    } end{s};
    results = r.run();
    delivered = markers.delivered;
    in_graph = markers.in_graph;
  }

  out.entry = std::make_shared<BackwardEntry>();
  BackwardEntry* entry = out.entry.get();
  entry->guards.check_global = false;
  entry->guards.structure = std::string(w.key());
  for (const auto& sz : w.sizes) {
    entry->guards.sizes.push_back(sz.value);
    entry->guards.size_labels.push_back(w.label(sz.node));
  }
  entry->node_key_end = w.node_key_end;
  entry->keep_alive = w.keep_alive;
  entry->num_hooks = w.hooks.size();
  entry->accumulates_in_graph = std::any_of(in_graph.begin(), in_graph.end(), [](char c) { return c != 0; });
  std::vector<ir::ValueId> outs;
  std::vector<std::string> out_names;
  std::string& why = out.why;
  why = s.unreplayable_reason();  // Note [Output shapes that depend on values]
  // Note [Sizes that come from values]: a compiled backward cannot stop and look on.
  if (why.empty()) {
    const ir::Graph& recorded = s.graph();
    for (const auto& n : recorded.nodes()) {
      if (!ir::sizes_from_values(recorded, n)) continue;
      why = n.qualified_op() + " has a data-dependent output shape (its output sizes come from values), which a "
                               "compiled backward cannot check";
      break;
    }
  }
  if (r.accumulate_grad) {
    for (size_t i = 0; i < delivered.size(); ++i) {
      if (delivered[i] == ir::kNoValue || in_graph[i]) {
        entry->acc_output.push_back(-1);
        continue;
      }
      entry->acc_output.push_back(static_cast<int>(outs.size()));
      outs.push_back(delivered[i]);
      out_names.push_back("grad_" + std::to_string(w.accumulate[i]));
    }
  }
  for (size_t j = 0; j < results.size(); ++j) {
    if (!results[j].defined()) {
      entry->grad_output.push_back(-1);
      continue;
    }
    auto v = s.lookup(results[j]);
    if (!v) {
      why = "grad() returned a gradient that was not recorded";
      break;
    }
    entry->grad_output.push_back(static_cast<int>(outs.size()));
    outs.push_back(*v);
    out_names.push_back("grad_output_" + std::to_string(j));
  }
  ir::Graph& graph = out.graph;
  if (why.empty()) {
    const ir::Graph& rec = s.graph();
    auto nodes = live_nodes(rec, outs);
    const std::set<ir::ValueId> declared(inputs.begin(), inputs.end());
    for (ir::NodeId id : nodes) {
      ir::for_each_value(rec.node(id).args, [&](ir::ValueId v) {
        const auto& p = rec.node(rec.value(v).producer);
        if (why.empty() && p.kind == ir::NodeKind::Input && !declared.count(v)) {
          why = "the backward reads a tensor that is neither a root gradient nor saved by a node (" +
                ir::describe(rec, v) + ", read by " + rec.node(id).qualified_op() + " in " + rec.node(id).autograd_node + ")";
        }
      });
    }
    for (ir::NodeId id : nodes) {
      const auto& n = rec.node(id);
      if (why.empty() && n.kind == ir::NodeKind::Call && n.hook >= 0) why = "an op ran inside a hook that was not wrapped";
    }
    if (why.empty()) {
      try {
        graph = ir::extract_subgraph(rec, nodes, inputs, kinds, names, outs, out_names,
                                     std::vector<ir::OutputKind>(outs.size(), ir::OutputKind::Grad));
        graph.meta()["producer"] = "tcap compiled autograd";
      } catch (const c10::Error& e) {
        why = first_line(e.what_without_backtrace());
      }
    }
  }
  return out;
}

variable_list Runtime::check(const Request& r, const ca::BackwardWalk& w, const BackwardEntry& e, const std::vector<int64_t>& key,
                             std::string* verdict) {
  Recorded rec = record(r, w);
  *verdict = e.guards.dyn.ledger->check(
      key, rec.graph, rec.why.empty() ? "" : "no graph can be made of this backward at these sizes: " + rec.why);
  return std::move(rec.results);
}

variable_list Runtime::capture(const Request& r, const ca::BackwardWalk& w,
                               const std::shared_ptr<const BackwardEntry>& size_miss_of, const std::vector<size_t>& changed) {
  count(&CompileStats::captures);
  const auto t0 = std::chrono::steady_clock::now();
  Recorded rec = record(r, w);
  variable_list& results = rec.results;
  const std::shared_ptr<BackwardEntry>& entry = rec.entry;
  const ir::Graph& graph = rec.graph;
  if (!rec.why.empty()) {
    {
      std::lock_guard<std::mutex> lock(cache_->mutex);
      cache_->eager_keys.emplace(w.key());
    }
    cache::report_fallback("compiled autograd", "this backward graph, from now on: " + rec.why);
    return results;
  }
  entry->id = cache_->entries.next_id();
  const std::string what = opts().name + ".ca" + std::to_string(entry->id);
  TCAP_LOG(CompiledAutograd, "TRACED GRAPH\n===== Compiled autograd graph " << entry->id << " =====\n"
                                 << ir::to_string(graph));
  if (log_enabled(LogChannel::CompiledAutogradVerbose)) {
    std::ostringstream s2;
    for (size_t i = 0; i < entry->guards.sizes.size(); ++i) s2 << " " << i << ":" << entry->guards.sizes[i];
    TCAP_LOG(CompiledAutogradVerbose, what << ": " << w.nodes.size() << " autograd nodes, " << w.tensors.size()
                                           << " tensors, " << w.hooks.size() << " hooks, sizes" << s2.str() << "\n"
                                           << ir::to_table(graph));
  }
  if (!opts().dump_dir.empty()) {
    try {
      ir::save_json(graph, opts().dump_dir + "/" + what + ".backward.json");
    } catch (const std::exception& e) {
      TCAP_LOG(CompiledAutograd, "could not dump " << what << ": " << e.what());
    }
  }
  try {
    entry->graph = graph;
    entry->exe = compile_backward(graph, what);
  } catch (const c10::Error& e) {
    {
      std::lock_guard<std::mutex> lock(cache_->mutex);
      cache_->eager_keys.emplace(w.key());
    }
    cache::report_fallback("compiled autograd", what + " could not be compiled; it runs eagerly from now on: " +
                                                    first_line(e.what_without_backtrace()));
    return results;
  }
  if (size_miss_of) {
    const std::string g = generalize(*size_miss_of, *entry, changed);
    if (g.empty()) {
      TCAP_LOG(Recompiles, "compiled autograd: " << what << " is dynamic in " << changed.size() << " sizes ("
                                                  << entry->guards.dyn.patches.size() << " integers follow them): "
                                                  << entry->guards.describe_dynamic());
    } else {
      TCAP_LOG(Recompiles, "compiled autograd: " << what << " stays static: " << g);
    }
  }
  cache_->entries.add(entry);
  count(&CompileStats::compiles);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TCAP_LOG(Perf, "compiled autograd: " << what << " captured and compiled in " << ms << " ms");
  return results;
}

std::string Runtime::generalize(const BackwardEntry& a, BackwardEntry& b, const std::vector<size_t>& changed) {
  if (a.acc_output != b.acc_output || a.grad_output != b.grad_output) {
    return "the graphs recorded at the two sizes differ in structure";
  }
  // Note [Checking a new size]: the record is the graph itself, so every specialization is
  // checked whole and an integer two sizes explain alike may take the first.
  const bool first_fit = opts().check_new_sizes;
  std::string why = cache::generalize(a.graph, a.guards.sizes, b.graph, b.guards.sizes, changed, &b.guards.dyn, first_fit);
  if (why.empty()) why = cache::make_ledger(a.graph, a.guards.sizes, b.graph, b.guards.sizes, b.guards.dyn, {}, first_fit);
  if (!why.empty()) b.guards.dyn = cache::DynamicSizes{};
  return why;
}

std::shared_ptr<const BackwardEntry> Runtime::specialize(const std::shared_ptr<const BackwardEntry>& e, const std::vector<int64_t>& key) {
  if (!e->guards.dyn.dynamic() || key == e->guards.dyn.own_key) return e;
  if (auto s = e->specialized->find(key)) return s;
  auto s = std::make_shared<BackwardEntry>();
  s->id = e->id;
  s->guards.check_global = false;
  static_cast<BackwardPlan&>(*s) = static_cast<const BackwardPlan&>(*e);
  s->graph = cache::specialize(e->graph, e->guards.dyn, key);
  const std::string what = opts().name + ".ca" + std::to_string(e->id) + ".sizes";
  try {
    s->exe = compile_backward(s->graph, what);
  } catch (const c10::Error& err) {
    TCAP_LOG(Recompiles, "compiled autograd: specialising entry " << e->id << " failed ("
                                                                 << first_line(err.what_without_backtrace()) << "); recapturing");
    return nullptr;
  }
  count(&CompileStats::compiles);
  TCAP_LOG(Recompiles, "compiled autograd: entry " << e->id << " specialized to sizes " << c10::IntArrayRef(key)
                                                  << " of its dynamic sizes (no recapture)");
  return e->specialized->insert(key, std::move(s));
}

}  // namespace

struct CompiledAutogradGuard::Impl {
  explicit Impl(CompiledAutogradOptions o) : runtime(cache_for(o)), handler_scope(&runtime) {
    if (o.use_engine_hook) {
      try {
        lease = std::make_unique<capture::EngineHookLease>(&capture::capture_backward_driver);
      } catch (const std::exception& e) {
        TCAP_LOG(CompiledAutograd, "compiled autograd: the engine hook could not be installed ("
                                       << first_line(e.what()) << "); only the guard's backward()/grad() are compiled");
      }
    }
  }
  Runtime runtime;
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
    Request r;
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
  for (const auto& e : *impl_->runtime.cache().entries.entries()) out.push_back(static_cast<const BackwardEntry&>(*e).graph);
  return out;
}

void reset_compiled_autograd() {
  std::lock_guard<std::mutex> lock(g_caches_mutex);
  caches().clear();
}

}  // namespace tcap
