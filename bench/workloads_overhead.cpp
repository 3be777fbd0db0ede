// overhead_empty: what a compiled call costs when its graph does nothing, and what the
// guard check of a hit costs alone (Note [What overhead_empty measures]).
//
// Note [What overhead_empty measures]
// A function of kInputs tensors (odd small shapes, half of them requiring grad, one
// non-contiguous) whose body runs no op: it returns nothing. One iteration makes kCalls
// calls; `call_us` is µs per call. Variants:
//   eager        the function called through its std::function (the floor: a call and an
//                empty vector);
//   call         tcap::compile of it, replayed (guards, entry lookup, replay of an empty
//                graph); every timed call must be a replay;
//   lookup       cache::EntryCache::lookup alone, on a cache holding the one entry whose
//                guards a call of these inputs records (guards, held tensors, alias
//                classes: what a hit pays before its replay);
//   guard_check  cache::Guards::check alone on the same guards (global state, per tensor
//                dtype/device/requires_grad/sizes/strides);
//   context_check  the part of guard_check that compares at::globalContext()'s 39
//                settings with the captured ones;
//   lookup_8, scan_8  a cache of eight entries that the call fits only the last of:
//                EntryCache::lookup, and the eight guard checks whole (Note [The failing
//                guard first]).
// lookup and guard_check use tcap's internal headers (csrc/cache/): they time the very
// functions the front doors call.
#include "workloads.h"

#include "cache/entry_cache.h"
#include "cache/guards.h"

#include <tcap/compile.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tcap::bench {

namespace {

using Tensors = std::vector<at::Tensor>;

constexpr int kInputs = 10;
constexpr int kCalls = 20;

Tensors empty_body(const Tensors& /*inputs*/) { return {}; }

Tensors make_inputs() {
  Tensors in;
  for (int k = 0; k < kInputs; ++k) {
    at::Tensor t = torch::randn({3 + k % 4, 5 + k % 3});
    if (k == kInputs - 1) t = t.t();  // one non-contiguous input
    if (k % 2 == 0) t.requires_grad_(true);
    in.push_back(t);
  }
  return in;
}

std::vector<Variant> make_overhead_empty(const Options& opts) {
  auto inputs = std::make_shared<Tensors>(make_inputs());
  std::vector<Variant> variants;
  if (opts.wants("eager")) {
    CompiledFunction::Fn fn = empty_body;
    variants.emplace_back(
        "eager",
        [fn, inputs](Sample& s) {
          s.start();
          for (int i = 0; i < kCalls; ++i) fn(*inputs);
          s.stop("call_us");
        },
        kCalls);
  }
  if (opts.wants("call")) {
    CompileOptions o;
    o.name = "overhead_empty";
    auto f = tcap::compile(empty_body, o);
    (*f)(*inputs);  // captures and compiles (no backward: no output)
    (*f)(*inputs);
    if (f->stats().replays != 1 || !f->eager_reason().empty()) {
      variants.push_back(Variant::skip("call", "the second call was not a compiled replay (" + f->eager_reason() + ")",
                                       /*failed=*/true));
    } else {
      variants.emplace_back(
          "call",
          [f, inputs](Sample& s) {
            const int before = f->stats().replays;
            s.start();
            for (int i = 0; i < kCalls; ++i) (*f)(*inputs);
            s.stop("call_us");
            if (f->stats().replays != before + kCalls) throw std::runtime_error("a timed call was not a replay");
          },
          kCalls);
    }
  }
  // The guards a call of these inputs records, as tcap::compile's capture records them.
  auto entry = std::make_shared<cache::Entry>();
  std::vector<std::string> names;
  for (int k = 0; k < kInputs; ++k) names.push_back("in" + std::to_string(k));
  cache::CallView view;
  view.tensors = *inputs;
  entry->guards.capture_call(view, names, std::vector<bool>(kInputs, false));
  entry->guards.aliases = cache::AliasGeometry::of(*inputs);
  // kCalls hits of `hit` (one call's view of the inputs) per iteration, each checked.
  auto hits = [inputs](const char* name, std::function<bool(const cache::CallView&)> hit) {
    return Variant(
        name,
        [inputs, hit = std::move(hit), name](Sample& s) {
          cache::CallView v;
          v.tensors = *inputs;
          bool all = true;
          s.start();
          for (int i = 0; i < kCalls; ++i) all = hit(v) && all;
          s.stop("call_us");
          if (!all) throw std::runtime_error(std::string(name) + " missed");
        },
        kCalls);
  };
  if (opts.wants("lookup")) {
    auto c = std::make_shared<cache::EntryCache>("'overhead_empty'", 8, false);
    c->add(entry);
    variants.push_back(hits("lookup", [c, inputs](const cache::CallView& v) { return c->lookup(v, *inputs).hit != nullptr; }));
  }
  // Note [The failing guard first]: eight entries, the first seven recorded with the last
  // input in another dtype, the call fitting the eighth. lookup_8 is EntryCache::lookup
  // (after the first entry, each one's last failing guard alone, checked first);
  // scan_8 checks the eight entries' guards whole, one after the other, as a lookup did
  // before.
  if (opts.wants("lookup_8") || opts.wants("scan_8")) {
    auto c = std::make_shared<cache::EntryCache>("'overhead_empty'", 8, false);
    for (at::ScalarType other : {at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kShort, at::kChar}) {
      Tensors in = *inputs;
      in.back() = in.back().detach().to(other);
      cache::CallView v;
      v.tensors = in;
      auto e = std::make_shared<cache::Entry>();
      e->guards.capture_call(v, names, std::vector<bool>(kInputs, false));
      e->guards.aliases = cache::AliasGeometry::of(in);
      c->add(e);
    }
    c->add(entry);
    if (opts.wants("lookup_8")) {
      variants.push_back(hits("lookup_8", [c, inputs](const cache::CallView& v) {
        return c->lookup(v, *inputs).hit != nullptr;
      }));
    }
    if (opts.wants("scan_8")) {
      variants.push_back(hits("scan_8", [c](const cache::CallView& v) {
        bool hit = false;
        for (const auto& e : *c->entries()) hit = e->guards.check(v).hit();
        return hit;
      }));
    }
  }
  if (opts.wants("guard_check")) {
    variants.push_back(hits("guard_check", [entry](const cache::CallView& v) { return entry->guards.check(v).hit(); }));
  }
  if (opts.wants("context_check")) {
    // The at::Context part of guard_check alone (Note [Settings of at::Context]).
    auto captured = std::make_shared<cache::ContextValues>(cache::read_context());
    variants.push_back(hits("context_check", [captured](const cache::CallView&) { return cache::context_matches(*captured); }));
  }
  return variants;
}

}  // namespace

void add_overhead_workloads(Registry& registry) {
  registry.add(Workload{"overhead_empty",
                        "a compiled function of 10 small tensors whose body runs no op: the full call, the entry "
                        "lookup and the guard check alone; µs per call",
                        make_overhead_empty, nullptr});
}

}  // namespace tcap::bench
