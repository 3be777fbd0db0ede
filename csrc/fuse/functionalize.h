// In-place updates made functional so that they fuse (Note [In-place updates as kernels]
// in functionalize.cpp); the fusion pass writes the results back in place.
#pragma once

#include "fuse/decompose.h"

#include <tcap/graph.h>

#include <c10/core/Device.h>

namespace tcap::fuse {

// A copy of g in which every chain of in-place pointwise writes into one buffer that the
// note's conditions admit (an optimizer's mul_, add_, addcmul_, addcdiv_ on a parameter or
// its state; an add_ on a temporary) is made of the ops' functional forms, and a buffer
// the graph did not make (an input) gets the chain's last value back with one copy_ at
// the end of the graph. Readers of a version read the functional value that stands for
// it; the Output node keeps reading the input's buffer. `count` is the number of writes
// made functional.
Decomposed functionalize_updates(const ir::Graph& g, const c10::Device& device);

}  // namespace tcap::fuse
