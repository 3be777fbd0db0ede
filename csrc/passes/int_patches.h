// Integers of a graph that follow some sizes (Note [Dynamic sizes] in cache/dynamic_sizes.h):
// found by comparing the graphs recorded at two sizes, and patched to serve a third. The
// dynamic-size machinery of every compiled entry (tcap::compile, compile_step, compiled
// autograd) is built on these two functions.
#pragma once

#include <tcap/graph.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tcap::passes {

// One integer of a graph that follows the changed sizes: mul * size + add of one of them,
// or mul * size * size2 (a product: the stride of a [b, t, t] tensor, flatten's b * t).
struct IntPatch {
  enum Kind { Arg, ArgList, Size, Stride, Offset } kind;
  int64_t where;   // node id (Arg, ArgList) or value id
  size_t index;    // arg index (Arg, ArgList) or dim (Size, Stride)
  size_t element;  // ArgList: list element
  size_t size;     // which of the changed sizes it follows
  int64_t mul, add;
  int size2 = -1;  // >= 0: the second factor of a product (then add is 0)
  int64_t value(const std::vector<int64_t>& sizes) const {
    const int64_t v = mul * sizes.at(size);
    return size2 < 0 ? v + add : v * sizes.at(static_cast<size_t>(size2));
  }
};

// ga and gb are the same graph recorded with sizes[k].first and sizes[k].second. Fills
// `patches` with every integer (op arguments, tensor sizes, strides, offsets) that differs
// between them, explained by the first form that fits, in this order: a multiple of one
// size (m * s), a multiple of a product of two (m * s * s'), an affine function of one
// (m * s + c); returns "" on success, else why the graphs are not the same up to those
// integers. An integer two sizes (or products) of one form could both explain is ambiguous, and refused: patching it for the wrong one would be wrong. With
// `first_fit`, the first size that explains it is taken instead: for a caller that checks
// every specialization against a recording of the user's code before serving it (Note
// [Checking a new size]), so that a wrong guess is refused, never replayed.
std::string find_int_patches(const ir::Graph& ga, const ir::Graph& gb,
                             const std::vector<std::pair<int64_t, int64_t>>& sizes, std::vector<IntPatch>& patches,
                             bool first_fit = false);

// "" when `got` is `want` (every node, argument, output and value's metadata), else the
// first difference in words, naming the node and both sides (Note [Checking a new size]).
std::string first_difference(const ir::Graph& want, const ir::Graph& got);

// Rewrites g's integers for sizes[k] = the value of changed size k.
void apply_int_patches(ir::Graph& g, const std::vector<IntPatch>& patches, const std::vector<int64_t>& sizes);

}  // namespace tcap::passes
