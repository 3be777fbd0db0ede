// One capture: the graph being recorded, the tensor->value table, and the names the
// user gave to inputs, parameters and buffers. Driven by the recorder's fallback
// (before_op / after_op), by the backward driver (begin/end_backward) and by hook
// wrappers (begin/end_hook).
#pragma once

#include <tcap/capture.h>
#include <tcap/graph.h>

#include "capture/engine_shim.h"
#include "capture/value_table.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <unordered_set>
#include <vector>

namespace tcap::capture {

// Node::name() (which demangles on every call), cached per node type on this thread.
const std::string& node_name(const torch::autograd::Node& node);

// Facts about an operator that the recorder needs on every call, computed once.
struct OpInfo {
  enum class IntHint : uint8_t { Int, ScalarType, Layout, MemoryFormat };
  std::string op, overload, qualified, schema;
  int id = 0;  // dense, one per operator in the recorder's registry (see Session::record_schema)
  size_t num_arguments = 0, num_returns = 0;
  bool composite_implicit = false;
  std::vector<IntHint> int_hint;           // per argument
  std::vector<std::string> arg_name;       // per argument
  std::vector<uint8_t> arg_is_write;       // per argument: Tensor(a!)
  std::vector<int> return_alias_arg;       // per return: the argument it aliases, or -1
  std::vector<uint8_t> return_is_write;    // per return
  // Note [Output shapes that depend on values] (capture/shape_rules.h):
  bool dynamic_output_shape = false;  // LibTorch's tag, on it or on its functional overload
  bool rerunnable = false;            // writes no argument and draws no random numbers
  bool returns_tensors = false;
  static OpInfo from(const c10::OperatorHandle& op);
};

class Session {
 public:
  explicit Session(CaptureOptions options);
  // Not copyable or movable: the value table refers to graph_.
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }
  const CaptureOptions& options() const { return options_; }

  // --- recorder -------------------------------------------------------------------
  // What before_op learns about a call; after_op appends the node (see Note [Deferred
  // call nodes]). Reused across ops.
  struct Pending {
    bool active = false;
    bool grad_mode = true;
    ir::Phase phase = ir::Phase::Forward;
    int hook = -1;
    const std::string* autograd_node = nullptr;  // immortal or owned by the session
    uint32_t args_begin = 0;                     // the arguments' first entry in raw_args_
    c10::SmallVector<ir::ValueId, 8> arg_first_value;   // per argument: its (first) tensor value
    std::vector<std::pair<size_t, at::Tensor>> writes;  // mutated arguments (Tensor(a!))
    void reset() {
      active = false;
      hook = -1;
      autograd_node = nullptr;
      arg_first_value.clear();
      writes.clear();
    }
  };
  void before_op(const OpInfo& info, c10::ArrayRef<c10::IValue> args, Pending& p);
  void after_op(const OpInfo& info, c10::ArrayRef<c10::IValue> rets, Pending& p);

  // --- backward driver and hooks ----------------------------------------------------
  void begin_backward(const std::vector<at::Tensor>& root_grads);
  void end_backward();
  // slot >= 0: an opaque hook (Note [Opaque hooks]): its body is not recorded and
  // end_opaque_hook records one CallHook node that replay turns into a call of the hook.
  int begin_hook(ir::HookKind kind, const std::string& autograd_node, int slot = -1);
  void end_hook(int hook, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& out);
  // `node_in`: for a post-hook, the gradients the node received (empty otherwise).
  void end_opaque_hook(int hook, const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& node_in,
                       const std::vector<at::Tensor>& out);
  // Names the autograd node a backward op ran in (default: its type, "MulBackward0").
  using NodeLabeler = std::function<std::string(const torch::autograd::Node&)>;
  void set_node_labeler(NodeLabeler f) { node_labeler_ = std::move(f); }
  void abort_hook(int hook);
  // Hooks (by object address) that a backward recorded by this session records as opaque
  // CallHook nodes with the mapped slot (Note [Opaque hooks]); nullptr: every hook body is
  // recorded. The map must outlive the recording.
  using HookSlots = std::unordered_map<const void*, int>;
  void set_opaque_hooks(const HookSlots* slots) { opaque_hooks_ = slots; }
  const HookSlots* opaque_hooks() const { return opaque_hooks_; }

  // --- user declarations -------------------------------------------------------------
  void name_tensor(const at::Tensor& t, ir::InputKind kind, const std::string& name);
  ir::ValueId declare_input(const at::Tensor& t, const std::string& name,
                            ir::InputKind kind = ir::InputKind::UserInput);
  void mark_output(const at::Tensor& t, const std::string& name);

  // A copy of the graph so far, ended by an Output node (see CaptureGuard::graph), with
  // the deferred call nodes written into the copy (Note [Deferred call nodes]).
  ir::Graph snapshot() const;
  std::optional<ir::ValueId> lookup(const at::Tensor& t) const { return table_.lookup(t); }
  // The value bound to t, or a new Tangent input named `name` (a gradient entering a
  // region from code that was not recorded).
  ir::ValueId tangent_for(const at::Tensor& t, const std::string& name);
  // The graph recorded so far (no Output node).
  const ir::Graph& graph() {
    flush_schemas();
    flush_calls();
    return graph_;
  }
  const std::vector<at::Tensor>& input_tensors() const { return input_tensors_; }
  // The roots of a backward() or grad() call made while recording (kept alive, so that an
  // address cannot be reused for another node); without retain_graph (keep_graph false)
  // what they reach is noted as used up.
  void note_backward_roots(const torch::autograd::edge_list& roots, bool keep_graph);
  // Whether a backward made while recording without retain_graph reached autograd node n:
  // its saved tensors are freed, so no later backward can run through it, in eager either.
  bool used_up_by_backward(const torch::autograd::Node* n) const { return reached_.count(n) > 0; }
  // Whether any backward made while recording reached autograd node n.
  bool reached_by_backward(const torch::autograd::Node* n) const { return reached_any_.count(n) > 0; }
  // Code that ran with the recording key off did something a replay would not redo (a
  // collective: DistributedDataParallel's buffer broadcast). The first reason is kept;
  // tcap::compile and compile_step refuse such a capture with it.
  void note_unreplayable(const std::string& why) {
    if (unreplayable_.empty()) unreplayable_ = why;
  }
  const std::string& unreplayable_reason() const { return unreplayable_; }
  // Code that would hide from this capture (collectives) records itself as replayable
  // operators instead (compile_step; Note [Recorded post-accumulate-grad hooks]).
  void set_records_collectives(bool on) { records_collectives_ = on; }
  bool records_collectives() const { return records_collectives_; }

 private:
  ir::ValueId value_for(const at::Tensor& t);  // lookup, or a new Input node
  std::vector<ir::ValueId> values_of(const std::vector<at::Tensor>& ts);  // kNoValue for undefined
  // A CallHook node for `hook` whose results are new values bound to `out`.
  void add_call_hook(int hook, std::vector<ir::Arg> args, const std::vector<at::Tensor>& out);
  ir::ValueId new_input(const at::Tensor& t, ir::InputKind kind, std::string name);
  // Fills `a` (a default Arg, unnamed) from an iv that has no compact RawArg form
  // (convert_raw takes None, tensors, tensor lists, bools, ints, doubles and int lists).
  void convert_full(ir::Arg& a, const c10::IValue& iv);
  // An argument or result as the recorder keeps it until the graph is read (Note
  // [Deferred call nodes]): 24 bytes, no heap; lists live in the session's arenas.
  struct RawArg {
    enum class Form : uint8_t { Inline, Values, Ints, Full };
    ir::ArgKind kind = ir::ArgKind::None;
    Form form = Form::Inline;
    int32_t n = 0;   // Values/Ints: element count; WrappedScalar: its dtype
    int64_t i = 0;   // Inline: Value id, Int, Bool, enum; Values/Ints/Full: first index
    double d = 0.0;  // Double, WrappedScalar (floating)
  };
  // Appends iv's RawArg to raw_args_.
  void convert_raw(const c10::IValue& iv, OpInfo::IntHint hint, ir::ValueId* first_value);
  // Calls f(v) for every tensor value of `a` (kNoValue entries included).
  template <class F>
  void for_each_raw_value(const RawArg& a, F&& f) const;
  void materialize(const RawArg& raw, ir::Arg& a) const;
  // Writes the deferred parts of the Call nodes into `g`: graph_ or a copy of it.
  void materialize_calls(ir::Graph& g) const;
  // materialize_calls(graph_), then empties the arenas.
  void flush_calls();
  ir::ValueId define_output(const at::Tensor& t, ir::NodeId producer, int index, int list_index,
                            bool requires_grad_guess);
  // Notes the operator for the graph's schema table; after_op calls it the first time
  // this session records the operator. The table is filled when the graph is read
  // (flush_schemas, snapshot): map inserts and string copies were a tenth of a
  // small training step's recording.
  void record_schema(const OpInfo& info);
  void flush_schemas();

  friend class ::tcap::CaptureGuard;
  CaptureOptions options_;
  bool recording_ = true;
  std::string unreplayable_;  // see note_unreplayable
  bool records_collectives_ = false;
  // Thread state the guard changed and restores (see CaptureGuard::stop).
  bool prev_multithreading_ = true;
  std::unique_ptr<class EngineHookLease> engine_lease_;
  int in_backward_ = 0;
  std::vector<int> hook_stack_;
  const HookSlots* opaque_hooks_ = nullptr;
  ir::Graph graph_;
  ValueTable table_{graph_};
  std::vector<at::Tensor> input_tensors_;  // aligned with the graph's Input nodes
  // Their storages, each with the first input's name, and the inputs found sharing one
  // (Note [Inputs that share storage]).
  std::unordered_map<const void*, std::string> input_storages_;
  std::vector<std::string> inputs_sharing_;
  struct Named {
    at::Tensor keep_alive;
    ir::InputKind kind;
    std::string name;
  };
  std::unordered_map<const c10::TensorImpl*, Named> names_;
  std::vector<std::pair<ir::ValueId, std::string>> outputs_;
  std::vector<uint8_t> schema_recorded_;  // by OpInfo::id: 1 once the schema is noted
  std::vector<const OpInfo*> unflushed_schemas_;  // OpInfos are immortal (recorder.cpp)
  // Call nodes whose operator, arguments, results and autograd node are not written yet.
  struct DeferredCall {
    ir::NodeId node;
    const OpInfo* info;
    const std::string* autograd_node;  // nullptr: none
    uint32_t args_begin, outputs_begin, num_outputs;
  };
  std::vector<DeferredCall> deferred_;
  std::vector<RawArg> raw_args_;
  std::vector<ir::ValueId> raw_values_;
  std::vector<int64_t> raw_ints_;
  std::vector<ir::Arg> raw_full_;          // kinds with no compact form (strings, devices, ...)
  std::deque<std::string> owned_labels_;   // labels that are not immortal (labeler, hooks)
  std::vector<std::pair<at::Tensor, std::string>> grad_leaves_;  // inputs that may get a .grad
  int auto_names_ = 0;
  int tangents_ = 0;
  NodeLabeler node_labeler_;
  std::vector<std::shared_ptr<torch::autograd::Node>> backward_roots_;
  std::unordered_set<const torch::autograd::Node*> reached_;      // without retain_graph
  std::unordered_set<const torch::autograd::Node*> reached_any_;
};

}  // namespace tcap::capture
