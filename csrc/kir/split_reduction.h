// Split reductions: a reduction kernel with few outputs as two kernels, so that its
// reduced elements are read by every thread (Note [Split reductions] in split_reduction.cpp).
#pragma once

#include "kir/kir.h"

#include <optional>
#include <vector>

namespace tcap::kir {

struct SplitReduction {
  // `partial` reduces each of `splits` chunks of the reduced elements for every output
  // (its parallel range is splits * outputs) and writes one partial result per Reduce;
  // `combine` reduces the partials and computes and stores what the kernel stores per
  // output. Both take the kernel's buffers, then one scratch buffer per Reduce (written by
  // `partial`, read by `combine`) of `scratch[i]` elements of the Reduce's dtype.
  Kernel partial;
  Kernel combine;
  std::vector<int64_t> scratch;
  int64_t splits = 0;
};

// The split of k, or nullopt where k is not a single-pass reduction over at least
// kMinSplitElements elements per output with fewer than kSplitOutputs outputs, or where
// no reduced dim has a divisor that makes chunks of at least kMinChunk elements.
std::optional<SplitReduction> split_reduction(const Kernel& k);

constexpr int64_t kSplitOutputs = 64;
constexpr int64_t kMinSplitElements = int64_t{1} << 17;
constexpr int64_t kMinChunk = 4096;

}  // namespace tcap::kir
