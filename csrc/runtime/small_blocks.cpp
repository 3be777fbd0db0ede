// Note [Small blocks] (runtime/pool_internal.h): the size classes of the CPU buffer pool.
#include "runtime/pool_internal.h"

#include "support/logging.h"

#include <sys/mman.h>

namespace tcap::runtime::pool {

void SmallBlocks::reserve(size_t bytes) {
  range = bytes / kSpan * kSpan;
  if (range == 0) return;
  void* r = mmap(nullptr, range, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) {
    TCAP_LOG(Perf, "CPU buffer pool: no range for small blocks (mmap failed); they come from malloc");
    range = 0;
    return;
  }
  base = static_cast<char*>(r);
  span_live.assign(range / kSpan, 0);
  span_class.assign(range / kSpan, 0);
}

void* SmallBlocks::take(size_t n) {
  const int c = class_of(n);
  std::lock_guard<std::mutex> lock(mu);
  auto& stack = free[c];
  if (stack.empty() && !carve(c)) return nullptr;
  void* d = stack.back();
  stack.pop_back();
  ++span_live[span_of(d)];
  ++served;
  return d;
}

void SmallBlocks::give_back(void* d) {
  std::lock_guard<std::mutex> lock(mu);
  const size_t s = span_of(d);
  --span_live[s];
  free[span_class[s]].push_back(d);
}

bool SmallBlocks::carve(int c) {
  if (carved + kSpan > range) {
    if (!full_logged && base != nullptr) {
      full_logged = true;
      TCAP_LOG(Perf, "CPU buffer pool: the " << (range >> 20)
                                             << " MiB range for small blocks is used up; more come from malloc");
    }
    return false;
  }
  const size_t size = size_t{1} << (c + kMinShift);
  char* span = base + carved;
  span_class[carved / kSpan] = static_cast<uint8_t>(c);
  carved += kSpan;
  auto& stack = free[c];
  stack.reserve(stack.size() + kSpan / size);
  for (size_t off = kSpan; off >= size; off -= size) stack.push_back(span + off - size);  // lowest first out
  return true;
}

void SmallBlocks::trim() {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t s = 0; s < carved / kSpan; ++s) {
    if (span_live[s] == 0) madvise(base + s * kSpan, kSpan, MADV_DONTNEED);
  }
}

int64_t SmallBlocks::live_blocks() const {
  int64_t n = 0;
  for (size_t s = 0; s < carved / kSpan; ++s) n += span_live[s];
  return n;
}

}  // namespace tcap::runtime::pool
