// Integers of a graph that follow some sizes (Note [Dynamic sizes] in cache/dynamic_sizes.h):
// found by comparing the graphs recorded at two sizes, and patched to serve a third. The
// dynamic-size machinery of every compiled entry (tcap::compile, compile_step, compiled
// autograd) is built on these two functions.
#pragma once

#include <tcap/graph.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tcap::passes {

// One integer of a graph that follows the changed sizes: mul * size + add of one of them,
// or mul * size * size2 (a product: the stride of a [b, t, t] tensor, flatten's b * t).
// `sizes` are the classes' values followed by those of the sizes the ops derive (Note
// [Sizes the ops derive] in cache/dynamic_sizes.h). A `layout` patch is a stride of a
// contiguous value, recomputed from that value's patched sizes.
struct IntPatch {
  enum Kind { Arg, ArgList, Size, Stride, Offset } kind;
  int64_t where;   // node id (Arg, ArgList) or value id
  size_t index;    // arg index (Arg, ArgList) or dim (Size, Stride)
  size_t element;  // ArgList: list element
  size_t size;     // which of the changed sizes it follows
  int64_t mul, add;
  int size2 = -1;  // >= 0: the second factor of a product (then add is 0)
  bool layout = false;  // Stride: the contiguous stride of the value's sizes (size, mul, add unused)
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
//
// Note [Sizes the ops derive]: `sizes` beyond the first `num_classes` are sizes the ops
// derive (pairs no class explains). With them, an integer is explained, in this order, as
// a multiple of one class, one of the derived sizes itself, a product of two classes, a
// product involving a derived size, a multiple of a derived size, an affine function of a
// class, then of a derived size (an ambiguity is one within a step; a storage offset tries
// the derived sizes first); and the strides of a value contiguous at both sizes whose sizes
// follow a derived size are `layout` patches.
std::string find_int_patches(const ir::Graph& ga, const ir::Graph& gb,
                             const std::vector<std::pair<int64_t, int64_t>>& sizes, std::vector<IntPatch>& patches,
                             bool first_fit = false, size_t num_classes = SIZE_MAX);

// Whether x (at the first sizes) and y (at the second) are m * s, m * s * s' or, with
// `affine`, m * s + c of the pairs `sizes`.
bool follows_sizes(int64_t x, int64_t y, const std::vector<std::pair<int64_t, int64_t>>& sizes, bool affine);

// The integer patch p gives in g at `sizes` (a layout stride reads g's sizes).
int64_t patch_value(const ir::Graph& g, const IntPatch& p, const std::vector<int64_t>& sizes);

// "" when `got` is `want` (every node, argument, output and value's metadata), else the
// first difference in words, naming the node and both sides (Note [Checking a new size]).
std::string first_difference(const ir::Graph& want, const ir::Graph& got);

// Rewrites g's integers for sizes[k] = the value of changed size k (a value's sizes before
// its layout strides, which read them).
void apply_int_patches(ir::Graph& g, const std::vector<IntPatch>& patches, const std::vector<int64_t>& sizes);

}  // namespace tcap::passes
