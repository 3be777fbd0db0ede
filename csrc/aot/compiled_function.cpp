// tcap::compile (include/tcap/compile.h): the front door for functions and modules.
//
// A call is served by the entry cache (cache/entry_cache.h): guards checked, a hit
// replayed (aot/replay_function.h). A miss captures: the function runs eagerly with
// recording on, and its joint graph is compiled when its backward has run
// (aot/pending_capture.h), or at once when it needs none. What stays eager, and why, is
// the cache's to decide and log (Note [Never wrong, never silent]).
#include <tcap/compile.h>

#include "aot/pending_capture.h"
#include "aot/region.h"
#include "aot/region_entry.h"
#include "aot/replay_function.h"
#include "aot/verify_region.h"
#include "cache/unused_options.h"
#include "cache/verify.h"
#include "runtime/background_compiles.h"
#include "support/logging.h"

#include <tcap/interpreter.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>

namespace tcap {

using aot::RegionEntry;

struct CompiledFunction::Impl {
  Fn fn;
  CompileOptions options;
  // The modules given (compile(module), CompileOptions::modules): their parameters and
  // buffers are inputs of every graph, their state is guarded (Note [Module state guards]).
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  std::atomic<size_t> module_tensor_count{0};  // at the last call (a capacity hint)
  std::unique_ptr<cache::EntryCache> cache;
  cache::VerifyCounter verifier;  // verify mode: which replays to check
  std::atomic<bool> contract_logged{false};
  std::mutex capture_mutex;  // Note [One capture at a time]
  std::mutex pending_mutex;
  std::shared_ptr<aot::PendingCapture> pending;  // the capture waiting for its backward
  bool settling = false;  // a call is giving `pending` up (Note [Waiting for the first backward])

  std::string who() const { return "'" + options.name + "'"; }
  // Note [Specializations in the background]
  bool in_background() const { return runtime::background_compiles_on(options); }


  // A call run eagerly outside the serving loop's own decisions (a capture waiting for
  // its backward).
  std::vector<at::Tensor> run_eager(const std::vector<at::Tensor>& inputs) {
    cache->stats().count(&CompileStats::eager_calls);
    return fn(inputs);
  }

  // Publishes a compiled entry, generalizing it over the sizes that changed when it was
  // captured (Note [Dynamic sizes]).
  // With `replaces`, e generalizes that entry's host values (Note [Observed host values]).
  void publish(const std::shared_ptr<RegionEntry>& e, const std::shared_ptr<cache::Entry>& size_miss_of,
               const std::vector<size_t>& changed, const std::shared_ptr<const RegionEntry>& replaces = nullptr) {
    std::shared_ptr<cache::Entry> gone = std::const_pointer_cast<RegionEntry>(replaces);
    if (size_miss_of && !replaces) {
      aot::generalize(static_cast<const RegionEntry&>(*size_miss_of), *e, changed, who());
      gone = cache::take_place_of_static(size_miss_of, *e, who());  // Note [A dynamic entry takes the place of the static one]
    }
    cache->add(e, gone);
    cache->stats().count(&CompileStats::compiles);
    if (!contract_logged.exchange(true)) aot::log_contract(*e, who());
  }

  struct ServedCall;
  std::vector<at::Tensor> call(const std::vector<at::Tensor>& user_inputs);
  // The capture's inputs: the user's, then the modules' parameters and buffers (read with
  // names into `named`).
  std::vector<std::pair<at::Tensor, std::pair<ir::InputKind, std::string>>> declared_inputs(
      const std::vector<at::Tensor>& user_inputs, cache::ModuleView& named, std::vector<std::string>& names,
      std::vector<bool>& identity) const;
  // Note [Checking a new size]: runs the function while recording its forward (into
  // `recorded`, which the entry cache compares with dynamic entries' records), and returns
  // its outputs.
  std::vector<at::Tensor> check_call(const std::vector<at::Tensor>& user_inputs, cache::SizeCheckRecording* recorded);
  std::vector<at::Tensor> capture_call(const std::vector<at::Tensor>& user_inputs,
                                       const std::vector<at::Tensor>& call_inputs, const cache::Lookup& miss);
  // While a capture waits for its backward; nullopt when there is none (or it finished).
  // `published`: an entry was compiled from it just now.
  std::optional<std::vector<at::Tensor>> while_pending(const std::vector<at::Tensor>& user_inputs, bool* published);
  void collect_pending();
};

void CompiledFunction::Impl::collect_pending() {
  std::shared_ptr<aot::PendingCapture> p;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (!pending || !pending->finished()) return;
    p = std::move(pending);
    pending.reset();
  }
  p->close();
  std::string failure;
  bool replaces = false;
  if (auto e = p->result(&failure, &replaces)) {
    publish(e, p->size_miss_of, p->changed, replaces ? p->host_miss_of : nullptr);
  } else {
    cache->fall_back("its backward could not be captured: " + failure);
  }
}

std::optional<std::vector<at::Tensor>> CompiledFunction::Impl::while_pending(const std::vector<at::Tensor>& user_inputs,
                                                                          bool* published) {
  std::shared_ptr<aot::PendingCapture> p;
  aot::PendingCapture::Waited waited;
  {
    std::unique_lock<std::mutex> lock(pending_mutex);
    if (!pending) return std::nullopt;
    // The first call's backward has not run yet: stay eager until it does, or until the
    // capture is given up (Note [Waiting for the first backward]). While one call gives
    // it up, `pending` stays set (settling), so that no other call starts a capture of
    // the same entry meanwhile.
    waited = settling ? aot::PendingCapture::Waited::StayEager : pending->note_call();
    if (waited == aot::PendingCapture::Waited::StayEager) {
      lock.unlock();
      return run_eager(user_inputs);
    }
    p = pending;
    settling = true;
  }
  // Ends the settling: the capture goes unless a backward is completing it.
  auto settle = [&](bool gone) {
    std::lock_guard<std::mutex> lock(pending_mutex);
    settling = false;
    if (gone && pending == p) pending.reset();
  };
  if (waited == aot::PendingCapture::Waited::CaptureAgain) {
    if (!p->drop()) {
      settle(false);  // a backward on another thread is recording it now: wait for that
      return run_eager(user_inputs);
    }
    settle(true);
    TCAP_LOG(Recompiles, who() << ": the first call's backward has not come while "
                               << aot::PendingCapture::kOtherThreadCalls
                               << " calls ran on other threads; its capture is dropped and this thread captures "
                                  "again (Note [Waiting for the first backward])");
    return std::nullopt;  // the serving loop misses again, and this call captures
  }
  try {
    bool replaces = false;
    auto e = p->compile_forward_only(&replaces);
    if (!e) {
      settle(false);  // a backward on another thread is recording the capture now
      return run_eager(user_inputs);
    }
    publish(e, p->size_miss_of, p->changed, replaces ? p->host_miss_of : nullptr);
    settle(true);
    *published = true;
    TCAP_LOG(GraphBreaks, who() << ": no backward reached the first call; compiled its forward alone "
                                   "(a backward will recompute)");
  } catch (const c10::Error& err) {
    settle(true);
    cache->fall_back(err.what_without_backtrace());
  } catch (...) {
    settle(true);  // the capture was abandoned: a later call captures again
    throw;
  }
  return std::nullopt;  // the serving loop looks again (Note [The serving loop])
}

// A call of tcap::compile through the serving loop (Note [The serving loop]).
struct CompiledFunction::Impl::ServedCall {
  using Out = std::vector<at::Tensor>;
  Impl& f;
  const std::vector<at::Tensor>& user_inputs;
  std::vector<at::Tensor> call_inputs;
  cache::CallView call_view;
  std::unique_lock<std::mutex> slot;  // Note [One capture at a time]

  std::optional<Out> before() {
    f.collect_pending();
    // The modules as they are now (Note [Module state guards]): their parameters then
    // buffers, in named_parameters(true) / named_buffers(true) order, read in place.
    thread_local cache::ModuleView live;
    cache::read_modules(f.modules, live, /*with_names=*/false);
    call_inputs.reserve(user_inputs.size() + f.module_tensor_count.load(std::memory_order_relaxed));
    call_inputs.insert(call_inputs.end(), user_inputs.begin(), user_inputs.end());
    live.append_tensors(/*buffers=*/false, call_inputs);
    live.append_tensors(/*buffers=*/true, call_inputs);
    f.module_tensor_count.store(call_inputs.size() - user_inputs.size(), std::memory_order_relaxed);
    call_view.tensors = call_inputs;
    call_view.modules = f.modules.empty() ? nullptr : &live;
    return std::nullopt;
  }
  const cache::CallView& view() const { return call_view; }
  const std::vector<at::Tensor>& primals() const { return call_inputs; }

  std::optional<Out> replay(const cache::Lookup& found, bool first) {
    auto e = std::static_pointer_cast<const RegionEntry>(found.hit);
    // Note [Autograd Functions in a region]: no compiled backward, and its forward's
    // derivative is not that of the ops it recorded.
    if (!e->has_backward && !e->autograd_function.empty() && e->use_function && at::GradMode::is_enabled() &&
        torch::autograd::any_variable_requires_grad(found.primals)) {
      cache::report_fallback(f.who() + " entry " + std::to_string(e->id) + " (a call that needs a gradient)",
                             "its forward calls an autograd Function (" + e->autograd_function +
                                 " ran inside it) whose backward no capture saw (the first call's gradient came "
                                 "from grad(), or none came), and differentiating the ops it recorded is not its "
                                 "backward");
      return f.run_eager(user_inputs);
    }
    // Published by another call while this one waited for the capture slot: let the next
    // capture start while this call replays.
    if (!first) slot.unlock();
    auto entry = f.in_background() ? aot::specialize_in_background(e, found.key, found.primals, f.options)
                                   : aot::specialize(e, found.key, found.primals, f.options);
    if (!entry) return f.run_eager(user_inputs);  // Note [Specializations in the background]: being made
    if (!first) {
      try {
        return aot::replay_region(entry, found.primals);
      } catch (const HostValueChanged&) {
        slot.lock();  // not this one: look on, or capture
        throw;
      }
    }
    const VerifyOptions v = cache::verify_options_for(f.options);
    if (f.verifier.next(v)) {
      return aot::verified_call(
          entry, *e, found.primals, user_inputs.size(),
          [&](const std::vector<at::Tensor>* leaves) { return f.fn(leaves ? *leaves : user_inputs); }, f.options, v);
    }
    return aot::replay_region(entry, found.primals);
  }

  // The capture that waited, compiled just now (*look_again), may serve the call.
  std::optional<Out> after_miss(bool* look_again) { return f.while_pending(user_inputs, look_again); }

  void explain(cache::Lookup& miss, std::string& note) const {
    if (miss.host_miss_of && !f.options.observe_host_values) {
      note += " (if host code only logs or returns this value, CompileOptions::observe_host_values = true makes it "
              "an observation instead of a guard)";
    }
  }

  // Note [One capture at a time]: threads that miss together (the first calls of a served
  // model) would each capture, and fill the cache with copies of one entry. One captures;
  // a call that misses meanwhile runs eagerly (by design, not a fallback), and the capturer
  // looks again first, at the entries other threads published since its lookup.
  bool exclusive() {
    slot = std::unique_lock<std::mutex>(f.capture_mutex, std::try_to_lock);
    return slot.owns_lock();
  }

  Out capture(const cache::Lookup& miss) { return f.capture_call(user_inputs, call_inputs, miss); }
  Out eager(const std::string&) { return f.fn(user_inputs); }
  std::optional<Out> check(cache::SizeCheckRecording* recorded) {
    if (slot.owns_lock()) slot.unlock();  // a check compiles nothing: the next capture may start
    return f.check_call(user_inputs, recorded);
  }
};

std::vector<at::Tensor> CompiledFunction::Impl::call(const std::vector<at::Tensor>& user_inputs) {
  ServedCall c{*this, user_inputs, {}, {}, {}};
  return cache->serve_call(c);
}

std::vector<at::Tensor> CompiledFunction::Impl::capture_call(const std::vector<at::Tensor>& user_inputs,
                                                             const std::vector<at::Tensor>& call_inputs,
                                                             const cache::Lookup& miss) {
  cache->stats().count(&CompileStats::captures);
  std::vector<std::string> names;
  std::vector<bool> identity;
  auto entry = std::make_shared<RegionEntry>();
  const auto decl = declared_inputs(user_inputs, entry->guards.modules, names, identity);
  TORCH_INTERNAL_ASSERT(decl.size() == call_inputs.size(), "tcap: the module tensors of a call changed under it");
  entry->id = cache->next_id();
  entry->fn_name = options.name;
  entry->stats = cache->shared_stats();
  cache::CallView view;
  view.tensors = call_inputs;
  entry->guards.capture_call(view, names, identity);

  auto cap = std::make_shared<aot::RegionCapture>();
  const bool grad_mode = at::GradMode::is_enabled();
  auto outs = cap->record_forward([&] { return fn(user_inputs); }, decl);
  std::string why = cap->check_forward(outs);
  if (!why.empty()) {
    cache->fall_back(why);
    return outs;
  }
  entry->forward_record = cap->joint_without_backward().graph;
  // Tensors the function read beyond its declared inputs (Note [Held tensors]).
  const auto primals = cap->primal_tensors();
  const auto& joint_inputs = cap->session().graph();
  std::vector<at::Tensor> held(primals.begin() + static_cast<std::ptrdiff_t>(call_inputs.size()), primals.end());
  std::vector<std::string> held_names;
  const auto inputs = joint_inputs.input_nodes();
  for (size_t j = call_inputs.size(); j < primals.size() && j < inputs.size(); ++j) {
    held_names.push_back(joint_inputs.node(inputs[j]).name);
  }
  entry->guards.held.hold(held, held_names);

  const bool needs_backward =
      grad_mode && std::any_of(outs.begin(), outs.end(), [](const at::Tensor& t) { return t.requires_grad(); });
  if (!needs_backward) {
    try {
      auto older = std::static_pointer_cast<const RegionEntry>(miss.host_miss_of);
      const bool replaces = aot::compile_region(*entry, cap->joint_without_backward(), false, primals, options, older.get());
      publish(entry, miss.size_miss_of, miss.changed, replaces ? older : nullptr);
    } catch (const c10::Error& err) {
      cache->fall_back(err.what_without_backtrace());
    }
    return outs;
  }
  auto p = std::make_shared<aot::PendingCapture>(cap, entry, options);
  p->size_miss_of = miss.size_miss_of;
  p->changed = miss.changed;
  p->host_miss_of = std::static_pointer_cast<const RegionEntry>(miss.host_miss_of);
  why = p->watch(outs);
  if (!why.empty()) {
    cache->fall_back(why);
    return outs;
  }
  std::lock_guard<std::mutex> lock(pending_mutex);
  pending = std::move(p);
  return outs;
}

std::vector<std::pair<at::Tensor, std::pair<ir::InputKind, std::string>>> CompiledFunction::Impl::declared_inputs(
    const std::vector<at::Tensor>& user_inputs, cache::ModuleView& named, std::vector<std::string>& names,
    std::vector<bool>& identity) const {
  std::vector<std::pair<at::Tensor, std::pair<ir::InputKind, std::string>>> decl;
  for (size_t k = 0; k < user_inputs.size(); ++k) {
    names.push_back("in" + std::to_string(k));
    identity.push_back(false);
    TORCH_CHECK(user_inputs[k].defined(), "tcap::compile('", options.name, "'): input ", k, " is undefined");
    decl.push_back({user_inputs[k], {ir::InputKind::UserInput, names.back()}});
  }
  cache::read_modules(modules, named, /*with_names=*/true);
  for (const bool buffers : {false, true}) {
    std::vector<at::Tensor> ts;
    std::vector<std::string> tn;
    named.append_named_tensors(buffers, ts, tn);
    for (size_t j = 0; j < ts.size(); ++j) {
      names.push_back(tn[j]);
      identity.push_back(true);
      decl.push_back({ts[j], {buffers ? ir::InputKind::Buffer : ir::InputKind::Parameter, tn[j]}});
    }
  }
  return decl;
}

std::vector<at::Tensor> CompiledFunction::Impl::check_call(const std::vector<at::Tensor>& user_inputs,
                                                           cache::SizeCheckRecording* recorded) {
  std::vector<std::string> names;
  std::vector<bool> identity;
  cache::ModuleView named;
  const auto decl = declared_inputs(user_inputs, named, names, identity);
  auto cap = std::make_shared<aot::RegionCapture>();
  auto outs = cap->record_forward([&] { return fn(user_inputs); }, decl);
  const std::string why = cap->check_forward(outs);
  if (why.empty()) recorded->graph = cap->joint_without_backward().graph;
  else recorded->why_not = "its forward cannot be compiled at these sizes: " + why;
  return outs;
}

CompiledFunction::CompiledFunction(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledFunction::~CompiledFunction() = default;

std::vector<at::Tensor> CompiledFunction::operator()(const std::vector<at::Tensor>& inputs) {
  return impl_->call(inputs);
}

at::Tensor CompiledFunction::forward(const at::Tensor& x) {
  auto outs = impl_->call({x});
  TORCH_CHECK(outs.size() == 1, "tcap: forward(x) needs a function with one output, got ", outs.size());
  return outs[0];
}

CompileStats CompiledFunction::stats() const {
  impl_->collect_pending();
  return impl_->cache->stats().read();
}

std::vector<CompiledEntryInfo> CompiledFunction::entries() const {
  impl_->collect_pending();
  std::vector<CompiledEntryInfo> out;
  for (const auto& base : *impl_->cache->entries()) {
    const auto& e = static_cast<const RegionEntry&>(*base);
    CompiledEntryInfo info;
    info.joint = e.joint;
    info.partition = e.part;
    info.compile_ms = e.compile_ms;
    info.guards = e.guards.describe();
    out.push_back(std::move(info));
  }
  return out;
}

std::string CompiledFunction::eager_reason() const {
  impl_->collect_pending();
  return impl_->cache->eager_reason();
}

CompiledFn compile_function(CompiledFunction::Fn fn, CompileOptions options) {
  TORCH_CHECK(fn, "tcap::compile: the function is empty");
  TORCH_CHECK(options.cache_size_limit >= 1, "tcap::compile: cache_size_limit must be at least 1");
  for (const auto& m : options.modules) TORCH_CHECK(m, "tcap::compile: CompileOptions::modules holds a null module");
  cache::refuse_unused_options(options, cache::FrontDoor::Compile);
  auto impl = std::make_unique<CompiledFunction::Impl>();
  impl->fn = std::move(fn);
  impl->modules = options.modules;
  impl->cache = std::make_unique<cache::EntryCache>("'" + options.name + "'", options.cache_size_limit, options.dynamic,
                                                    options.check_new_sizes, options.static_dims, options.dynamic_dims);
  impl->options = std::move(options);
  return CompiledFn(std::make_shared<CompiledFunction>(std::move(impl)));
}

CompiledFn compile(std::shared_ptr<torch::nn::Module> module, CompiledFunction::Fn fn, CompileOptions options) {
  TORCH_CHECK(module, "tcap::compile: the module is null");
  options.modules.insert(options.modules.begin(), std::move(module));
  return compile_function(std::move(fn), std::move(options));
}

}  // namespace tcap
