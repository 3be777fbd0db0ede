// Buffer reuse: out-of-place pointwise ops whose first argument dies there run in place
// on it (Note [Buffer reuse in the eager backend]). The last pass before a graph is
// interpreted (tcap's eager backend, and the ATen part of fused graphs).
//
// Precondition: g verifies. Postcondition: the result verifies; each rewritten node names
// its in-place twin (ir::OpFacts::in_place_twin), its result is a new version of the
// argument it writes (Value::version_of), and the twin's schema is in Graph::schemas().
#pragma once

#include <tcap/graph.h>

namespace tcap::passes {

// A copy of g with the rewrites; `rewritten` (optional) receives their number.
ir::Graph reuse_buffers(const ir::Graph& g, int* rewritten = nullptr);

}  // namespace tcap::passes
