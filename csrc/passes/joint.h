// A joint forward+backward graph (tcap::JointGraph, include/tcap/partition.h) read as
// the partitioners need it: which nodes and values belong to the forward and to the
// backward, which forward values the backward reads, and which forward ops may be
// recomputed in the backward. Shared by the default and min-cut partitioners.
#pragma once

#include <tcap/partition.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tcap::passes {

struct JointPhases {
  std::vector<ir::NodeId> forward, backward;  // Call and CallHook nodes, by phase
  std::vector<ir::ValueId> primals, tangents, user_outputs, grads;
  std::unordered_set<ir::ValueId> primal_set;
  std::unordered_map<ir::ValueId, ir::NodeId> forward_producer;  // values made by forward nodes
  // Forward values the backward reads (or returns as a gradient), sorted, and the first
  // backward node that reads each (-1: only returned).
  std::vector<ir::ValueId> read_by_backward;
  std::unordered_map<ir::ValueId, ir::NodeId> first_reader;
  // Values a later op overwrites in place: nothing is recomputed from them.
  std::unordered_set<ir::ValueId> overwritten;

  bool is_forward_value(ir::ValueId v) const { return primal_set.count(v) || forward_producer.count(v); }
};

// Checks the joint graph's declared counts against its inputs and outputs (c10::Error
// naming the mismatch) and splits it.
JointPhases split_joint(const JointGraph& joint);

// Whether forward node `id` must never be recomputed in the backward, and why: hook
// calls, ops that are not ir::OpFact::Recomputable, in-place writes, and ops that read a
// tensor a later forward op overwrites.
bool never_recomputed(const ir::Graph& g, const JointPhases& ph, ir::NodeId id, std::string* why);

// Bytes of a tensor (at least 1, so that empty tensors still cost something to save).
int64_t tensor_bytes(const ir::TensorMeta& m);

}  // namespace tcap::passes
