#include "fuse/decompose.h"

#include "ir/verify_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <sstream>
#include <unordered_map>

namespace tcap::fuse {

// Note [Decompositions for fusion]
// A fusion group has one iteration space: a full shape and one set of reduced dims
// (Note [Fusion groups]). native_layer_norm_backward computes results in three: grad_input
// reduces each row (the normalized dims), grad_weight and grad_bias reduce the columns
// (the outer dims). As one ATen call it fuses with nothing, so before grouping it is split:
//
//   gi = native_layer_norm_backward(go, x, shape, mean, rstd, w, b, [1, 0, 0])  Row op
//   gw = sum(go * ((x - mean) * rstd), outer dims)                             column reduction
//   gb = sum(go, outer dims)                                                   column reduction
//
// gi becomes a two-pass row kernel (lowering.cpp) that also takes the pointwise ops around
// it; gw and gb become one column-reduction kernel (the fusion pass lets a reduction join
// a group that reads the same tensor, Note [Sibling reductions]). The split recomputes
// (x - mean) * rstd in both kernels instead of storing it: one extra read of x.
//
// The sum decomposition runs in the tensors' own dtype, so it is only used when go, x,
// mean, rstd and w all are float32 or float64 (ATen accumulates bf16/f16 in float: a sum in
// bf16 would be worse). Otherwise gw and gb stay one native call with mask [0, gw, gb].
// Rows of no outer dims (x's rank == the normalized rank) keep gw and gb native too: a sum
// over an empty dim list means a sum over everything in ATen.

namespace {

ir::TensorMeta dense_meta(c10::ScalarType dtype, c10::ArrayRef<int64_t> sizes, c10::Device device) {
  ir::TensorMeta m;
  m.dtype = dtype;
  m.sizes.assign(sizes.begin(), sizes.end());
  const auto st = c10::contiguous_strides(sizes);
  m.strides.assign(st.begin(), st.end());
  m.device = device;
  return m;
}

class Decomposer {
 public:
  Decomposer(const ir::Graph& g, const c10::Device& device) : g_(g), device_(device) {}

  Decomposed run() {
    Decomposed d;
    bool any = false;
    for (const auto& n : g_.nodes()) any = any || is_layer_norm_backward(n);
    if (!any) {
      d.graph = g_;
      return d;
    }
    for (const auto& h : g_.hooks()) out_.add_hook(h.kind, h.autograd_node, h.slot);
    for (const auto& n : g_.nodes()) {
      if (n.kind == ir::NodeKind::Input) {
        map_[n.outputs.at(0).values.at(0)] = out_.add_input(n.input_kind, n.name, g_.value(n.outputs[0].values[0]).meta);
      } else if (n.kind == ir::NodeKind::Output) {
        std::vector<ir::ValueId> vs;
        for (const auto& a : n.args) vs.push_back(map_.at(a.values.at(0)));
        out_.set_outputs(vs, n.output_names, n.output_kinds);
      } else if (is_layer_norm_backward(n)) {
        std::string what;
        if (split_layer_norm_backward(n, &what)) ++d.count;
        d.decisions.push_back("%" + std::to_string(n.id) + " " + n.qualified_op() + ": " + what);
      } else {
        ir::copy_node(g_, n, out_, map_);
      }
    }
    if (d.count == 0) {
      d.graph = g_;
      return d;
    }
    for (const auto& [op, schema] : g_.schemas()) out_.schemas().emplace(op, schema);
    out_.meta() = g_.meta();
    ir::verify(out_);
    d.graph = std::move(out_);
    return d;
  }

 private:
  static bool is_layer_norm_backward(const ir::Node& n) {
    return n.kind == ir::NodeKind::Call && n.op == "aten::native_layer_norm_backward" && n.overload.empty();
  }

  // Arguments: grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask.
  bool split_layer_norm_backward(const ir::Node& n, std::string* what) {
    auto copy_unchanged = [&](const std::string& why) {
      ir::copy_node(g_, n, out_, map_);
      *what = "kept as one ATen call: " + why;
      return false;
    };
    if (n.args.size() != 8 || n.outputs.size() != 3 || n.args[7].kind != ir::ArgKind::BoolList ||
        n.args[7].ints.size() != 3 || n.args[2].kind != ir::ArgKind::IntList) {
      return copy_unchanged("unexpected arguments");
    }
    for (int i : {0, 1, 3, 4}) {
      if (n.args[static_cast<size_t>(i)].kind != ir::ArgKind::Value) return copy_unchanged("an undefined tensor argument");
    }
    const bool has_weight = n.args[5].kind == ir::ArgKind::Value;
    if (!has_weight && n.args[5].kind != ir::ArgKind::None && n.args[5].kind != ir::ArgKind::UndefinedTensor) {
      return copy_unchanged("unexpected weight argument");
    }
    auto wants = [&](size_t k) { return n.args[7].ints[k] != 0 && n.outputs[k].kind == ir::ArgKind::Value; };
    if (!wants(0)) return copy_unchanged("no grad_input is computed");
    bool same_device = true;
    ir::for_each_value(n.args, [&](ir::ValueId v) { same_device = same_device && g_.value(v).meta.device == device_; });
    if (!same_device) return copy_unchanged("a tensor is not on " + device_.str());

    const ir::ValueId go = n.args[0].values[0], x = n.args[1].values[0], mean = n.args[3].values[0],
                      rstd = n.args[4].values[0];
    const auto& xm = g_.value(x).meta;
    const int64_t rank = static_cast<int64_t>(xm.sizes.size());
    const int64_t k = static_cast<int64_t>(n.args[2].ints.size());
    std::vector<int64_t> outer;
    for (int64_t d = 0; d < rank - k; ++d) outer.push_back(d);
    bool sums_ok = !outer.empty();
    std::string sums_why = outer.empty() ? "the input has no outer dims" : "";
    const c10::ScalarType dt = xm.dtype;
    if (dt != c10::kFloat && dt != c10::kDouble) {
      sums_ok = false;
      sums_why = "weight/bias gradients of " + std::string(c10::toString(dt)) + " accumulate in float";
    }
    ir::for_each_value(n.args, [&](ir::ValueId v) {
      if (g_.value(v).meta.dtype != dt && sums_ok) {
        sums_ok = false;
        sums_why = "mixed dtypes";
      }
    });

    // grad_input: the same op, asked for grad_input only.
    ir::Node gi = n;
    gi.args[6] = ir::Arg::none("bias");  // grad_input does not read it
    gi.args[7].ints = {1, 0, 0};
    gi.outputs = {n.outputs[0], ir::Arg(), ir::Arg()};
    gi.outputs[1].kind = ir::ArgKind::UndefinedTensor;
    gi.outputs[2].kind = ir::ArgKind::UndefinedTensor;
    const bool rest = wants(1) || wants(2);
    if (rest && !sums_ok) {
      // One native call for weight and bias: gradients as eager computes them.
      ir::Node wb = n;
      wb.args[7].ints = {0, wants(1) ? 1 : 0, wants(2) ? 1 : 0};
      wb.outputs[0] = ir::Arg();
      wb.outputs[0].kind = ir::ArgKind::UndefinedTensor;
      ir::copy_node(g_, gi, out_, map_);
      ir::copy_node(g_, wb, out_, map_);
      *what = "grad_input as a row op; weight/bias gradients stay an ATen call (" + sums_why + ")";
      return true;
    }
    ir::copy_node(g_, gi, out_, map_);
    if (wants(1)) {
      const ir::ValueId xhat = call(n, "aten::mul", "Tensor",
                                    {ir::Arg::value(call(n, "aten::sub", "Tensor",
                                                         {ir::Arg::value(map_.at(x), "self"),
                                                          ir::Arg::value(map_.at(mean), "other"),
                                                          ir::Arg::integer(1, "alpha")},
                                                         xm.sizes),
                                                    "self"),
                                     ir::Arg::value(map_.at(rstd), "other")},
                                    xm.sizes);
      const ir::ValueId prod = call(n, "aten::mul", "Tensor",
                                    {ir::Arg::value(map_.at(go), "self"), ir::Arg::value(xhat, "other")}, xm.sizes);
      map_[n.outputs[1].values[0]] = sum(n, prod, outer, g_.value(n.outputs[1].values[0]).meta);
    }
    if (wants(2)) map_[n.outputs[2].values[0]] = sum(n, map_.at(go), outer, g_.value(n.outputs[2].values[0]).meta);
    *what = "grad_input as a row op" + std::string(rest ? ", weight/bias gradients as column sums" : "");
    return true;
  }

  // A new Call node in the output graph, attributed to the node it comes from.
  ir::ValueId call(const ir::Node& from, const char* op, const char* overload, std::vector<ir::Arg> args,
                   c10::ArrayRef<int64_t> sizes, const ir::TensorMeta* meta = nullptr) {
    ir::Node m;
    m.kind = ir::NodeKind::Call;
    m.op = op;
    m.overload = overload;
    m.args = std::move(args);
    m.phase = from.phase;
    m.grad_mode = from.grad_mode;
    m.autograd_node = from.autograd_node;
    m.hook = from.hook;
    const auto id = static_cast<ir::NodeId>(out_.nodes().size());
    const ir::TensorMeta& xm = g_.value(from.args[1].values[0]).meta;
    const ir::ValueId v = out_.new_value(id, 0, -1, meta ? *meta : dense_meta(xm.dtype, sizes, xm.device));
    m.outputs.push_back(ir::Arg::value(v));
    out_.add_node(std::move(m));
    const std::string q = std::string(op) + "." + overload;
    if (!out_.schemas().count(q)) out_.schemas()[q] = ir::known_schema_string(op, overload);
    return v;
  }

  ir::ValueId sum(const ir::Node& from, ir::ValueId v, const std::vector<int64_t>& dims, const ir::TensorMeta& meta) {
    ir::Arg d;
    d.kind = ir::ArgKind::IntList;
    d.name = "dim";
    d.ints = dims;
    ir::Arg dtype = ir::Arg::none("dtype");
    return call(from, "aten::sum", "dim_IntList", {ir::Arg::value(v, "self"), d, ir::Arg::boolean(false, "keepdim"), dtype},
                meta.sizes, &meta);
  }

  const ir::Graph& g_;
  const c10::Device device_;
  ir::Graph out_;
  std::unordered_map<ir::ValueId, ir::ValueId> map_;
};

}  // namespace

Decomposed decompose_for_fusion(const ir::Graph& g, const c10::Device& device) {
  return Decomposer(g, device).run();
}

}  // namespace tcap::fuse
