#include "fuse/classify.h"

#include "fuse/emitter.h"
#include "fuse/lowering.h"
#include "ir/op_facts.h"

namespace tcap::fuse {

namespace {

// Note [Kernel parameters] (kir/kir.h): a node that reads a host scalar joins a kernel only
// when its lowering reads the number through Emitter::in(), as a parameter. A lowering that
// needs it as a constant (lerp's choice of formula, pow's special exponents) throws; the
// node is then lowered here once, into a kernel nobody keeps, to find out.
std::optional<std::string> host_scalar_refusal(const ir::Graph& g, const ir::Node& n) {
  kir::Kernel scratch;
  auto load = [&](ir::ValueId v) -> Val {
    kir::Instr in;
    in.op = kir::OpCode::Load;
    in.dtype = *to_kir(g.value(v).meta.dtype);
    const kir::DType t = in.dtype;
    return {kir::add(scratch, std::move(in)), t};
  };
  Emitter e(g, scratch, load, [&](ir::ValueId v, const std::vector<int>&) { return load(v); });
  try {
    lower(e, n);
  } catch (const c10::Error& err) {
    return std::string(err.what_without_backtrace());
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> classify(const ir::Graph& g, const ir::Node& n, NodeClass* info, const c10::Device& device,
                                    int64_t max_matmul_macs) {
  if (n.kind != ir::NodeKind::Call) return std::string("not an operator call");
  const LoweringRow* row = find_lowering(n);
  if (!row) return "no kernel IR lowering for " + n.qualified_op() + " (runs as an ATen call)";
  // Every tensor read and written must be a dense tensor of a kir dtype on the kernels' device.
  bool has_tensor_arg = false;
  for (const auto& a : n.args) {
    if (a.kind == ir::ArgKind::ValueList || a.kind == ir::ArgKind::OptValueList) return std::string("tensor-list argument");
    if (a.kind == ir::ArgKind::Opaque) return std::string("opaque argument");
    if (a.kind == ir::ArgKind::Complex) return std::string("complex scalar argument");
  }
  auto check_value = [&](ir::ValueId v) -> std::optional<std::string> {
    const auto& m = g.value(v).meta;
    if (m.device != device) return "tensor on " + m.device.str() + ", kernels run on " + device.str();
    if (!to_kir(m.dtype)) return "dtype " + ir::dtype_short_name(m.dtype) + " has no kernels";
    return std::nullopt;
  };
  bool reads_host_scalar = false;
  for (const auto& a : n.args) {
    if (a.kind != ir::ArgKind::Value) continue;
    if (ir::is_host_scalar(g, a.values[0])) {  // a kernel parameter, wherever the kernel runs
      reads_host_scalar = true;
      continue;
    }
    has_tensor_arg = true;
    if (auto why = check_value(a.values[0])) return why;
  }
  if (!has_tensor_arg) return std::string("no tensor argument");
  for (const auto& o : n.outputs) {
    if (o.kind == ir::ArgKind::Value) {
      if (auto why = check_value(o.values[0])) return why;
    } else if (o.kind != ir::ArgKind::None && o.kind != ir::ArgKind::UndefinedTensor) {
      return std::string("non-tensor result");
    }
  }
  // Ops whose arguments change what they compute in ways the table does not model.
  const std::string op = n.qualified_op();
  if (op == "aten::_to_copy") {
    for (size_t i = 1; i < n.args.size(); ++i) {
      const auto& a = n.args[i];
      if ((a.name == "layout" || a.name == "device") && a.kind != ir::ArgKind::None) {
        if (a.name == "device" && (a.s == device.str() || (device.is_cpu() && a.s == "cpu"))) continue;
        return "_to_copy changes " + a.name;
      }
    }
  }
  if (op == "aten::round" && n.args.size() > 1) return std::string("round with decimals");
  if (op == "aten::native_layer_norm_backward") {
    const auto& mask = n.args.at(7).ints;
    if (mask.size() != 3 || !mask[0] || mask[1] || mask[2] || n.outputs.at(0).kind != ir::ArgKind::Value) {
      return std::string("computes weight/bias gradients (only grad_input is a row op; see Note [Decompositions for fusion])");
    }
  }
  if (op == "aten::gelu" || op == "aten::gelu_backward") {
    const auto& s = n.args.back().s;
    if (s != "none" && s != "tanh") return "gelu approximate='" + s + "'";
  }
  if (op == "aten::mse_loss" && n.args.at(2).i == 0) {
    // reduction='none' is pointwise
    info->cls = OpClass::Pointwise;
    info->reduce_dims.clear();
    return std::nullopt;
  }
  const bool float_out = [&] {
    for (const auto& o : n.outputs) {
      if (o.kind == ir::ArgKind::Value && !kir::is_floating(*to_kir(g.value(o.values[0]).meta.dtype))) return false;
    }
    return true;
  }();
  if (ir::op_has(n.op, ir::OpFact::FloatOnly) && !float_out) {
    return std::string("integer result (only floating results are fused for this op)");
  }
  if (reads_host_scalar) {
    if (auto why = host_scalar_refusal(g, n)) return *why + " (runs as an ATen call)";
  }
  if (row->cls == OpClass::Contraction) {
    // Note [Small matmuls as kernels]
    if (!n.overload.empty()) return "the " + n.overload + " overload of a matmul (runs as an ATen call)";
    if (!device.is_cpu()) return std::string("matmuls stay BLAS calls on " + device.str());
    if (!float_out) return std::string("integer matmul (only floating matmuls are fused)");
    const int64_t macs = contraction_macs(g, n);
    if (macs == 0) return std::string("empty matmul");
    if (macs > max_matmul_macs) {
      return std::to_string(macs) + " multiply-adds, above the small-matmul limit of " +
             std::to_string(max_matmul_macs) + " (runs as an ATen call)";
    }
    info->cls = OpClass::Contraction;
    info->reduce_dims = {static_cast<int64_t>(contraction_space(g, n).size()) - 1};
    return std::nullopt;
  }
  info->cls = row->cls;
  info->reduce_dims = row->dims ? row->dims(g, n) : std::vector<int64_t>{};
  if (row->cls != OpClass::Pointwise && info->reduce_dims.empty()) {
    return std::string("reduction over no dims");
  }
  return std::nullopt;
}

}  // namespace tcap::fuse
