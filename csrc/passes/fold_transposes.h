// Transposes that cancel: t(t(y)) is y again (same sizes, strides and storage offset), yet
// each t is a dispatcher call and a new TensorImpl per run. Every Linear's weight gradient
// makes such a pair: AddmmBackward0 returns t(mm(...)) and TBackward0 transposes it back.
//
// The pass uses y itself where only the pair reads it: y is made inside the graph, owns its
// storage (no view), has no reader but the inner t, and nothing writes y, the pair's
// results or their views in place. Then no one can tell the difference: the values, the
// layout and the storage are the same, and only the two view ops go.
//
// Precondition: g verifies. Postcondition: the result verifies.
#pragma once

#include <tcap/graph.h>

namespace tcap::passes {

// A copy of g without the cancelling pairs; `folded` (optional) receives their number.
ir::Graph fold_transposes(const ir::Graph& g, int* folded = nullptr);

}  // namespace tcap::passes
