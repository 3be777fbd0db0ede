// Lowering of ATen nodes into kernel IR: one row per operator (STYLE: op properties are
// rows in one table). The fusion pass (fusion.cpp) decides which nodes share a kernel;
// this table says what each node computes, in kir instructions (emitter.h), with eager's
// semantics, and how it uses the group's iteration space (classify.h reads that).
// Preconditions of lower(): classify() accepted the node. Postconditions: one Val per
// tensor output, in the node's compute dtype (the store casts to the output's dtype).
#pragma once

#include "fuse/emitter.h"

#include <tcap/graph.h>

#include <cstdint>
#include <vector>

namespace tcap::fuse {

// How a node uses the fusion group's iteration space.
enum class OpClass {
  Pointwise,  // one output element per element of its (broadcast) output shape
  Reduction,  // reduces its first tensor argument over `reduce_dims`
  Row,        // full-shape in and out, with reductions over `reduce_dims` inside (softmax)
  // A small matmul (mm, addmm, bmm, baddbmm): a sum of products over its own space, the
  // output's dims plus the contracted one, last (Note [Small matmuls as kernels]).
  Contraction,
};

using LowerFn = std::vector<Val> (*)(Emitter& e, const ir::Node& n);
// Reduce dims of a Reduction/Row node (in its first tensor argument's dims).
using DimsFn = std::vector<int64_t> (*)(const ir::Graph& g, const ir::Node& n);

// One row of the table.
struct LoweringRow {
  OpClass cls;
  LowerFn lower;
  DimsFn dims = nullptr;
};

// The row of n's operator (by overload, then by name), or null when it has none.
const LoweringRow* find_lowering(const ir::Node& n);
// Whether node n is of an op that fusion lowers into kernels other than as a matmul (whose
// result is written like an ATen call's): what the min-cut partitioner takes for values
// fusion keeps in registers (Note [Saving what fusion would not write], passes/min_cut.cpp).
bool joins_kernels(const ir::Node& n);

// Every key of the table ("aten::mul" or "aten::sum.dim_IntList") with its class; a test
// checks it against ir/op_facts.h.
std::vector<std::pair<std::string, OpClass>> lowered_ops();

// Note [Small matmuls as kernels]
// A model of a few small Linear layers (mlp_small: 10-5-2 at batch 1) spends most of its
// replay in BLAS calls whose set-up dwarfs their 50 multiply-adds. Such a matmul is a
// reduction like any other: out[m, n] = sum_k a[m, k] * b[k, n] over the space
// [M, N, K] (bmm: [B, M, N, K]), with each operand read through its strides along the
// dims it has (a's stride 0 along N, b's along M). So a matmul of at most
// FusionOptions::max_matmul_macs multiply-adds is a Contraction node: it starts its own
// group on that space (its operands are loads, never values of the same kernel), and the
// pointwise ops on its result join it as an epilogue (addmm's bias, the ReLU after it),
// as Inductor's small-mm decomposition and its matmul epilogue templates do. Larger ones
// stay ATen calls: BLAS's blocking wins once the set-up is paid for. CPU kernels only
// (a CUDA graph keeps cuBLAS: not measured on a device yet).

// The space of a Contraction node: its output's sizes, then the contracted size.
std::vector<int64_t> contraction_space(const ir::Graph& g, const ir::Node& n);
// Per dim of that space, which dim of tensor argument i feeds it (-1: not read along it).
std::vector<int> contraction_src(const ir::Graph& g, const ir::Node& n, size_t i);
// Multiply-adds of a Contraction node.
int64_t contraction_macs(const ir::Graph& g, const ir::Node& n);

// Lowers node n; returns one value per tensor output (ir Value / ValueList entries, in
// order), in a compute dtype.
std::vector<Val> lower(Emitter& e, const ir::Node& n);

}  // namespace tcap::fuse
