// Note [Host scalars as graph inputs]
// Some scalars of a graph change between calls without changing the graph: the learning
// rate of a schedule, Adam's bias-corrected step size, the step count of a fused optimizer
// call (compile_step recomputes them from the optimizers' host state, Note [Host scalars of
// optimizers]). Such a scalar is a graph input of kind HostScalar, a 0-dim float64 CPU
// tensor, and the arguments that take it refer to that input's value, in the positions the
// schema gives a Scalar, a float, an int or a (wrapped-number) Tensor. So the graph says
// what changes per call, every pass sees an ordinary value (renumbering nodes moves no
// patch), and the executable takes the scalars as it takes tensors: a user's compiler, CUDA
// graphs and the fused backends all get the same graph and the same calling convention.
// The interpreter reads the input per run and hands the op the number in the type its
// schema wants (a wrapped-number tensor for a Tensor position, as eager passes a Python
// number), so a replay computes what eager computes, bit for bit. A fused kernel takes
// one as a parameter, read at launch (Note [Kernel parameters] in kir/kir.h), so no kernel
// bakes the number in; an op whose kernel would need it as a constant stays an ATen call.
#include "passes/scalar_inputs.h"

#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

namespace tcap::passes {

ir::Graph scalars_as_inputs(const ir::Graph& g, const std::vector<ScalarArg>& args) {
  if (args.empty()) return g;
  ir::Graph h = g;
  std::vector<ir::CutInput> inputs;
  for (ir::NodeId id : h.input_nodes()) {
    const ir::Node& n = h.node(id);
    inputs.push_back({n.outputs.at(0).values.at(0), n.input_kind, n.name});
  }
  for (const auto& a : args) {
    ir::TensorMeta meta;
    meta.dtype = at::kDouble;
    meta.device = c10::Device(c10::kCPU);
    const ir::ValueId v = h.add_input(ir::InputKind::HostScalar, a.name, meta);
    h.edit_node(a.node, [&](ir::Node& n) {
      ir::Arg& arg = n.args.at(a.arg);
      TORCH_CHECK(arg.kind == ir::ArgKind::Double || arg.kind == ir::ArgKind::WrappedScalar, "tcap: argument ", a.arg,
                  " of node %", a.node, " (", n.qualified_op(), ") is not a floating-point scalar");
      std::string name = arg.name;
      arg = ir::Arg::value(v, std::move(name));
    });
    inputs.push_back({v, ir::InputKind::HostScalar, a.name});
  }
  // The new inputs were appended after their readers: cut the graph again, inputs first.
  std::vector<ir::NodeId> body;
  for (const auto& n : h.nodes()) {
    if (n.kind != ir::NodeKind::Input && n.kind != ir::NodeKind::Output) body.push_back(n.id);
  }
  // (g's value ids are h's: the copy only appended values.)
  const ir::Node* out = g.output_node();  // h's is no longer last (its new inputs are)
  TORCH_CHECK(out != nullptr, "tcap: scalars_as_inputs: the graph has no output node");
  std::vector<ir::CutOutput> outs;
  for (size_t k = 0; k < out->args.size(); ++k) {
    outs.push_back({out->args[k].values.at(0), out->output_names.at(k), out->output_kinds.at(k)});
  }
  ir::Graph r = ir::extract_subgraph(h, body, inputs, outs);
  r.schemas() = g.schemas();
  return r;
}

at::Tensor host_scalar_input(double value) { return at::scalar_tensor(value, at::kDouble); }

}  // namespace tcap::passes
