#include "fuse/rewriter.h"

#include "ir/graph_copy.h"

#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>

namespace tcap::fuse {

ir::TensorMeta dense_meta(c10::ScalarType dtype, c10::ArrayRef<int64_t> sizes, c10::Device device) {
  ir::TensorMeta m;
  m.dtype = dtype;
  m.sizes.assign(sizes.begin(), sizes.end());
  const auto st = c10::contiguous_strides(sizes);
  m.strides.assign(st.begin(), st.end());
  m.device = device;
  return m;
}

ir::Arg int_list_arg(std::vector<int64_t> v, const char* name) {
  ir::Arg a;
  a.kind = ir::ArgKind::IntList;
  a.name = name;
  a.ints = std::move(v);
  return a;
}

ir::Arg scalar_type_arg(c10::ScalarType t, const char* name) {
  ir::Arg a;
  a.kind = ir::ArgKind::ScalarType;
  a.name = name;
  a.i = static_cast<int64_t>(t);
  return a;
}

ir::Arg device_arg(const c10::Device& d, const char* name) {
  ir::Arg a;
  a.kind = ir::ArgKind::Device;
  a.name = name;
  a.s = d.str();
  return a;
}

bool is_call(const ir::Node& n, const char* op) {
  return n.kind == ir::NodeKind::Call && n.op == op && n.overload.empty();
}

bool absent(const ir::Arg& a) { return a.kind == ir::ArgKind::None || a.kind == ir::ArgKind::UndefinedTensor; }

std::string dense_float_refusal(const ir::Graph& g, const ir::Node& n, ir::ValueId x, const c10::Device& device) {
  const auto& xm = g.value(x).meta;
  if (xm.dtype != c10::kFloat && xm.dtype != c10::kDouble) {
    return std::string(c10::toString(xm.dtype)) + " statistics accumulate in float";
  }
  std::string why;
  ir::for_each_value(n.args, [&](ir::ValueId v) {
    const auto& m = g.value(v).meta;
    if (!why.empty()) return;
    if (m.device != device) why = "a tensor is not on " + device.str();
    else if (m.dtype != xm.dtype) why = "mixed dtypes";
    else if (!m.is_contiguous()) why = "a tensor is not dense and row-major";
  });
  for (const auto& o : n.outputs) {
    if (why.empty() && o.kind == ir::ArgKind::Value && !g.value(o.values[0]).meta.is_contiguous()) {
      why = "a result is not dense and row-major";
    }
  }
  return why;
}

Decomposed Rewriter::run() {
  Decomposed d;
  plan(&d);
  bool any = false;
  for (const auto& n : g_.nodes()) any = any || selected(n);
  if (!any) return d;  // no copy: the caller keeps its graph
  ir::copy_hooks(g_, out_);
  for (const auto& n : g_.nodes()) {
    before(n);
    if (ir::copy_boundary(g_, n, out_, map_)) continue;
    if (selected(n)) {
      if (rewrite(n)) ++d.count;
    } else {
      ir::copy_node(g_, n, out_, map_);
    }
  }
  at_end();
  if (d.count == 0) return d;
  ir::finish_copy(g_, out_);
  d.graph = std::move(out_);
  return d;
}

ir::ValueId Rewriter::call(const ir::Node& from, const char* op, const char* overload, std::vector<ir::Arg> args,
                           ir::TensorMeta meta, ir::ValueId view_of) {
  return out_.add_call(op, overload, std::move(args), std::move(meta), &from, view_of);
}

ir::ValueId Rewriter::unary(const ir::Node& from, const char* op, ir::ValueId a) {
  return call(from, op, "", {ir::Arg::value(a, "self")}, dense_meta(meta(a).dtype, meta(a).sizes, meta(a).device));
}

ir::ValueId Rewriter::binary(const ir::Node& from, const char* op, ir::ValueId a, ir::ValueId b,
                             c10::ArrayRef<int64_t> sizes) {
  std::vector<ir::Arg> args{ir::Arg::value(a, "self"), ir::Arg::value(b, "other")};
  if (std::string(op) == "aten::add" || std::string(op) == "aten::sub") args.push_back(ir::Arg::integer(1, "alpha"));
  return call(from, op, "Tensor", std::move(args), dense_meta(meta(a).dtype, sizes, meta(a).device));
}

ir::ValueId Rewriter::add_scalar(const ir::Node& from, ir::ValueId a, double s) {
  return call(from, "aten::add", "Scalar", {ir::Arg::value(a, "self"), ir::Arg::real(s, "other"), ir::Arg::integer(1, "alpha")},
              dense_meta(meta(a).dtype, meta(a).sizes, meta(a).device));
}

ir::ValueId Rewriter::reduce(const ir::Node& from, const char* op, ir::ValueId a, std::vector<int64_t> dims, bool keepdim) {
  std::vector<int64_t> sizes;
  const auto& in = meta(a).sizes;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) sizes.push_back(in[static_cast<size_t>(d)]);
    else if (keepdim) sizes.push_back(1);
  }
  const std::string name(op);
  const char* overload = name == "aten::sum" ? "dim_IntList" : name == "aten::mean" ? "dim" : "";
  std::vector<ir::Arg> args{ir::Arg::value(a, "self"), int_list_arg(std::move(dims), "dim"),
                            ir::Arg::boolean(keepdim, "keepdim")};
  if (name != "aten::amax") args.push_back(ir::Arg::none("dtype"));
  return call(from, op, overload, std::move(args), dense_meta(meta(a).dtype, sizes, meta(a).device));
}

ir::ValueId Rewriter::view(const ir::Node& from, ir::ValueId v, std::vector<int64_t> sizes) {
  ir::TensorMeta m = dense_meta(meta(v).dtype, sizes, meta(v).device);
  return call(from, "aten::view", "", {ir::Arg::value(v, "self"), int_list_arg(std::move(sizes), "size")}, std::move(m), v);
}

void Rewriter::result(const ir::Node& n, size_t k, ir::ValueId v) {
  const ir::ValueId orig = n.outputs.at(k).values.at(0);
  ir::TensorMeta& vm = out_.value(v).meta;
  const ir::TensorMeta& om = g_.value(orig).meta;
  TORCH_INTERNAL_ASSERT(vm.sizes == om.sizes && vm.dtype == om.dtype, "tcap: the rewritten result ", k, " of ",
                        n.qualified_op(), " is ", c10::toString(vm.dtype), c10::IntArrayRef(vm.sizes),
                        " where the op's is ", c10::toString(om.dtype), c10::IntArrayRef(om.sizes));
  vm = om;
  map_[orig] = v;
}

}  // namespace tcap::fuse
