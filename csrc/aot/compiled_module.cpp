// The out-of-line parts of tcap::CompiledModule (Note [Compiled modules] in
// include/tcap/compile.h): one compiled function per forward arity, and their stats,
// entries and eager reasons taken together.
#include <tcap/compile.h>

#include "cache/stats.h"

#include <iterator>

namespace tcap {

namespace detail {

CompiledFunction* ArityFunctions::get_or_make(size_t arity, const std::function<CompiledFn()>& make) {
  TORCH_CHECK(arity < kMaxArity, "tcap: a compiled module's forward takes at most ", kMaxArity - 1,
              " tensors; compile a forward of more with tcap::compile(module, fn)");
  std::lock_guard<std::mutex> lock(mutex_);
  if (CompiledFunction* f = fns_[arity].load(std::memory_order_acquire)) return f;
  owned_.push_back(make().ptr());
  fns_[arity].store(owned_.back().get(), std::memory_order_release);
  return owned_.back().get();
}

std::vector<std::shared_ptr<CompiledFunction>> ArityFunctions::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return owned_;
}

CompileStats sum_stats(const std::vector<std::shared_ptr<CompiledFunction>>& fns) {
  CompileStats sum;
  for (const auto& f : fns) {
    const CompileStats s = f->stats();
    for (int CompileStats::*field : cache::Stats::kFields) sum.*field += s.*field;
    sum.lookup_us += s.lookup_us;
  }
  return sum;
}

std::vector<CompiledEntryInfo> all_entries(const std::vector<std::shared_ptr<CompiledFunction>>& fns) {
  std::vector<CompiledEntryInfo> out;
  for (const auto& f : fns) {
    auto e = f->entries();
    out.insert(out.end(), std::make_move_iterator(e.begin()), std::make_move_iterator(e.end()));
  }
  return out;
}

std::string first_eager_reason(const std::vector<std::shared_ptr<CompiledFunction>>& fns) {
  for (const auto& f : fns) {
    std::string why = f->eager_reason();
    if (!why.empty()) return why;
  }
  return "";
}

}  // namespace detail

}  // namespace tcap
