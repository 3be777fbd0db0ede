// Group norm for kernels: native_group_norm and its backward as a reduction over each
// group and pointwise ops, so that the ops around them join their kernels (Note [Group norm
// as kernels] in decompose_norms.cpp).
#pragma once

#include "fuse/decompose.h"

namespace tcap::fuse {

// Rewrites native_group_norm and native_group_norm_backward for kernels on `device`
// (float32/float64, dense tensors of one dtype); anything else is kept and says why in
// `decisions`. A graph without them is returned as it is (count 0).
Decomposed decompose_norms(const ir::Graph& g, const c10::Device& device);

}  // namespace tcap::fuse
