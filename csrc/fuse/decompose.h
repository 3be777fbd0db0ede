// Decompositions the fusion pass applies before grouping: ATen ops whose results live in
// different iteration spaces are split into ops the lowering table covers, so each part
// can join the kernel it belongs to (Note [Decompositions for fusion] in decompose.cpp).
#pragma once

#include <tcap/graph.h>

#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

namespace tcap::fuse {

struct Decomposed {
  ir::Graph graph;                     // the rewritten graph; empty when count == 0 (the input stands)
  int count = 0;                       // nodes rewritten
  std::vector<std::string> decisions;  // per rewritten node: what it became, or why it stayed
};

// Rewrites native_layer_norm_backward for kernels on `device`:
//   grad_input            -> native_layer_norm_backward(..., output_mask=[1, 0, 0]), a Row op
//   grad_weight (f32/f64) -> sum((input - mean) * rstd * grad_out) over the outer dims
//   grad_bias   (f32/f64) -> sum(grad_out) over the outer dims
// Weight and bias gradients of other dtypes stay one native call with mask [0, gw, gb].
// And native_batch_norm in training and its backward, float32/float64, dense, into the
// per-channel means, sums and pointwise ops they compute; the running statistics are
// written with copy_ once the graph reaches a node that could see them. In eval mode,
// with its statistics results unread, native_batch_norm into pointwise ops (Note [Batch
// norm as kernels] in decompose.cpp).
// A node that reads a host scalar input stays as it is (its rules are written for
// constant arguments).
Decomposed decompose_for_fusion(const ir::Graph& g, const c10::Device& device);

}  // namespace tcap::fuse
