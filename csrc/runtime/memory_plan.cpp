// Note [Memory plans] (runtime/buffer_pool.h): a graph's allocations recorded once, laid
// out in an arena, and handed out of it by later runs.
#include "runtime/pool_internal.h"

#include "support/logging.h"

#include <algorithm>

namespace tcap::runtime {

using namespace pool;

namespace pool {
namespace {

// Offsets for the allocations a recording saw freed, greedy by size (largest first, each at
// the lowest offset where no allocation alive at the same time already lies), as
// Inductor's and Static Runtime's planners do.
std::shared_ptr<const Layout> lay_out(const Recording& r) {
  auto layout = std::make_shared<Layout>();
  auto& slots = layout->slots;
  slots.resize(r.allocs.size());
  std::vector<int32_t> order;
  for (size_t k = 0; k < r.allocs.size(); ++k) {
    slots[k].size = (r.allocs[k].size + kCpuAlign - 1) / kCpuAlign * kCpuAlign;
    if (r.allocs[k].freed >= 0) order.push_back(static_cast<int32_t>(k));
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return slots[a].size > slots[b].size; });
  auto alive_together = [&](int32_t a, int32_t b) {
    const auto& x = r.allocs[static_cast<size_t>(a)];
    const auto& y = r.allocs[static_cast<size_t>(b)];
    return x.made < y.freed && y.made < x.freed;
  };
  std::vector<int32_t> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // (offset, end) of placed ones alive together
  for (int32_t k : order) {
    busy.clear();
    for (int32_t j : placed) {
      if (alive_together(k, j)) busy.emplace_back(slots[j].offset, slots[j].offset + slots[j].size);
    }
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + slots[k].size <= lo) break;
      at = std::max(at, hi);
    }
    slots[k].offset = at;
    slots[k].planned = true;
    layout->bytes = std::max(layout->bytes, at + slots[k].size);
    placed.push_back(k);
  }
  layout->planned = static_cast<int64_t>(placed.size());
  return layout;
}

void register_arena(Pool& p, Arena* a) {
  p.arenas.insert(std::upper_bound(p.arenas.begin(), p.arenas.end(), a,
                                   [](const Arena* x, const Arena* y) { return x->base < y->base; }),
                  a);
}

// Makes the arena of m's layout (`lock` holds p.mu; released while an allocator runs). A
// small one gets its own block for good; a large one is lent a pool block per run (borrow).
void make_arena(Pool& p, MemoryPlan::Impl& m, std::unique_lock<std::mutex>& lock) {
  auto* a = new Arena();
  a->layout = m.layout;
  a->lent = m.layout->bytes >= kMinPooledBytes;
  m.arena = a;
  ++m.stats.arenas_made;
  ++p.totals.arenas_made;
  if (a->lent) return;
  lock.unlock();
  char* base = static_cast<char*>(p.base->allocate(a->layout->bytes).release_context());
  lock.lock();
  a->base = base;
  register_arena(p, a);
}

// Takes a lent arena's block from the pool for one run (`lock` holds p.mu; released while
// the pool serves it). In steady state that is a hit on the block the last run gave back.
void borrow(Pool& p, Arena& a, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  char* base = static_cast<char*>(pooled(a.layout->bytes).release_context());
  lock.lock();
  a.base = base;
  register_arena(p, &a);
}

}  // namespace

c10::DataPtr planned(MemoryPlan::Impl& m, size_t n) {
  Pool& p = pool();
  const size_t k = m.next++;
  if (m.recording) {
    c10::DataPtr d = pooled(n);
    std::lock_guard<std::mutex> lock(p.mu);
    Recording& r = *m.recording;
    r.live[d.get()] = r.allocs.size();  // == k
    r.allocs.push_back({n, r.clock++, -1});
    return d;
  }
  if (m.arena != nullptr) {
    std::unique_lock<std::mutex> lock(p.mu);
    Arena& a = *m.arena;
    const Layout& layout = *a.layout;
    if (k >= layout.slots.size()) {
      m.replan = true;  // more allocations than recorded
    } else if (const auto& slot = layout.slots[k]; slot.planned) {
      // Its bytes are free unless a piece lives longer than when recorded.
      if (n <= slot.size && a.free(slot.offset, slot.offset + slot.size)) {
        a.live.insert(a.at_or_above(slot.offset), Arena::Piece{slot.offset, slot.offset + slot.size});
        a.live_count.fetch_add(1, std::memory_order_release);
        ++m.stats.served;
        ++p.totals.served;
        char* data = a.base + slot.offset;
        bucket_of(p, data).fetch_add(1, std::memory_order_release);
        return {data, data, &release, c10::Device(c10::kCPU)};
      }
      ++m.stats.missed;
      ++p.totals.missed;
      m.replan = true;  // larger than recorded, or its bytes still in use
    }
  }
  return pooled(n);
}

void finish_run(MemoryPlan::Impl& plan) {
  MemoryPlan::Impl* m = &plan;
  Arena* a = m->arena;
  const bool give_back = a != nullptr && a->lent && a->base != nullptr;
  if (!m->recording && !give_back && (a == nullptr || a->live_count.load() == 0)) return;
  Pool& p = pool();
  std::string line;
  const bool recorded = m->recording != nullptr;
  char* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (recorded) {
      Recording* r = m->recording.get();
      p.recordings.erase(std::find(p.recordings.begin(), p.recordings.end(), r));
      p.recording_count.fetch_sub(1, std::memory_order_release);
      m->layout = lay_out(*r);
      m->replan = false;
      m->stats.planned = m->layout->planned;
      m->stats.escaping = static_cast<int64_t>(r->allocs.size()) - m->stats.planned;
      m->stats.arena_bytes = static_cast<int64_t>(m->layout->bytes);
      m->recording.reset();
      if (log_enabled(LogChannel::Perf)) {
        line = "memory plan of " + m->name + ": " + std::to_string(m->stats.planned) + " allocations in a " +
               std::to_string(m->layout->bytes) + "-byte arena, " + std::to_string(m->stats.escaping) +
               " escape the run (recording " + std::to_string(m->stats.recordings) + ")";
      }
    } else if (a != nullptr && a->live_count.load() > 0) {
      m->replan = true;  // a planned allocation outlived the run: record again
    } else if (give_back) {
      unregister(p, a);  // before the pool sees its block again
      block = a->base;
      a->base = nullptr;
    }
  }
  if (block != nullptr) release(block);
  if (!line.empty()) TCAP_LOG(Perf, line);
  // The pool cached the blocks of the recorded intermediates; the arena takes their place
  // from the next run on, so they go back rather than sit beside it.
  if (recorded) free_whole_segments(p);
}

}  // namespace pool

MemoryPlan::MemoryPlan(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->stats.disabled = !Config::get().memory_plans;
}

MemoryPlan::~MemoryPlan() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr || impl_->arena == nullptr) return;
  std::unique_lock<std::mutex> lock(p->mu);
  retire(*p, impl_->arena, lock);
}

MemoryPlanStats MemoryPlan::stats() const {
  MemoryPlanStats s;
  if (Pool* p = g_pool.load(std::memory_order_acquire); p == nullptr) {
    s = impl_->stats;
  } else {
    std::lock_guard<std::mutex> lock(p->mu);
    s = impl_->stats;
  }
  s.runs = impl_->runs.load(std::memory_order_relaxed);
  return s;
}

MemoryPlanStats memory_plan_totals() {
  ensure_installed();
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p == nullptr) return {};
  std::lock_guard<std::mutex> lock(p->mu);
  return p->totals;
}

// A run that records, or that needs a fresh arena, or a plan that gives up; false when it
// gave up (Note [Memory plans]).
bool PoolScope::start_run(MemoryPlan::Impl& m) {
  Pool& p = pool::pool();
  std::unique_lock<std::mutex> lock(p.mu);
  auto drop_arena = [&] {
    if (Arena* old = m.arena) {
      m.arena = nullptr;
      retire(p, old, lock);
    }
  };
  if (m.replan && m.stats.recordings >= MemoryPlan::kMaxRecordings) {
    m.stats.disabled = true;
    drop_arena();
    lock.unlock();
    TCAP_LOG(Perf, "memory plan of " << m.name << ": off after " << m.stats.recordings
                                     << " recordings (its allocations keep changing); the pool serves them");
    return false;
  }
  if (m.replan) {
    m.recording = std::make_unique<Recording>();
    p.recordings.push_back(m.recording.get());
    p.recording_count.fetch_add(1, std::memory_order_release);
    ++m.stats.recordings;
    ++p.totals.recordings;
    return true;
  }
  // A fresh arena for the first planned run, a new layout, or when a piece of the old
  // arena is still alive (it escaped its run).
  if (m.arena && (m.arena->live_count.load() > 0 || m.arena->layout != m.layout)) drop_arena();
  if (m.arena == nullptr && m.layout->bytes > 0) make_arena(p, m, lock);
  if (m.arena != nullptr && m.arena->lent) borrow(p, *m.arena, lock);
  return true;
}

}  // namespace tcap::runtime
