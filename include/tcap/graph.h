// tcap IR: a small, closed graph vocabulary (torch.fx style) over ATen operators.
//
// A Graph is a list of Nodes in topological (= recorded) order. Every node kind
// is one of: Input, Call (an ATen operator), CallHook (an autograd hook call),
// Output. Nodes produce Values; a Value is a tensor with recorded metadata.
// Non-tensor arguments are typed constants stored inline in the Arg.
//
// Mutation and aliasing keep their eager meaning ("a program over real
// buffers"): an in-place or out= op produces a *new version* of the value it
// writes (Value::version_of), a view op produces a value whose Value::view_of
// names its base. Replaying the nodes in order on real tensors reproduces eager.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tcap::ir {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;
// Small inline vectors: most args name one value and most tensors have few dims, and
// the recorder builds one node per ATen call (no heap allocation in the common case).
using ValueIds = c10::SmallVector<ValueId, 2>;
using Dims = c10::SmallVector<int64_t, 5>;

enum class NodeKind { Input, Call, CallHook, Output };
// Saved: an input of a compiled backward graph that the forward saved for it.
// HostScalar: a number that changes between calls without changing the graph (a learning
// rate), passed as a 0-dim float64 CPU tensor; the arguments that read it take it as the
// Scalar, float, int or wrapped-number Tensor their schema declares (Note [Host scalars as
// graph inputs], csrc/passes/scalar_inputs.cpp).
enum class InputKind { UserInput, Parameter, Buffer, Tangent, Constant, Saved, HostScalar };
enum class Phase { Forward, Backward };
// Saved: an output of a compiled forward graph kept for the backward.
enum class OutputKind { User, Grad, Saved };
// AccumulateGrad: a leaf's gradient handed to its AccumulateGrad node where the engine
// ran it (accumulation into .grad, then the leaf's post-accumulate-grad hooks).
enum class HookKind { TensorPreHook, RetainsGradHook, PreHook, PostHook, AccumulateGrad };

// Typed argument (or call result) of a node.
enum class ArgKind {
  None,            // an absent optional (IValue None)
  UndefinedTensor, // a Tensor argument that is an undefined at::Tensor
  Value,           // one tensor: values[0]
  ValueList,       // Tensor[]: values
  OptValueList,    // Tensor?[]: values, kNoValue for None entries
  Bool,            // i (0/1)
  Int,             // i
  Double,          // d
  Complex,         // d (real), d_imag
  String,          // s
  IntList,         // ints
  DoubleList,      // doubles
  BoolList,        // ints (0/1)
  ScalarType,      // i = c10::ScalarType
  Layout,          // i = c10::Layout
  MemoryFormat,    // i = c10::MemoryFormat
  Device,          // s = device string ("cpu", "cuda:0")
  WrappedScalar,   // a wrapped-number tensor (a C++ scalar promoted by ATen): d or i, dtype in i2
  Opaque,          // not representable (a Generator, a custom class); s names its type
};

struct Arg {
  ArgKind kind = ArgKind::None;
  std::string name;  // schema argument name ("" for results)
  ValueIds values;
  int64_t i = 0;
  int64_t i2 = 0;
  double d = 0.0;
  double d_imag = 0.0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> doubles;

  static Arg none(std::string name = {});
  static Arg value(ValueId v, std::string name = {});
  static Arg value_list(std::vector<ValueId> vs, bool optional, std::string name = {});
  static Arg integer(int64_t v, std::string name = {});
  static Arg real(double v, std::string name = {});
  static Arg boolean(bool v, std::string name = {});

  bool is_value() const { return kind == ArgKind::Value; }
  bool refers_to_values() const {
    return kind == ArgKind::Value || kind == ArgKind::ValueList || kind == ArgKind::OptValueList;
  }
  bool operator==(const Arg& o) const;
  bool operator!=(const Arg& o) const { return !(*this == o); }
};

// Calls f(v) for every tensor value the args refer to (kNoValue entries skipped).
template <class F>
void for_each_value(const std::vector<Arg>& args, F&& f) {
  for (const auto& a : args) {
    if (!a.refers_to_values()) continue;
    for (ValueId v : a.values) {
      if (v != kNoValue) f(v);
    }
  }
}

// A non-tensor result an op handed back to the host (item(), is_nonzero(), ...).
inline bool is_host_value(const Arg& a) {
  return a.kind == ArgKind::Bool || a.kind == ArgKind::Int || a.kind == ArgKind::Double;
}

struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Float;
  Dims sizes;
  Dims strides;
  int64_t storage_offset = 0;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool requires_grad = false;
  bool operator==(const TensorMeta& o) const;
  int64_t numel() const;        // INT64_MAX when the product overflows (verify() refuses it)
  bool is_contiguous() const;   // false when strides and sizes differ in length
};

struct Value {
  ValueId id = kNoValue;
  NodeId producer = -1;
  int output_index = 0;  // which result of the producer
  int list_index = -1;   // position inside a Tensor[] result, -1 otherwise
  TensorMeta meta;
  ValueId version_of = kNoValue;  // in-place/out= write: the value this one is a new version of
  ValueId view_of = kNoValue;     // view op: the base value this one aliases
  bool operator==(const Value& o) const;
};

struct Node {
  NodeId id = -1;
  NodeKind kind = NodeKind::Call;
  // Call: qualified operator name ("aten::add") and overload ("Tensor"); the schema
  // string lives once per operator in Graph::schemas().
  std::string op;
  std::string overload;
  std::vector<Arg> args;
  std::vector<Arg> outputs;  // results: Value / ValueList / scalars observed on the host / None
  Phase phase = Phase::Forward;
  bool grad_mode = true;       // GradMode when the op ran
  std::string autograd_node;   // backward: the autograd Node that ran this op ("MulBackward0")
  int hook = -1;               // CallHook: hook id; Call: id of the hook whose body ran it, else -1
  // Input nodes
  InputKind input_kind = InputKind::UserInput;
  std::string name;  // Input: user-facing name ("x", "fc1.weight"); Output: unused
  // Output node: one entry per args[i]
  std::vector<std::string> output_names;
  std::vector<OutputKind> output_kinds;

  std::string qualified_op() const { return overload.empty() ? op : op + "." + overload; }
  // A Call whose operator draws random numbers (tagged nondeterministic_seeded).
  bool draws_random_numbers() const;
  bool operator==(const Node& o) const;
};

struct Hook {
  int id = -1;
  HookKind kind = HookKind::TensorPreHook;
  std::string autograd_node;  // the Node the hook is attached to
  // -1: the hook's body was recorded as ordinary nodes (capture). >= 0: the body was not
  // recorded; replay calls the hook object at this position of the hook list handed to
  // the interpreter (compiled autograd, Note [Opaque hooks]).
  int slot = -1;
  bool operator==(const Hook& o) const;
};

// Note [Use lists]
// The graph keeps, per value, the nodes that read it (fx's Node.users), so users(v) is a
// lookup and a pass that asks it per node stays linear. The lists are kept true by making
// every edit of a node's arguments go through the graph: add_node and set_outputs register
// a new node's reads, replace_all_uses_with and replace_uses move them, edit_node(n, f)
// lets f change anything in node n and then registers n's reads again, and
// edit_constant(n, i, f) changes an argument that refers to no value (the lists stay as
// they are). emplace_node's node has no arguments yet: fill them through edit_node. A
// value id out of range (a malformed graph a test builds for verify()) is not listed.
// Graph equality ignores the lists (they follow from the nodes).
class Graph {
 public:
  // --- construction ------------------------------------------------------
  ValueId add_input(InputKind kind, std::string name, TensorMeta meta);
  // Appends a node; fills in node.id. Values referenced by outputs must have been made with new_value.
  NodeId add_node(Node node);
  ValueId new_value(NodeId producer, int output_index, int list_index, TensorMeta meta);
  // Appends a Call node of `op`.`overload` ("" for none) with one tensor result of `meta`
  // (a view of `view_of` when given), registering the operator's schema from this
  // LibTorch; phase, grad mode, autograd node and hook are taken from `like` when given
  // (a rewrite's ops are attributed to the node they replace). Returns the result.
  ValueId add_call(const std::string& op, const std::string& overload, std::vector<Arg> args, TensorMeta meta,
                   const Node* like = nullptr, ValueId view_of = kNoValue);
  // In-place forms of add_node and new_value for builders that make one node per call
  // (the recorder): the new element, id set and everything else default, to be filled
  // by the caller (a node's arguments through edit_node: Note [Use lists]). The reference
  // is valid until the next node (or value) is added.
  Node& emplace_node(NodeKind kind);
  Value& emplace_value(NodeId producer, int output_index, int list_index);
  void set_outputs(std::vector<ValueId> values, std::vector<std::string> names,
                   std::vector<OutputKind> kinds);
  // Room for this many nodes and values before the next reallocation.
  void reserve(size_t nodes, size_t values) {
    nodes_.reserve(nodes);
    values_.reserve(values);
    uses_.reserve(values);
  }
  int add_hook(HookKind kind, std::string autograd_node, int slot = -1);

  // --- editing (Note [Use lists]) ------------------------------------------
  // Rewires every use of `from` to `to` (arguments of later nodes, and the view_of /
  // version_of links of values). Costs the uses of `from` plus one pass over the values:
  // a pass renaming many values calls replace_uses once instead.
  void replace_all_uses_with(ValueId from, ValueId to);
  // Every rename of `renames` at once, as if each renamed value were gone: chains resolve
  // to their last value (a -> b, b -> c renames a to c); a cycle throws. Nodes are rewired
  // only after the producer of the value they read, as replace_all_uses_with does.
  void replace_uses(const std::unordered_map<ValueId, ValueId>& renames);
  // Calls f(node) on node n, which may change anything in it, then re-registers the
  // values n reads.
  template <class F>
  void edit_node(NodeId n, F&& f) {
    Node& node = nodes_.at(static_cast<size_t>(n));
    forget_reads(n, node.args);
    std::forward<F>(f)(node);
    note_reads(n, node.args);
  }
  // Calls f(arg) on argument i of node n, an argument that refers to no value before
  // and after (a constant: a scalar, a size list, a dtype). Cheaper than edit_node: the
  // use lists are untouched. Throws if the argument refers to values.
  template <class F>
  void edit_constant(NodeId n, size_t i, F&& f) {
    Arg& a = nodes_.at(static_cast<size_t>(n)).args.at(i);
    check_constant(n, i, a);
    std::forward<F>(f)(a);
    check_constant(n, i, a);
  }

  // --- access ----------------------------------------------------------------
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  Value& value(ValueId v) { return values_.at(static_cast<size_t>(v)); }
  const Value& value(ValueId v) const { return values_.at(static_cast<size_t>(v)); }
  const Node& node(NodeId n) const { return nodes_.at(static_cast<size_t>(n)); }
  const std::vector<Hook>& hooks() const { return hooks_; }
  std::vector<NodeId> input_nodes() const;   // in order
  const Node* output_node() const;           // nullptr if none
  std::vector<ValueId> output_values() const;
  // Nodes (by id) that read value v, in order, each once. A lookup (Note [Use lists]); the
  // view is valid until the graph is next edited.
  c10::ArrayRef<NodeId> users(ValueId v) const;
  // Per value: the last node that reads it (the Output node included), -1 if none.
  std::vector<NodeId> last_readers() const;
  // The value v aliases at the bottom of its view_of / version_of chain.
  ValueId alias_root(ValueId v) const;
  // Positions (in input_nodes() order) of the inputs a node of the graph writes into,
  // directly or through a view.
  std::vector<size_t> written_inputs() const;
  size_t num_calls() const;

  // Operator schemas, keyed by Node::qualified_op() ("aten::add.Tensor").
  std::map<std::string, std::string>& schemas() { return schemas_; }
  const std::map<std::string, std::string>& schemas() const { return schemas_; }
  // Free-form metadata (torch version, capture options, ...), serialized as strings.
  std::map<std::string, std::string>& meta() { return meta_; }
  const std::map<std::string, std::string>& meta() const { return meta_; }

  bool operator==(const Graph& o) const;
  bool operator!=(const Graph& o) const { return !(*this == o); }

 private:
  // The reading node n registered with (or removed from) the use list of each value args
  // refer to.
  void note_reads(NodeId n, const std::vector<Arg>& args);
  void forget_reads(NodeId n, const std::vector<Arg>& args);
  static void check_constant(NodeId n, size_t i, const Arg& a);

  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<c10::SmallVector<NodeId, 2>> uses_;  // per value, sorted node ids
  std::vector<Hook> hooks_;
  std::map<std::string, std::string> schemas_;
  std::map<std::string, std::string> meta_;
};

// One value for messages: "%7 f32[4, 5] aten::add.Tensor" or "%0 f32[4] input 'x'".
std::string describe(const Graph& g, ValueId v);

// Whether v is the value of an input of kind HostScalar (Note [Host scalars as graph
// inputs]), and whether node n reads one. Every pass that must tell a host scalar from a
// tensor asks these.
bool is_host_scalar(const Graph& g, ValueId v);
bool reads_host_scalar(const Graph& g, const Node& n);

// Appends a copy of node n of `from` to `to`. `map` renames values of `from` to values of
// `to`: every value n reads must be in it (else throws, naming the node); n's results get
// new values in `to` (same metadata; view/version links renamed when their target is in
// the map, dropped otherwise) and are added to it. Returns the new node's id.
NodeId copy_node(const Graph& from, const Node& n, Graph& to, std::unordered_map<ValueId, ValueId>& map);

// One Input node of a cut graph: the value of the graph cut that it stands for, its kind
// and its name.
struct CutInput {
  ValueId value = kNoValue;
  InputKind kind = InputKind::UserInput;
  std::string name;
};
// One argument of a cut graph's Output node: the value, its name and kind.
struct CutOutput {
  ValueId value = kNoValue;
  std::string name;
  OutputKind kind = OutputKind::User;
};

// A copy of g holding only `nodes` (ids, in graph order), with `inputs` as its Input nodes
// and `outputs` as its Output node. Every value the kept nodes read must be an input or
// made by a kept node. Used to cut forward and backward graphs out of a joint graph, and a
// fusion group out of a graph.
Graph extract_subgraph(const Graph& g, const std::vector<NodeId>& nodes, const std::vector<CutInput>& inputs,
                       const std::vector<CutOutput>& outputs);

// Checks structural invariants (ids, topological order, value producers, version/view
// links, output node last). Throws c10::Error whose message ends with the printed graph.
void verify(const Graph& g);

// Readable printout: one line per node, FX print_readable style:
//   %3 : f32[8, 16] = aten::mul.Tensor(%1, %2)  # users=2
std::string to_string(const Graph& g);
// Tabular printout (FX print_tabular style): opcode | name | target | args | shape.
std::string to_table(const Graph& g);
// Graphviz DOT.
std::string to_dot(const Graph& g);
// SVG rendered by Graphviz `dot -Tsvg`; throws std::runtime_error (one line) if `dot` is
// not installed or fails.
std::string to_svg(const Graph& g);

// Short dtype names used by printers and JSON ("f32", "bf16", ...) and their long names.
std::string dtype_short_name(c10::ScalarType t);
std::string dtype_name(c10::ScalarType t);  // "float32"
c10::ScalarType dtype_from_name(const std::string& name);  // throws on unknown
std::string to_string(NodeKind k);
std::string to_string(InputKind k);
std::string to_string(Phase p);
std::string to_string(OutputKind k);
std::string to_string(HookKind k);
std::string to_string(ArgKind k);

std::ostream& operator<<(std::ostream& os, const Graph& g);

}  // namespace tcap::ir
