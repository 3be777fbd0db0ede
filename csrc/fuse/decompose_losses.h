// Cross-entropy for kernels: nll_loss and the log_softmax under it, rewritten before
// partitioning and fusion so that the [N, C] log-probabilities are never written to memory
// (Note [Cross-entropy at the bandwidth floor] in decompose_losses.cpp).
#pragma once

#include "fuse/decompose.h"

namespace tcap::fuse {

// Rewrites, for kernels on `device` (float32/float64, dense, class dim 1 of a 2-D input,
// no class weights; anything else is kept and says why in `decisions`):
//   nll_loss_forward(log_softmax(x)) -> the row maxima and log-sums of x, a gather of x at
//                                       the targets, and sums over the N rows
//   nll_loss_forward(p)              -> a gather of p at the targets, and sums
//   nll_loss_backward                -> where(column == target, -grad / total_weight, 0)
// A graph without these ops is returned as it is (count 0).
Decomposed decompose_losses(const ir::Graph& g, const c10::Device& device);

}  // namespace tcap::fuse
