// Compiled autograd's view of one backward's autograd graph: the structural cache key,
// the tensors the backward reads, and the hooks it calls (Note [The backward key],
// walk.cpp). The walk reads autograd internals (Node::compiled_args, AccumulateGrad,
// InputMetadata, the generated nodes' members), which change between LibTorch releases;
// it reaches them only through autograd_shim.h.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tcap::ca {

enum class HookSite : uint8_t { TensorPre, RetainsGrad, Pre, Post };

struct HookRef {
  uint32_t node;       // NodeCall id of the node it is attached to
  HookSite site;
  const void* object;  // the FunctionPreHook / FunctionPostHook
};

// One size (or stride) the graph depends on, compared per call: equal, or dynamic.
struct SizeRef {
  uint32_t node;  // NodeCall id it came from
  int64_t value;
};

struct BackwardWalk {
  std::string why_not;            // non-empty: this backward cannot be compiled (why)
  // The key: node types, topology, constants, dtypes, hook counts. Its bytes are the first
  // key_size of key_buffer, which keeps its size across walks (no copy, no zero fill).
  std::string_view key() const { return std::string_view(key_buffer.data(), key_size); }
  std::string key_buffer;
  size_t key_size = 0;
  std::vector<size_t> node_key_end;  // per node: where its part of the key ends
  std::vector<SizeRef> sizes;     // sizes and strides of tensors and metadata, in walk order
  // By NodeCall id; 0 is the root. Plain pointers: `graph` owns them (every node is reached
  // from the root through edges, which hold shared_ptrs), and a reference count per node
  // would be two atomic operations each on every backward.
  std::vector<torch::autograd::Node*> nodes;
  std::shared_ptr<torch::autograd::Node> graph;  // the root; keeps `nodes` alive
  std::vector<const std::string*> names;  // "MulBackward0" (interned per node type)
  // What the backward reads, in order: the root gradients, then each node's saved tensors.
  std::vector<at::Tensor> tensors;
  std::vector<uint32_t> tensor_node;
  std::vector<HookRef> hooks;      // in slot order
  std::vector<uint32_t> accumulate;  // NodeCall ids of AccumulateGrad nodes
  std::vector<c10::IValue> keep_alive;  // objects the key refers to by address

  void add_size(uint32_t node, int64_t value) {
    // Field by field: a braced temporary makes GCC store two fields and load them back
    // as one, which stalls store forwarding on every size.
    SizeRef& s = sizes.emplace_back();
    s.node = node;
    s.value = value;
  }

  std::string label(uint32_t node) const {  // "MulBackward0 (NodeCall 2)"
    return *names.at(node) + " (NodeCall " + std::to_string(node) + ")";
  }
  // Drops every reference (nodes, tensors, hooks) and keeps the buffers' capacity.
  void clear();
};

// Walks the graph below `root` (a GraphRoot whose outputs are the root gradients) into
// `w`, which is cleared first; a walk object reused across calls makes the walk allocate
// little (the walk runs on every backward; see the lookup_us benchmark).
// `outputs`: the edges grad() returns gradients for (empty for backward()).
// Never throws for graphs it cannot compile: it says why in why_not.
void walk_backward(const std::shared_ptr<torch::autograd::Node>& root, const torch::autograd::edge_list& outputs,
                   bool accumulate_grad, BackwardWalk& w);

// For grad(outputs) and backward(inputs=...): by NodeCall id, whether the engine would
// run the node, i.e. whether one of `outputs` is reachable below it (with
// `accumulate_grad`, an output's own node runs too), as GraphTask::init_to_execute
// decides. Only the nodes it runs release their saved variables.
std::vector<char> nodes_run_for(const BackwardWalk& w, const torch::autograd::edge_list& outputs,
                                bool accumulate_grad);

// The first line of a message (PyTorch's errors carry a backtrace after it), for logs
// and reasons.
std::string first_line(const std::string& s);

// Whether walks describe LibTorch's generated nodes from their members (the default) or
// all through Node::compiled_args (Note [Generated nodes described from their fields]);
// for tests that compare the two. Returns the previous setting.
bool set_describe_generated_fields(bool on);

// Accumulates `grad` into the leaf's .grad exactly as the engine's AccumulateGrad node
// does (steal / clone / add rules, post-accumulate-grad hooks). `grad` is moved from, so
// an unshared gradient can be stolen.
void accumulate(torch::autograd::Node& accumulate_grad_node, at::Tensor&& grad);

// Calls hook `h` of the walk as the engine would: pre-hooks take the gradients the node
// receives and return them (possibly replaced); post-hooks take the node's outputs and
// inputs and return the outputs.
torch::autograd::variable_list call_hook(const HookRef& h, const torch::autograd::variable_list& in,
                                         const torch::autograd::variable_list& node_in);

}  // namespace tcap::ca
