#include "fuse/decompose.h"

#include "fuse/decompose_losses.h"
#include "fuse/decompose_norms.h"
#include "fuse/functionalize.h"
#include "fuse/rewriter.h"
#include "fuse/sink_reshapes.h"

#include "fuse/groups.h"

#include "ir/op_facts.h"
#include "ir/verify_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>
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

// Note [Batch norm as kernels]
// native_batch_norm in training and its backward are, on the CPU, a statistics pass and a
// transform pass of ATen's own (37 µs for a [16, 8, 14, 14] input, with the ReLU after it
// another call). Decomposed into the ops they compute, they become one reduction group
// over dims [0, 2, 3, ...] (per channel) that also takes the pointwise ops around them:
//
//   forward   mean = mean(x, R, keepdim); xc = x - mean; var = mean(xc * xc, R, keepdim)
//             invstd = rsqrt(var + eps); out = xc * invstd * w + b   (w, b viewed [1, C, 1..])
//             save_mean = view(mean, [C]); save_invstd = view(invstd, [C])
//             running_mean <- m * mean + (1 - m) * running_mean
//             running_var  <- m * var * M / (M - 1) + (1 - m) * running_var
//   backward  xc = x - save_mean; sdy = sum(dy, R, keepdim); dot = sum(dy * xc, R, keepdim)
//             grad_input = (dy - sdy / M - xc * (dot / M * invstd * invstd)) * invstd * w
//             grad_weight = dot * invstd; grad_bias = sdy
//
// as ATen computes them (batch_norm_cpu_collect_stats: biased variance in the statistics,
// the unbiased one in running_var; M = the number of elements per channel). ATen sums in
// double; the kernels sum in the tensors' dtype (float32 or float64 only), a relative
// difference of about 1e-6 in float32 for the sizes of a training batch.
// The running statistics are written with copy_ (a mutation). A mutation ends every group
// (Note [Fusion groups]), so each copy_ waits until the graph reaches a node that reads or
// writes a running buffer, another mutation or hook, or the end: the ReLU after the batch
// norm still joins its kernel, and nothing in between can see the difference.
// Decomposed only where every tensor is on the fusion's device, of one floating dtype,
// dense and row-major, with more than one element per channel in training (ATen refuses
// one before it gets here). In eval mode the forward is pointwise (the running statistics
// are read, nothing is written); its backward stays one ATen call.

namespace {

class Decomposer : public Rewriter {
 public:
  using Rewriter::Rewriter;

 private:
  // Whether node n is rewritten (a rule's constants are not host scalars).
  bool decomposes(const ir::Node& n) const {
    return (is_layer_norm_backward(n) || is_batch_norm(n) || is_batch_norm_backward(n)) && !ir::reads_host_scalar(g_, n);
  }
  void plan(Decomposed* d) override { decisions_ = d; }
  bool selected(const ir::Node& n) const override { return decomposes(n); }
  bool rewrite(const ir::Node& n) override {
    std::string what;
    const bool done = is_layer_norm_backward(n) ? split_layer_norm_backward(n, &what)
                      : is_batch_norm(n)        ? decompose_batch_norm(n, &what)
                                                : decompose_batch_norm_backward(n, &what);
    decisions_->decisions.push_back("%" + std::to_string(n.id) + " " + n.qualified_op() + ": " + what);
    return done;
  }
  void before(const ir::Node& n) override {
    if (!pending_.empty() && must_flush_before(n)) flush();
  }
  void at_end() override {
    if (!pending_.empty()) flush();  // a graph without an output node
  }

  static bool is_layer_norm_backward(const ir::Node& n) {
    return n.kind == ir::NodeKind::Call && n.op == "aten::native_layer_norm_backward" && n.overload.empty();
  }
  static bool is_batch_norm(const ir::Node& n) {
    return n.kind == ir::NodeKind::Call && n.op == "aten::native_batch_norm" && n.overload.empty();
  }
  static bool is_batch_norm_backward(const ir::Node& n) {
    return n.kind == ir::NodeKind::Call && n.op == "aten::native_batch_norm_backward" && n.overload.empty();
  }

  // Copies n unchanged, saying why it was not decomposed; returns false.
  bool keep(const ir::Node& n, std::string* what, const std::string& why) {
    ir::copy_node(g_, n, out_, map_);
    like_ = nullptr;
    *what = "kept as one ATen call: " + why;
    return false;
  }

  // --- batch norm (Note [Batch norm as kernels]) -------------------------------------

  // Why the tensors of a batch norm node cannot become kernels, or "".
  std::string batch_norm_refusal(const ir::Node& n, ir::ValueId x, bool training = true) const {
    const auto& xm = g_.value(x).meta;
    if (xm.sizes.size() < 2 && (xm.dtype == c10::kFloat || xm.dtype == c10::kDouble)) return "the input has no channel dim";
    std::string why = dense_float_refusal(g_, n, x, device_);
    if (why.empty() && training && xm.numel() / xm.sizes[1] <= 1) why = "one element per channel";
    return why;
  }

  // The dims a batch norm reduces (all but the channel dim) and the [1, C, 1, ...] shape.
  static void channel_dims(const ir::TensorMeta& xm, std::vector<int64_t>* reduce, std::vector<int64_t>* kshape) {
    reduce->clear();
    kshape->assign(xm.sizes.size(), 1);
    (*kshape)[1] = xm.sizes[1];
    for (int64_t d = 0; d < static_cast<int64_t>(xm.sizes.size()); ++d) {
      if (d != 1) reduce->push_back(d);
    }
  }

  // Arguments: input, weight?, bias?, running_mean?, running_var?, training, momentum, eps.
  bool decompose_batch_norm(const ir::Node& n, std::string* what) {
    if (n.args.size() != 8 || n.outputs.size() != 3 || n.args[5].kind != ir::ArgKind::Bool ||
        n.args[6].kind != ir::ArgKind::Double || n.args[7].kind != ir::ArgKind::Double ||
        n.args[0].kind != ir::ArgKind::Value) {
      return keep(n, what, "unexpected arguments");
    }
    for (const auto& o : n.outputs) {
      if (o.kind != ir::ArgKind::Value) return keep(n, what, "unexpected results");
    }
    const bool training = n.args[5].i != 0;
    const ir::ValueId x = n.args[0].values[0];
    if (auto why = batch_norm_refusal(n, x, training); !why.empty()) return keep(n, what, why);
    auto optional_value = [&](size_t i, ir::ValueId* v) {
      *v = n.args[i].kind == ir::ArgKind::Value ? n.args[i].values[0] : ir::kNoValue;
      return n.args[i].kind == ir::ArgKind::Value || n.args[i].kind == ir::ArgKind::None ||
             n.args[i].kind == ir::ArgKind::UndefinedTensor;
    };
    ir::ValueId w, b, rm, rv;
    if (!optional_value(1, &w) || !optional_value(2, &b) || !optional_value(3, &rm) || !optional_value(4, &rv)) {
      return keep(n, what, "unexpected arguments");
    }
    const auto& xm = g_.value(x).meta;
    const double momentum = n.args[6].d, eps = n.args[7].d;
    std::vector<int64_t> R, kshape;
    channel_dims(xm, &R, &kshape);
    const int64_t C = xm.sizes[1];
    const int64_t M = xm.numel() / C;
    like_ = &xm;
    if (!training) return decompose_batch_norm_eval(n, x, w, b, rm, rv, eps, kshape, what);

    const ir::ValueId xin = map_.at(x);
    const ir::ValueId mean = reduce(n, "aten::mean", xin, R, true);
    const ir::ValueId xc = binary(n, "aten::sub", xin, mean, xm.sizes);
    const ir::ValueId var = reduce(n, "aten::mean", binary(n, "aten::mul", xc, xc, xm.sizes), R, true);
    const ir::ValueId invstd =
        call(n, "aten::rsqrt", "", {ir::Arg::value(add_scalar(n, var, eps), "self")}, kshape);
    result(n, 0, affine(n, binary(n, "aten::mul", xc, invstd, xm.sizes), w, b, kshape));
    result(n, 1, view(n, mean, {C}));
    result(n, 2, view(n, invstd, {C}));
    // Running statistics, written back later (pending_). Each update starts from the
    // kernel's statistic (m * stat + (1 - m) * buffer as one add with alpha), so it joins
    // the statistics' kernel instead of making one of its own.
    auto update = [&](ir::ValueId buffer, ir::ValueId stat, double scale) {
      const ir::ValueId scaled = mul_scalar(n, stat, scale, kshape);
      const ir::ValueId updated = call(n, "aten::add", "Tensor",
                                       {ir::Arg::value(scaled, "self"), ir::Arg::value(view(n, map_.at(buffer), kshape), "other"),
                                        ir::Arg::real(1.0 - momentum, "alpha")},
                                       kshape);
      pending_.push_back({&n, buffer, view(n, updated, {C})});
    };
    if (rm != ir::kNoValue) update(rm, mean, momentum);
    if (rv != ir::kNoValue) update(rv, var, momentum * static_cast<double>(M) / static_cast<double>(M - 1));
    like_ = nullptr;
    *what = "decomposed for a per-channel reduction kernel";
    return true;
  }

  // Eval mode: the running statistics are read, nothing is written, and the result is
  // pointwise: (x - running_mean) * rsqrt(running_var + eps) * w + b. The per-channel
  // factor is a small kernel of its own; the rest joins the ops around it. The other two
  // results are empty tensors in eval mode: decomposed only when nothing reads them.
  bool decompose_batch_norm_eval(const ir::Node& n, ir::ValueId x, ir::ValueId w, ir::ValueId b, ir::ValueId rm,
                                 ir::ValueId rv, double eps, const std::vector<int64_t>& kshape, std::string* what) {
    const auto outs = g_.output_values();
    for (size_t k : {1, 2}) {
      const ir::ValueId v = n.outputs[k].values[0];
      if (!g_.users(v).empty() || std::find(outs.begin(), outs.end(), v) != outs.end()) {
        return keep(n, what, "eval mode, and its (empty) statistics results are read");
      }
    }
    if (rm == ir::kNoValue || rv == ir::kNoValue) return keep(n, what, "eval mode without running statistics");
    const auto& xm = g_.value(x).meta;
    const ir::ValueId invstd = call(n, "aten::rsqrt", "", {ir::Arg::value(add_scalar(n, view(n, map_.at(rv), kshape), eps), "self")}, kshape);
    const ir::ValueId xc = binary(n, "aten::sub", map_.at(x), view(n, map_.at(rm), kshape), xm.sizes);
    result(n, 0, affine(n, binary(n, "aten::mul", xc, invstd, xm.sizes), w, b, kshape));
    // Results 1 and 2 are unread: they keep the original's values (ids) unmapped.
    like_ = nullptr;
    *what = "decomposed (eval mode) into pointwise ops";
    return true;
  }

  // Arguments: grad_out, input, weight?, running_mean?, running_var?, save_mean?,
  // save_invstd?, train, eps, output_mask.
  bool decompose_batch_norm_backward(const ir::Node& n, std::string* what) {
    if (n.args.size() != 10 || n.outputs.size() != 3 || n.args[7].kind != ir::ArgKind::Bool ||
        n.args[9].kind != ir::ArgKind::BoolList || n.args[9].ints.size() != 3 ||
        n.args[0].kind != ir::ArgKind::Value || n.args[1].kind != ir::ArgKind::Value) {
      return keep(n, what, "unexpected arguments");
    }
    if (n.args[7].i == 0) return keep(n, what, "eval mode");
    if (n.args[5].kind != ir::ArgKind::Value || n.args[6].kind != ir::ArgKind::Value) {
      return keep(n, what, "no saved statistics");
    }
    const bool has_weight = n.args[2].kind == ir::ArgKind::Value;
    if (!has_weight && n.args[2].kind != ir::ArgKind::None && n.args[2].kind != ir::ArgKind::UndefinedTensor) {
      return keep(n, what, "unexpected weight argument");
    }
    const ir::ValueId dy = n.args[0].values[0], x = n.args[1].values[0];
    if (auto why = batch_norm_refusal(n, x); !why.empty()) return keep(n, what, why);
    if (g_.value(dy).meta.sizes != g_.value(x).meta.sizes) return keep(n, what, "the gradient's shape differs from the input's");
    auto wants = [&](size_t k) { return n.args[9].ints[k] != 0 && n.outputs[k].kind == ir::ArgKind::Value; };
    if (!wants(0) && !wants(1) && !wants(2)) return keep(n, what, "no gradient is computed");
    const auto& xm = g_.value(x).meta;
    std::vector<int64_t> R, kshape;
    channel_dims(xm, &R, &kshape);
    const int64_t C = xm.sizes[1];
    const double inv_m = 1.0 / static_cast<double>(xm.numel() / C);
    like_ = &xm;

    const ir::ValueId gy = map_.at(dy);
    const ir::ValueId mean = view(n, map_.at(n.args[5].values[0]), kshape);
    const ir::ValueId invstd = view(n, map_.at(n.args[6].values[0]), kshape);
    const ir::ValueId xc = binary(n, "aten::sub", map_.at(x), mean, xm.sizes);
    const ir::ValueId sdy = sum(n, gy, R, true, dense_meta(xm.dtype, kshape, xm.device));
    const ir::ValueId dot = sum(n, binary(n, "aten::mul", gy, xc, xm.sizes), R, true, dense_meta(xm.dtype, kshape, xm.device));
    // Every per-channel value starts from a sum of the kernel (an op reading only values
    // from outside, such as invstd * w, would be a kernel of its own).
    if (wants(0)) {
      const ir::ValueId k1 = mul_scalar(n, sdy, inv_m, kshape);
      const ir::ValueId k2 =
          binary(n, "aten::mul", binary(n, "aten::mul", mul_scalar(n, dot, inv_m, kshape), invstd, kshape), invstd, kshape);
      const ir::ValueId t = binary(n, "aten::sub", binary(n, "aten::sub", gy, k1, xm.sizes),
                                   binary(n, "aten::mul", xc, k2, xm.sizes), xm.sizes);
      ir::ValueId gi = binary(n, "aten::mul", t, invstd, xm.sizes);
      if (has_weight) gi = binary(n, "aten::mul", gi, view(n, map_.at(n.args[2].values[0]), kshape), xm.sizes);
      result(n, 0, gi);
    }
    if (wants(1)) result(n, 1, view(n, binary(n, "aten::mul", dot, invstd, kshape), {C}));
    if (wants(2)) result(n, 2, view(n, sdy, {C}));
    like_ = nullptr;
    *what = "decomposed for a per-channel reduction kernel";
    return true;
  }

  // y * w + b, with the per-channel weight and bias (either may be absent) viewed `kshape`.
  ir::ValueId affine(const ir::Node& n, ir::ValueId y, ir::ValueId w, ir::ValueId b, const std::vector<int64_t>& kshape) {
    const auto sizes = out_.value(y).meta.sizes;
    if (w != ir::kNoValue) y = binary(n, "aten::mul", y, view(n, map_.at(w), kshape), sizes);
    if (b != ir::kNoValue) y = binary(n, "aten::add", y, view(n, map_.at(b), kshape), sizes);
    return y;
  }

  // Pending running-statistics writes: copy_ into the buffer once the graph reaches a node
  // that could see the difference (Note [Batch norm as kernels]).
  struct PendingCopy {
    const ir::Node* from;
    ir::ValueId buffer;   // in g_
    ir::ValueId updated;  // in out_
  };

  bool must_flush_before(const ir::Node& n) const {
    if (n.kind != ir::NodeKind::Call) return true;  // the output, hook calls, inputs after nodes
    if (is_mutation(g_, n) || !ir::hidden_writes(n).empty()) return true;
    // A batch norm backward in training takes the running statistics as arguments but
    // does not read them (it reads save_mean and save_invstd).
    const bool train_backward = is_batch_norm_backward(n) && n.args.size() == 10 &&
                                n.args[7].kind == ir::ArgKind::Bool && n.args[7].i != 0;
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (train_backward && (i == 3 || i == 4)) continue;
      if (!n.args[i].refers_to_values()) continue;
      for (ir::ValueId v : n.args[i].values) {
        if (v == ir::kNoValue) continue;
        const ir::ValueId root = g_.alias_root(v);
        for (const auto& p : pending_) {
          if (g_.alias_root(p.buffer) == root) return true;
        }
      }
    }
    return false;
  }

  void flush() {
    for (const auto& p : pending_) {
      const ir::TensorMeta& bm = g_.value(p.buffer).meta;
      const ir::ValueId target = map_.at(p.buffer);
      const ir::ValueId v = call(*p.from, "aten::copy_", "",
                                 {ir::Arg::value(target, "self"), ir::Arg::value(p.updated, "src"),
                                  ir::Arg::boolean(false, "non_blocking")},
                                 bm.sizes, &bm);
      out_.value(v).version_of = target;
    }
    pending_.clear();
  }

  ir::ValueId mul_scalar(const ir::Node& from, ir::ValueId a, double s, c10::ArrayRef<int64_t> sizes) {
    return call(from, "aten::mul", "Scalar", {ir::Arg::value(a, "self"), ir::Arg::real(s, "other")}, sizes);
  }
  // A view of v (dense) with other sizes.
  ir::ValueId view(const ir::Node& from, ir::ValueId v, std::vector<int64_t> sizes) {
    ir::Arg s;
    s.kind = ir::ArgKind::IntList;
    s.name = "size";
    s.ints = sizes;
    ir::TensorMeta m = out_.value(v).meta;
    const auto st = c10::contiguous_strides(sizes);
    m.sizes.assign(sizes.begin(), sizes.end());
    m.strides.assign(st.begin(), st.end());
    const ir::ValueId r = call(from, "aten::view", "", {ir::Arg::value(v, "self"), s}, sizes, &m);
    out_.value(r).view_of = v;
    return r;
  }

  // Arguments: grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask.
  bool split_layer_norm_backward(const ir::Node& n, std::string* what) {
    if (n.args.size() != 8 || n.outputs.size() != 3 || n.args[7].kind != ir::ArgKind::BoolList ||
        n.args[7].ints.size() != 3 || n.args[2].kind != ir::ArgKind::IntList) {
      return keep(n, what, "unexpected arguments");
    }
    for (int i : {0, 1, 3, 4}) {
      if (n.args[static_cast<size_t>(i)].kind != ir::ArgKind::Value) return keep(n, what, "an undefined tensor argument");
    }
    const bool has_weight = n.args[5].kind == ir::ArgKind::Value;
    if (!has_weight && n.args[5].kind != ir::ArgKind::None && n.args[5].kind != ir::ArgKind::UndefinedTensor) {
      return keep(n, what, "unexpected weight argument");
    }
    auto wants = [&](size_t k) { return n.args[7].ints[k] != 0 && n.outputs[k].kind == ir::ArgKind::Value; };
    if (!wants(0)) return keep(n, what, "no grad_input is computed");
    bool same_device = true;
    ir::for_each_value(n.args, [&](ir::ValueId v) { same_device = same_device && g_.value(v).meta.device == device_; });
    if (!same_device) return keep(n, what, "a tensor is not on " + device_.str());

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
      map_[n.outputs[1].values[0]] = sum(n, prod, outer, false, g_.value(n.outputs[1].values[0]).meta);
    }
    if (wants(2)) map_[n.outputs[2].values[0]] = sum(n, map_.at(go), outer, false, g_.value(n.outputs[2].values[0]).meta);
    *what = "grad_input as a row op" + std::string(rest ? ", weight/bias gradients as column sums" : "");
    return true;
  }

  // A new Call node in the output graph, attributed to the node it comes from (of `like_`'s
  // dtype and device, or of the node's second argument's, unless `meta` is given).
  ir::ValueId call(const ir::Node& from, const char* op, const char* overload, std::vector<ir::Arg> args,
                   c10::ArrayRef<int64_t> sizes, const ir::TensorMeta* meta = nullptr) {
    ir::TensorMeta made;
    if (!meta) {
      const ir::TensorMeta& xm = like_ ? *like_ : g_.value(from.args[1].values.at(0)).meta;
      made = dense_meta(xm.dtype, sizes, xm.device);
    }
    return out_.add_call(op, overload, std::move(args), meta ? *meta : made, &from);
  }

  ir::ValueId sum(const ir::Node& from, ir::ValueId v, const std::vector<int64_t>& dims, bool keepdim,
                  const ir::TensorMeta& meta) {
    ir::Arg d;
    d.kind = ir::ArgKind::IntList;
    d.name = "dim";
    d.ints = dims;
    ir::Arg dtype = ir::Arg::none("dtype");
    return call(from, "aten::sum", "dim_IntList", {ir::Arg::value(v, "self"), d, ir::Arg::boolean(keepdim, "keepdim"), dtype},
                meta.sizes, &meta);
  }

  Decomposed* decisions_ = nullptr;
  const ir::TensorMeta* like_ = nullptr;  // dtype and device of the nodes a decomposition makes
  std::vector<PendingCopy> pending_;
};

}  // namespace

Decomposed decompose_for_fusion(const ir::Graph& g, const c10::Device& device) {
  // The rewrites in order, each on the previous one's graph (`g` until one rewrites);
  // decisions and counts add up. A pass that rewrites nothing hands back no graph.
  Decomposed all;
  auto current = [&]() -> const ir::Graph& { return all.count > 0 ? all.graph : g; };
  auto add = [&](Decomposed d) {
    all.decisions.insert(all.decisions.end(), d.decisions.begin(), d.decisions.end());
    if (d.count > 0) all.graph = std::move(d.graph);
    all.count += d.count;
  };
  for (auto pass : {&functionalize_updates, &decompose_losses, &decompose_norms}) add(pass(current(), device));
  add(Decomposer(current(), device).run());
  // Last: the decompositions above may leave reshapes before pointwise ops.
  add(sink_reshapes(current()));
  return all;
}

}  // namespace tcap::fuse
