// Pointwise ops moved above a dense reshape of their operands, so that they join the
// kernel that computes in the reshaped shape (Note [Reshapes sunk below pointwise ops] in
// sink_reshapes.cpp).
#pragma once

#include "fuse/decompose.h"

namespace tcap::fuse {

// g with every pointwise op whose operands are dense reshapes of one shape (or dense
// tensors of its own shape, or 0-dim) computed in that shape and reshaped after; count =
// the ops moved (0: g itself).
Decomposed sink_reshapes(const ir::Graph& g);

}  // namespace tcap::fuse
