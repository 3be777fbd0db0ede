// Replays an ir::Graph (captured or loaded from JSON) through the dispatcher.
//
// The graph is run as a program over real buffers: nodes execute in order, in-place ops
// mutate the tensors passed in, views are real views. Forward and backward nodes both
// run (backward ops are ordinary ATen calls in the graph); hooks run as their recorded
// bodies. Ops run below autograd (the graph already contains the backward), each under
// the grad mode it was recorded with.
#pragma once

#include <cstdint>

#include <tcap/graph.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <optional>
#include <vector>

namespace tcap {

namespace interp {
class DirectCall;
class DirectCalls;
class UnboxedCall;
}

// Thrown by an interpreter with check_host_values(true) when a value read on the host
// differs from the one recorded on its node. The message names the node.
class HostValueChanged : public c10::Error {
 public:
  using c10::Error::Error;
};

class Interpreter {
 public:
  // Resolves every operator now; throws c10::Error naming the node if one is unknown to
  // this LibTorch or has an argument that cannot be replayed (an opaque value).
  // differentiable=false (the default) runs below autograd, as described above.
  // differentiable=true runs the ops through autograd (each under its recorded grad
  // mode), so the results carry a graph back to the inputs: used to recompute a forward
  // for a double backward.
  // `kernels`: the kernel table of a compiled graph with fused nodes (tcap::fused, which
  // name generated kernels by their place in it); such a graph cannot be run without it,
  // and throws here naming the node.
  explicit Interpreter(const ir::Graph& graph, bool differentiable = false,
                       std::shared_ptr<const interp::DirectCalls> kernels = nullptr);

  // inputs: one tensor per Input node, in graph order. Returns the Output node's values.
  // With keep_values(false) each input is released after its last use: pass them with
  // std::move to let that free memory.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs);
  // After run(): the tensor computed for a value (undefined if never computed). With
  // keep_values(false) nothing is kept after run() returns (what compiled code wants).
  const at::Tensor& value(ir::ValueId v) const { return env_.at(static_cast<size_t>(v)); }
  void keep_values(bool keep) { keep_values_ = keep; }
  // After run(): the non-tensor results (host reads such as item()), in node order,
  // observations (reads whose recorded value passes::forget_host_reads dropped) included.
  const std::vector<c10::IValue>& host_values() const { return host_values_; }
  // Compares each value read on the host (item(), equal(), is_nonzero(): a Bool, Int or
  // Double result) with the one recorded on its node as soon as it is read, and the sizes
  // of the results of each op whose output sizes come from values (nonzero, a boolean
  // mask's index) with the recorded ones as soon as it has run, and throws
  // HostValueChanged at the first that differs, before any later node runs. Compiled
  // entries check their host-value guards this way (cache/guards.h).
  void check_host_values(bool on) { check_host_values_ = on; }

 private:
  void run_call(const ir::Node& n, const c10::OperatorHandle& op, const c10::FunctionSchema& schema);
  void run_hook(const ir::Node& n);
  void run_direct(const ir::Node& n, interp::DirectCall& call, bool as_ops);
  bool run_unboxed(const ir::Node& n, const interp::UnboxedCall& call);
  void bind_unreturned(const ir::Arg& out);
  c10::IValue to_ivalue(const ir::Node& n, size_t i, const c10::Argument& schema_arg) const;
  std::vector<c10::IValue> filled_stack(const ir::Node& n) const;
  const at::Tensor& get(const ir::Node& n, ir::ValueId v) const;
  // An argument that reads a host scalar input (Note [Host scalars as graph inputs]),
  // handed to its op in the type the schema declares.
  struct ScalarUse {
    enum class Kind { None, Double, Int, Tensor };
    ir::NodeId node;
    size_t arg;
    ir::ValueId value;
    Kind kind;
  };
  static ScalarUse::Kind scalar_use_kind(const c10::Argument& schema_arg);
  static c10::IValue scalar_ivalue(ScalarUse::Kind kind, double d);
  bool is_scalar_use(ir::NodeId node, size_t arg) const;
  bool reads_wrapped_host_scalar(ir::NodeId node) const;

  ir::Graph graph_;  // a copy: replay may itself be recorded into the graph it came from
  std::vector<std::optional<c10::OperatorHandle>> ops_;  // per node
  // Per node: its operator's schema (resolved once; OperatorHandle::schema() is a call
  // into LibTorch per use). The graph's input nodes and output values, in order.
  std::vector<const c10::FunctionSchema*> schemas_;
  // Note [Prepared argument stacks]: per node, its arguments as the kernel takes them,
  // built once; a run fills in the tensor arguments only (a constant is not rebuilt per
  // call: no list, string or device parsed again, no wrapped-number tensor allocated).
  std::vector<std::vector<c10::IValue>> prepared_;
  std::vector<ir::NodeId> input_nodes_;
  std::vector<ir::ValueId> output_values_;
  std::vector<uint8_t> trusting_;  // per node (empty: none): its kernel's arguments are checked first
  std::vector<uint8_t> sizes_from_values_;  // per node (empty: none): its results' sizes are checked
  // Per node (empty: none): the generated kernel a tcap::fused node runs, found once in the
  // graph's kernel table and called without the dispatcher (Note [Direct fused calls]).
  std::vector<std::shared_ptr<interp::DirectCall>> direct_;
  // Per node (empty: none): the extern ATen op's CPU kernel, called unboxed when a run's
  // tensors allow (Note [Unboxed extern calls], csrc/interp/unboxed_calls.cpp).
  std::vector<std::shared_ptr<interp::UnboxedCall>> unboxed_;
  std::vector<at::Tensor> env_;
  std::vector<c10::IValue> host_values_;
  std::vector<ScalarUse> scalar_uses_;
  // Per node (empty: none): kReadsHostScalar if it has a ScalarUse, kReadsWrappedHostScalar
  // if one of them takes a wrapped-number Tensor.
  static constexpr uint8_t kReadsHostScalar = 1, kReadsWrappedHostScalar = 2;
  std::vector<uint8_t> scalar_node_;
  // Per node: values whose last reader it is (not outputs); freed after the node runs
  // when keep_values(false), so intermediates die as early as in eager.
  std::vector<std::vector<ir::ValueId>> last_uses_;
  bool differentiable_ = false;
  bool keep_values_ = true;
  bool check_host_values_ = false;
};

// Convenience: Interpreter(g).run(inputs).
std::vector<at::Tensor> interpret(const ir::Graph& g, const std::vector<at::Tensor>& inputs);

}  // namespace tcap
