// Note [Writes through a view]
// An in-place write into a view of a tensor (CopySlices, the backward of an in-place op on
// a view, copies the gradient into an as_strided view of the buffer it returns) gives the
// view a new version, but the later reads of the tensor name the tensor, not the write:
// following values alone, a cut of a recorded graph drops the write. The cuts of a
// recorded backward (compiled autograd's, and tcap::compile's slice of the user's
// backward) keep such a write when a later kept node reads its memory (the value at the
// bottom of the view_of / version_of chain). A write into a value itself gives that value
// a new version which the later reads name, so the data flow keeps it.
#pragma once

#include <tcap/graph.h>

namespace tcap::ir {

// The memory (alias root) that value v writes into through a view, when v is the result
// of such a write; kNoValue otherwise.
inline ValueId memory_written_through_a_view(const Graph& g, ValueId v) {
  if (v == kNoValue) return kNoValue;
  const ValueId written = g.value(v).version_of;
  if (written == kNoValue || g.value(written).view_of == kNoValue) return kNoValue;
  return g.alias_root(v);
}

}  // namespace tcap::ir
