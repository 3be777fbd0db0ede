// Detaches that change nothing in a graph run below autograd. Every AccumulateGrad in a
// captured backward detaches the gradient it stores (`new_grad.detach()`), so a compiled
// backward or step graph ends in one `aten::detach` per parameter: a dispatcher call and a
// new TensorImpl each, per run, for a tensor the graph itself just made (mlp_small's Adam
// step has 4 of its 8 remaining ATen calls, the small CNN's step 12).
//
// Below autograd (compiled graphs are run so, Interpreter's differentiable=false) no op
// makes autograd metadata, so detach(x) differs from x only by being another TensorImpl
// with the same sizes, strides and storage. The pass uses x itself where no one can tell:
// x is made inside the graph (its alias root is not a graph input, so it never requires
// grad and is no tensor of the caller's) and the detach is its only reader, so every read,
// write and view of the detach's result becomes one of x and no op or caller sees both.
// (The multi-tensor optimizer calls declare they write the gradients they read, so a
// condition on writes would keep every AccumulateGrad's detach.)
//
// Precondition: g verifies, and is run below autograd. Postcondition: the result verifies.
#pragma once

#include <tcap/graph.h>

namespace tcap::passes {

// A copy of g without those detaches; `dropped` (optional) receives their number.
ir::Graph drop_detaches(const ir::Graph& g, int* dropped = nullptr);

}  // namespace tcap::passes
