// Split reductions: a reduction kernel with few outputs as a sequence of kernels, so that
// its reduced elements are read by every thread (Note [Split reductions] in split_reduction.cpp).
#pragma once

#include "kir/kir.h"

#include <optional>
#include <vector>

namespace tcap::kir {

struct SplitReduction {
  // Run in order: for each level of Reduces a partial (each of `splits` chunks of the
  // reduced elements for every output, in parallel over splits * outputs, one partial
  // result per Reduce) and a combine (the partials reduced, and after the last level what
  // the kernel stores per output), then a tail for the element-wise stores of the last
  // level where there are any. Every kernel takes the kernel's buffers, then the scratch
  // buffers, `scratch[i]` elements of its dtype each: a partial per Reduce, then a final
  // result per Reduce that a later kernel reads.
  std::vector<Kernel> kernels;
  std::vector<int64_t> scratch;
  int64_t splits = 0;
};

// The split of k, or nullopt where k is not a reduction over at least kMinSplitElements
// elements per output with fewer than kSplitOutputs outputs, or where no reduced dim has
// a divisor that makes chunks of at least kMinChunk elements. A sum of exponentials around
// a maximum is computed in the maximum's pass (Note [Online softmax in split reductions]).
std::optional<SplitReduction> split_reduction(const Kernel& k);

constexpr int64_t kSplitOutputs = 64;
constexpr int64_t kMinSplitElements = int64_t{1} << 17;
constexpr int64_t kMinChunk = 4096;
// A chunk's elements where a sum of exponentials is computed beside its maximum (Note
// [Online softmax in split reductions]): the chunk is read twice, the second time from
// the cache.
constexpr int64_t kMaxOnlineChunk = int64_t{1} << 16;

}  // namespace tcap::kir
