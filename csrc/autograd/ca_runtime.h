// The compiled autograd runtime's types (Note [Compiled autograd], compiled_autograd.cpp),
// shared by its three files: compiled_autograd.cpp (the front door, the cache per options,
// the guard), ca_replay.cpp (replaying an entry, verified or not) and ca_capture.cpp (a
// backward recorded, compiled, generalized over sizes and specialized).
#pragma once

#include <tcap/compiled_autograd.h>
#include <tcap/interpreter.h>

#include "autograd/walk.h"
#include "cache/entry_cache.h"
#include "cache/verify.h"
#include "capture/engine_shim.h"
#include "compiler/pipeline.h"
#include "interp/hook_runner.h"
#include "runtime/background_compiles.h"

#include <torch/csrc/autograd/function.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tcap::ca {

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
  cache::VerifyCounter verifier;  // verify mode: which hits to check
};

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

  // The options' bw_compiler when set (torch's compiled_autograd.enable(compiler_fn)),
  // else the backend.
  static Executable compile_backward(const CompileOptions& o, const ir::Graph& g, const std::string& what) {
    return compiler::compile_graph(g, o, what, o.bw_compiler);
  }

 private:
  struct ServedCall;
  const CompileOptions& opts() const { return cache_->options.compile; }
  Executable compile_backward(const ir::Graph& g, const std::string& what) const {
    return compile_backward(opts(), g, what);
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
  // Note [Checking a new size]: the backward run while recording (into `recorded`, which
  // the entry cache compares with dynamic entries' graphs); returns the backward's results.
  variable_list check(const Request& r, const ca::BackwardWalk& w, cache::SizeCheckRecording* recorded);
  std::shared_ptr<const BackwardEntry> specialize(const std::shared_ptr<const BackwardEntry>& e, const std::vector<int64_t>& key);
  // Note [Specializations in the background]: e at class values `key`, made on the
  // background compile thread; null while it is being made, or where making it failed.
  std::shared_ptr<const BackwardEntry> specialize_in_background(const std::shared_ptr<const BackwardEntry>& e,
                                                                const std::vector<int64_t>& key);
  bool in_background() const { return runtime::background_compiles_on(opts()); }
  void generalize(const BackwardEntry& a, BackwardEntry& b, const std::vector<size_t>& changed);
  std::string miss_reason(const ca::BackwardWalk& w, const cache::Lookup& l) const;
  std::shared_ptr<Cache> cache_;
};

}  // namespace tcap::ca
