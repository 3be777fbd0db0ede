// Buffer reuse for the eager backend: see Note [Buffer reuse in the eager backend].
#pragma once

#include <tcap/graph.h>

namespace tcap::aot {

// A copy of g where out-of-place pointwise ops whose first argument dies there run in
// place on it. `rewritten` (optional) receives the number of ops rewritten.
ir::Graph reuse_buffers(const ir::Graph& g, int* rewritten = nullptr);

}  // namespace tcap::aot
