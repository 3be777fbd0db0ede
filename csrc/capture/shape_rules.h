// Whether a recorded op's output shapes follow from its inputs' shapes.
//
// Note [Output shapes that depend on values]
// A graph's values carry the shapes they had when recorded, and a replay (its kernels, its
// memory plan, the int arguments of later ops) relies on them. An op whose output shape
// comes from the values of its inputs (nonzero, a boolean mask's index, masked_select,
// unique, bincount, the batch sizes that _pack_padded_sequence computes from the lengths)
// would replay a recorded shape that this call's values do not give. Two sources tell:
//   * LibTorch's tags: an op tagged dynamic_output_shape (on its own overload, or on the
//     functional overload of its name, which the .out overloads lack) is recorded like any
//     other, and every replay checks the sizes of its results before anything reads them
//     (Note [Sizes that come from values], ir/op_facts.h);
//   * a check at capture, for every op that reads an integer or boolean tensor (where
//     shapes come from values: lengths, counts, offsets, masks) and is not tagged: the op
//     is run once more on meta tensors of the same sizes, strides and dtypes, and the
//     shapes its meta function gives are compared with those its kernel gave. Many ops
//     have no meta function in C++ (index_select's and _pack_padded_sequence's live in
//     Python); those are run once more on their real inputs with other values in their
//     integer tensors (each value moved one down, kept within the tensor's own range, so
//     that indices stay valid; booleans flipped): an output shape that changes, or a
//     kernel that refuses the other values, makes the op data-dependent. Ops that write
//     their inputs or draw random numbers are not run again (their output shapes are
//     their inputs' or their arguments').
// An op the check finds makes the recording unreplayable (Session::note_unreplayable): the
// front door runs that function, step or backward eagerly and logs which op and why. No
// tag names such an op, and host code below the dispatcher may read its results' values
// (an RNN reads the packed batch sizes to slice each time step), which no size check
// would see.
#pragma once

#include "capture/session.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>

namespace tcap::capture {

// Before the op runs: "" and no probe when its shapes follow from its inputs' shapes for
// certain, or when LibTorch tags it (a replay checks its sizes); or a probe: the
// arguments as meta tensors, to run after the op (check_with_meta). What the schema says
// (the tag, whether the op may run again) is the op's OpInfo, read once per operator.
struct ShapeCheck {
  std::string why;                          // data-dependent (set by check_with_meta)
  std::optional<torch::jit::Stack> probe;   // to run on meta after the op
  std::optional<torch::jit::Stack> args;    // the real arguments, where no meta function may say
};
ShapeCheck before_op_shapes(const OpInfo& info, c10::ArrayRef<c10::IValue> args);

// After the op ran and returned `rets`: "" when the meta function gives the same shapes,
// else why the op is data-dependent. `hide` is the recording key, kept off for the probe.
std::string check_with_meta(const c10::OperatorHandle& op, const OpInfo& info, ShapeCheck& check,
                            c10::ArrayRef<c10::IValue> rets, c10::DispatchKey hide);

}  // namespace tcap::capture
