// What tcap's passes know about ATen operators, in one table keyed by operator name
// ("aten::mul"): whether an op is pointwise, a view, cheap enough to recompute, always
// returns a fresh tensor, only makes sense on floating results, and its in-place twin.
//
// Passes ask this table instead of keeping their own string sets: the min-cut
// partitioner (what may be recomputed), buffer reuse (in-place twins, fresh producers,
// arithmetic that commutes), the fusion pass (views, views that keep their base's first
// element, float-only ops), compile_step's capture comparison (update ops, norms), the
// interpreter (kernels that trust their arguments). How an op lowers to kernel IR lives in
// fuse/lowering.cpp, because kernel IR is a later stage than ir/; a test checks that every
// op the lowering table calls pointwise is Pointwise here.
//
// Facts from the operator's schema (random ops: the nondeterministic_seeded tag; aliasing
// and in-place writes: alias annotations) are read from the schema, not listed here
// (ir::Node::draws_random_numbers, Value::view_of / version_of); so is Pointwise where
// LibTorch tags it (Note [Pointwise from the schema tags]).
#pragma once

#include <tcap/graph.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tcap::ir {

enum class OpFact : uint32_t {
  Pointwise = 1u << 0,     // one output element per (broadcast) element of its inputs
  View = 1u << 1,          // returns a view of an input (no data moves)
  Recomputable = 1u << 2,  // cheap enough to recompute in a backward (pointwise math, casts, views, fills)
  FreshResult = 1u << 3,   // the out-of-place overloads always return a new, dense tensor
  FloatOnly = 1u << 4,     // fused only when its results are floating point
  Reduction = 1u << 5,     // reduces over some dims
  // Communicates with other processes (a gradient all-reduce): runs exactly once per call,
  // after everything it reads and in graph order, never recomputed, never run ahead to
  // compute a host guard (every rank must issue the same collectives in the same order).
  Collective = 1u << 6,
  // A view whose first element is its base's (t, transpose, permute, view, unsqueeze,
  // squeeze, expand, alias): fusion reads it through its base (Note [Views read through
  // their base], fuse/groups.h).
  KeepsOffset = 1u << 7,
  // An in-place op an optimizer's update is made of (add_, sub_, mul_, addcdiv_,
  // addcmul_): a constant scalar argument of one that writes a parameter may be the
  // learning rate (compile_step's capture comparison).
  UpdateStep = 1u << 8,
  // Reduces to a norm (or a max, the inf-norm): what clip_grad_norm_'s item() reads.
  Norm = 1u << 9,
  // Its CPU kernel indexes its inputs by sizes it assumes agree, unchecked: the
  // interpreter checks them first (Note [Kernels that trust their arguments]).
  TrustsArguments = 1u << 10,
  // Binary arithmetic with Tensor and Scalar overloads (add, sub, mul, div).
  Arithmetic = 1u << 11,
  // Its two tensor operands may swap (mul; add when alpha is 1).
  Commutative = 1u << 12,
  // Runs generated code its node names by place in the kernel table of the compiled graph
  // it belongs to (tcap::fused, tcap::fused_horizontal; interp/direct_calls.h): it runs
  // only with that table, never through the dispatcher.
  RunsTableKernel = 1u << 13,
};

struct OpFacts {
  uint32_t flags = 0;
  // The in-place form taking the same arguments ("aten::mul" -> "aten::mul_"), or empty.
  std::string in_place_twin;
  bool has(OpFact f) const { return (flags & static_cast<uint32_t>(f)) != 0; }
};

// The facts of an operator by name without overload ("aten::mul"); an op the table does
// not list has no facts (flags 0, no twin).
const OpFacts& op_facts(std::string_view op);
inline bool op_has(std::string_view op, OpFact f) { return op_facts(op).has(f); }

// Every operator name the table lists (tests check it against the lowering table).
std::vector<std::string> ops_with_facts();

// Note [Pointwise from the schema tags]
// Whether an op is pointwise comes from LibTorch: an operator with an overload tagged
// `pointwise` in native_functions.yaml is Pointwise here (read from the dispatcher's
// schemas when the table is first used). The table says so itself only for the ops this
// LibTorch does not tag (some activations, the pointwise backward formulas, _to_copy);
// a test checks that they are still untagged, so that a LibTorch that tags them shows
// the row can drop its own flag.
std::vector<std::string> pointwise_without_tag();

// Note [Sizes that come from values]
// An op whose output sizes come from its inputs' values, not their shapes (nonzero,
// masked_select, unique, a boolean mask's index: LibTorch tags them dynamic_output_shape,
// on the overload or on its functional overload), runs in compiled graphs like any
// other, but the sizes of its results are a guard, as a value read on the host is
// (cache::HostReads): a replay compares them with the recorded ones as soon as the op has
// run (Interpreter::check_host_values), before anything reads its results, and a call
// whose sizes differ stops there and is served another way (another entry, a capture).
// aten::index.Tensor is one only with a boolean (or uint8) index; with integer indices its
// output shape is the indices' shape. Ops whose output shapes depend on values without a
// tag (found by the check at capture, capture/shape_rules.h) stay eager: some of their
// results are read by host code below the dispatcher (pack_padded_sequence's batch sizes).
bool sizes_from_values(const Graph& g, const Node& n);
// LibTorch's dynamic_output_shape tag, on the operator's overload or on the functional
// overload of its name (which the .out overloads lack); read once per operator.
bool has_dynamic_output_shape_tag(const std::string& op, const std::string& overload);
// Whether a replay of n reads something on the host that a guard must check: a value it
// hands to host code (item(), equal(), is_nonzero()) or the sizes of its results (Note
// [Sizes that come from values]).
bool reads_on_host(const Graph& g, const Node& n);

// Note [Writes a schema does not show]
// native_batch_norm (and its cuDNN and MIOpen twins) update their running statistics in
// place in training mode, yet their schemas carry no (a!) annotation, so capture records
// no new version for them. A pass that runs such a node a second time (a recompute for a
// backward) must run it on copies of those arguments. The arguments of n written that
// way, in argument order (empty for every other op).
std::vector<size_t> hidden_writes(const Node& n);
// The inputs of g (positions in its input order) that nodes write that way.
std::vector<size_t> hidden_written_inputs(const Graph& g);
// The input node whose tensor value v is or views (its alias root's producer), else null:
// a write into v is a write into that input.
const Node* input_aliased_by(const Graph& g, ValueId v);

// Note [Inputs that share storage]
// A graph's Input nodes are distinct values, yet two of them may be views of one storage
// (f(a, b) with b = a.narrow(...); the gradients of parameters that a cat's backward
// sliced from one tensor): a write into one then reaches the other, and the IR has no link
// that says so (the alias geometry guards keep a graph to calls that alias as its capture
// did, Note [Alias geometry guards]). Capture lists the names of the inputs that shared a
// storage with another input under this metadata key (join_input_names); a pass that
// would move a write into one of them past reads of other inputs (Note [In-place updates
// as kernels]) leaves its writes alone. Graph copies, subgraphs and rewrites keep the
// metadata.
constexpr const char* kInputsShareStorage = "inputs_share_storage";
// The metadata's value for these names ("p0.grad, p1.grad"), and whether it lists `name`.
std::string join_input_names(const std::vector<std::string>& names);
bool lists_input(const std::string& joined, const std::string& name);

}  // namespace tcap::ir
