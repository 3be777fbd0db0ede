// Joint forward+backward graphs and their partition into a forward and a backward graph
// (AOTAutograd's default and min-cut partitioners).
//
// A JointGraph is what tcap::compile records for one region: the primal inputs, the
// tangents (gradients flowing into the region's outputs), the forward ops, the backward
// ops that turn tangents into input gradients, and an Output node listing the user
// outputs then one gradient per differentiable primal that received one.
//
// partition() splits it: the forward graph computes the user outputs plus the tensors it
// saves (OutputKind::Saved); the backward graph takes those saved tensors
// (InputKind::Saved) and the tangents and returns the gradients (OutputKind::Grad).
//   default: save every forward tensor the backward reads.
//   min_cut: choose the cheapest set of tensors to save (a minimum cut of a max-flow
//            graph whose capacities are tensor sizes) and recompute the rest in the
//            backward. Only cheap pointwise and view ops are recomputed; matmuls,
//            convolutions, reductions, random ops and in-place ops never are.
#pragma once

#include <tcap/graph.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tcap {

enum class Partitioner { Default, MinCut };
std::string to_string(Partitioner p);  // "default", "min_cut"

struct JointGraph {
  // Inputs: num_primals primals, then num_tangents tangents (InputKind::Tangent).
  // Output node: num_user_outputs user outputs, then the gradients (OutputKind::Grad).
  ir::Graph graph;
  size_t num_primals = 0;
  size_t num_tangents = 0;
  size_t num_user_outputs = 0;
  std::vector<int> tangent_of;  // per tangent: the user output it is the gradient of
  std::vector<int> grad_of;     // per gradient output: the primal it is the gradient of
};

// Why a forward value was saved, recomputed or neither.
struct ValueDecision {
  enum class Kind { Saved, Recomputed, ForwardOnly };
  ir::ValueId value = ir::kNoValue;  // in the joint graph
  Kind kind = Kind::ForwardOnly;
  std::string reason;
};

struct PartitionResult {
  Partitioner partitioner = Partitioner::Default;
  // Forward: the joint graph's primal inputs; Output: user outputs then saved tensors.
  ir::Graph forward;
  // Backward: saved tensors then tangents; Output: the gradients, in JointGraph order.
  ir::Graph backward;
  std::vector<ir::ValueId> saved;            // joint-graph values, in saved order
  std::vector<bool> saved_is_primal;         // per saved: it is a primal (costs no memory)
  std::vector<int> grad_of;                  // per backward output: primal index
  std::vector<int> tangent_of;               // per backward tangent input: user output index
  size_t num_user_outputs = 0;
  std::vector<ValueDecision> decisions;      // one per forward value the backward depends on
  // Bytes the saved tensors keep alive beyond what lives anyway: primals, views of
  // primals and user outputs are not counted.
  int64_t saved_bytes = 0;
  size_t recomputed_nodes = 0;

  // One line per decision: "%7 f32[1024, 2048] aten::add.Tensor: saved (...)".
  std::string explain() const;
};

// The min-cut partitioner's heuristics (Note [Min-cut recomputation]).
struct MinCutOptions {
  // Among cuts of equal bytes take the one of later tensors, which recomputes least
  // (AOTAutograd's bias towards nodes close to the backward): relu(x) is saved rather
  // than x when the backward reads relu(x).
  bool prefer_later_tensors = true;
  // A tensor's capacity is capped here, so that a sum of capacities cannot overflow.
  int64_t max_tensor_bytes = int64_t{1} << 36;
  // Bytes moved, not only bytes kept (Note [Saving what fusion would not write]): where
  // set, says whether a forward op joins a fused kernel. A value made by such an op and
  // read in the forward only by such ops is written to memory only if it is saved, so
  // saving it costs twice its bytes (the forward's write and the backward's read).
  std::function<bool(const ir::Node&)> fuses;
};

// Checks the joint graph's shape (inputs, outputs, phases) and splits it. Throws
// c10::Error with a clear message on a malformed joint graph.
PartitionResult partition(const JointGraph& joint, Partitioner p, const MinCutOptions& min_cut = {});

// ir::extract_subgraph (tcap/graph.h), also reachable as tcap::extract_subgraph: cuts
// forward and backward graphs out of a joint graph.
using ir::extract_subgraph;

// A copy of g without the nodes nothing depends on: a node is kept if the Output node
// reads one of its results (directly or through other kept nodes) or if it writes into a
// graph input (an in-place update of a parameter or buffer). For graph rewrites in
// fw_compiler / bw_compiler callbacks, after replace_all_uses_with.
ir::Graph eliminate_dead_code(const ir::Graph& g);

}  // namespace tcap
