// Fusion groups: which nodes of a graph share a kernel (the first step of the fusion pass,
// fusion.h). Separate from the kernels and the rewrite because the rules of this step
// (Note [Fusion groups], [Sibling reductions]) are about the graph alone: shapes, reduced
// dims, dataflow and the order of effects; nothing here compiles or rewrites anything.
// Preconditions: a graph in topological order (ir::verify holds). Postconditions: every
// node is in at most one group; a group's nodes are in graph order; the groups form no
// cycle with the nodes outside them; no group spans a mutation or a hook call.
// Internal to fuse/.
#pragma once

#include "fuse/lowering.h"

#include <tcap/graph.h>

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace tcap::fuse {

// Note [Fusion groups]
// A group has a full shape S (the shape its pointwise ops produce, or the shape its
// reductions read) and a set R of reduced dims of S (empty for a pointwise group). Each
// node of a group works in one of two spaces:
//   Full:  its output has shape S (pointwise ops, softmax-like Row ops);
//   Outer: its output has the reduced shape, S without R (keepdim or not): reductions,
//          and pointwise ops on their results (mean = sum / n).
// The kernel's domain is S with R moved last; Full values are element-level, Outer values
// outer-level (kir.h). A Full node may read an Outer value of its group only if eager
// broadcasting lines that value up with the outer dims (keepdim results, or R leading);
// an Outer node reads Outer values of its own shape. A node joins a producer's group
// only when that holds, its reduce dims equal the group's (or the group has none yet),
// and no path leaves the group and comes back (checked with each node's set of groups
// it depends on). Groups are closed at every mutation and hook call, and the rewritten
// graph orders mutations after every group formed before them, so no kernel reads a
// buffer after (or writes one before) an in-place op that eager ordered differently.

enum class Space { Full, Outer };

struct Group {
  int id = 0;
  std::vector<int64_t> S;
  std::vector<int64_t> R;  // sorted dims of S
  std::vector<ir::NodeId> nodes;
  bool closed = false;
  bool dissolved = false;
  // Started by a Contraction node: its space is the matmul's, and only pointwise ops on
  // its result (Outer) join it (Note [Small matmuls as kernels]).
  bool contraction = false;
};

// The groups of one graph and, per node and value, where they stand.
struct Grouping {
  std::vector<Group> groups;           // by id; a merged-away group is empty and dissolved
  std::vector<int> group_of_node;      // per node: its group, or -1
  std::vector<int> group_of_value;     // per value: the group computing it, or -1
  std::vector<Space> space_of_value;   // per value computed by a group
  std::map<ir::NodeId, Space> node_space;
  std::map<ir::NodeId, OpClass> node_class;
  std::vector<std::string> decisions;  // why nodes are not fused (FusionResult::decisions)
  // Note [Views read through their base]: view nodes a group took in, and per value such
  // a node makes, the value it views (an outside value, another such view, or a value of
  // the group for a view of its result).
  std::set<ir::NodeId> view_nodes;
  std::map<ir::ValueId, ir::ValueId> view_source;
};

// Note [Views read through their base]
// A view between two kernels (the `t` of a Linear's weight, a gradient's `view` to the
// bias's shape) is a dispatcher call and a TensorImpl per run that computes nothing: a
// kernel reads any tensor through constant strides anyway. So a group takes in
//   - a view node of an outside value (or of such a view) whose every reader is in the
//     group, with no mutation or hook call between the view and the group's last node:
//     the kernel reads the base's buffer through the view's recorded strides;
//   - a view node of one of its results that nothing else reads (not a graph output
//     either), with no mutation or hook call between the group and the view: the kernel
//     writes the view's tensor, through the result's strides, when both are dense with
//     the same number of elements.
// Only views that keep their base's first element (t, transpose, permute, view,
// unsqueeze, squeeze, expand, alias: same storage offset, recorded as such) are taken. The
// kernel's guard checks the base's sizes and strides, which fix the view's (a view's
// strides on dims of size 1 are never read); its fallback graph runs the view node too.
// Groups the nodes of `g` whose tensors all live on `device` (host scalars read as kernel
// parameters: Note [Kernel parameters] in kir/kir.h).
Grouping form_groups(const ir::Graph& g, const c10::Device& device, int64_t max_matmul_macs = 0);

// --- shapes and nodes, shared with the kernel builder (group_kernel.h) and the rewrite ---

std::string shape_str(c10::ArrayRef<int64_t> s);
// The shape of n's first tensor output (empty if it has none).
std::vector<int64_t> out_sizes(const ir::Graph& g, const ir::Node& n);
bool is_mutation(const ir::Graph& g, const ir::Node& n);
// A hook call or a mutation: no group spans one, and the rewrite orders every unit around
// it (Note [Fusion groups]).
bool is_barrier(const ir::Graph& g, const ir::Node& n);
// Nodes whose order among themselves matters beyond dataflow: mutations, hook calls, RNG,
// host reads, the graph's inputs and output. Pure ATen calls are ordered by dataflow only.
bool is_effect(const ir::Graph& g, const ir::Node& n);
// Per S dim: which dim of a tensor of shape `u` feeds it under right-aligned
// broadcasting (-1: broadcast). False if u does not broadcast to `target`.
bool broadcast_src(c10::ArrayRef<int64_t> u, const std::vector<int64_t>& target, std::vector<int>* src);
// Per S dim: which dim of an Outer value of shape u it comes from (-1 on reduced dims).
bool outer_src(c10::ArrayRef<int64_t> u, const Group& gr, std::vector<int>* src);
// Whether a layout covers its elements exactly once (no gaps, no overlap).
bool dense_layout(const ir::TensorMeta& m);
// One line of FusionResult::decisions: "%12 aten::mm: <why>".
std::string decision(const ir::Node& n, const std::string& why);

}  // namespace tcap::fuse
