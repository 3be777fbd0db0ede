#include "fuse/decompose_losses.h"

#include "fuse/rewriter.h"

#include "ir/op_facts.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <set>
#include <unordered_map>

namespace tcap::fuse {

// Note [Cross-entropy at the bandwidth floor]
// cross_entropy(x, t) is log_softmax then nll_loss. As ATen calls, the forward writes the
// [N, C] log-probabilities (which the backward reads), and the backward writes an [N, C]
// gradient of nll_loss that is zero but for one element per row, then reads it again: four
// passes over N * C elements where reading x once (forward) and reading x and writing its
// gradient (backward) would do. Rewritten, before the partitioner (tcap::compile's joint
// graph) and before fusion (step and compiled-autograd graphs):
//
//   m = amax(x, 1, keepdim); sh = x - m; ls = log(sum(exp(sh), 1, keepdim))   one row kernel
//   logp = sh - ls                                  pointwise: recomputed where it is read
//   valid = t != ignore_index; i = where(valid, t, 0)
//   picked = gather(x, 1, i[:, None]) - m - ls      N elements (gather checks the targets'
//                                                    bounds, as nll_loss does)
//   loss = sum(where(valid, -picked, 0)) / sum(valid)          (reduction mean; sum: no /)
//
//   grad_nll = where(arange(C) == t[:, None] & valid[:, None], -grad / total_weight, 0)
//
// The gradient of nll_loss is then a pointwise expression of t, fused into
// _log_softmax_backward_data's row kernel, and logp is x - m - ls recomputed from x and the
// two per-row numbers the partitioner saves (m and ls: 2 * N elements, where it saved N * C):
// the forward reads x once and the backward reads x and writes its gradient. The arithmetic
// is ATen's: logp = (x - max) - log(sum(exp(x - max))) as its CPU kernel computes it, and
// the gradient of nll_loss holds exactly -grad / total_weight, as ATen writes it (no
// product with 0 or 1, so an inf or NaN gradient stays where ATen puts it).
// Kept as ATen calls, and said why in the fusion decisions: class weights, a class dim other
// than 1 or an input other than 2-D (nll_loss2d's images), dtypes other than float32 and
// float64, non-dense tensors, and a log_softmax whose result is read by anything but
// nll_loss and its backward (it is then written anyway).
// An out-of-range target: the forward's gather raises, as nll_loss_forward does, with
// ATen's gather message; the backward trusts the targets its forward checked.

namespace {

class LossRewriter : public Rewriter {
 public:
  using Rewriter::Rewriter;

 private:
  // Why the [N, C] tensor v cannot be read by these kernels, or "".
  std::string refusal(ir::ValueId v) const {
    const auto& m = g_.value(v).meta;
    if (m.sizes.size() != 2) return "a " + std::to_string(m.sizes.size()) + "-d input (only [N, C] is rewritten)";
    if (m.dtype != c10::kFloat && m.dtype != c10::kDouble) return std::string(c10::toString(m.dtype)) + " input";
    if (m.device != device_) return "the input is not on " + device_.str();
    if (!m.is_contiguous()) return "the input is not dense and row-major";
    return "";
  }
  std::string target_refusal(const ir::Node& n, size_t i) const {
    const ir::Arg& a = n.args.at(i);
    if (a.kind != ir::ArgKind::Value) return "no target tensor";
    const auto& m = g_.value(a.values[0]).meta;
    if (m.dtype != c10::kLong || m.sizes.size() != 1 || !m.is_contiguous()) return "targets not a dense int64 vector";
    return "";
  }

  // Which nodes are rewritten: nll_loss_forward / _backward with constant arguments, no
  // weights and a reduction of mean or sum, and the log_softmax under a forward whose
  // result nothing else but those read.
  void plan(Decomposed* d) override {
    auto say = [&](const ir::Node& n, const std::string& why) {
      d->decisions.push_back("%" + std::to_string(n.id) + " " + n.qualified_op() + ": " + why);
    };
    for (const auto& n : g_.nodes()) {
      const bool fw = is_call(n, "aten::nll_loss_forward"), bw = is_call(n, "aten::nll_loss_backward");
      if (!fw && !bw) continue;
      const size_t self = fw ? 0 : 1, weight = fw ? 2 : 3, reduction = fw ? 3 : 4, ignore = fw ? 4 : 5;
      std::string why;
      if (n.args.size() != (fw ? 5u : 7u) || n.args[self].kind != ir::ArgKind::Value) why = "unexpected arguments";
      else if (ir::reads_host_scalar(g_, n)) why = "a host scalar argument";
      else if (!absent(n.args[weight])) why = "class weights";
      else if (n.args[reduction].kind != ir::ArgKind::Int || (n.args[reduction].i != 1 && n.args[reduction].i != 2))
        why = "reduction none";
      else if (n.args[ignore].kind != ir::ArgKind::Int) why = "unexpected ignore_index";
      else if (why = refusal(n.args[self].values[0]); why.empty()) why = target_refusal(n, fw ? 1 : 2);
      if (why.empty() && bw) {
        for (size_t i : {size_t{0}, size_t{6}}) {
          if (n.args[i].kind != ir::ArgKind::Value || g_.value(n.args[i].values[0]).meta.numel() != 1) {
            why = "unexpected gradient or total_weight";
          }
        }
      }
      if (!why.empty()) {
        say(n, "kept as one ATen call: " + why);
        continue;
      }
      (fw ? forward_ : backward_).insert(n.id);
      if (!fw) {
        say(n, "rewritten: where(column == target, -grad / total_weight, 0), fused with its readers");
        continue;
      }
      const ir::ValueId ls = n.args[0].values[0];
      const ir::NodeId p = g_.value(ls).producer;
      const ir::Node* src = p >= 0 ? &g_.node(p) : nullptr;
      std::string lwhy;
      if (!src || !is_call(*src, "aten::_log_softmax")) lwhy = "its input is not a log_softmax";
      else if (src->args.size() != 3 || src->args[0].kind != ir::ArgKind::Value || src->args[1].kind != ir::ArgKind::Int ||
               src->args[2].kind != ir::ArgKind::Bool || src->args[2].i != 0)
        lwhy = "unexpected log_softmax arguments";
      else if (src->args[1].i != 1 && src->args[1].i != -1) lwhy = "log_softmax over another dim";
      else if (ir::reads_host_scalar(g_, *src)) lwhy = "a host scalar argument of log_softmax";
      else if (auto r = refusal(src->args[0].values[0]); !r.empty()) lwhy = r + " to log_softmax";
      for (ir::NodeId u : g_.users(ls)) {
        const ir::Node& un = g_.node(u);
        if (lwhy.empty() && !is_call(un, "aten::nll_loss_forward") && !is_call(un, "aten::nll_loss_backward") &&
            !is_call(un, "aten::_log_softmax_backward_data")) {
          lwhy = "its log_softmax is also read by " + un.qualified_op();
        }
      }
      const auto outs = g_.output_values();
      if (lwhy.empty() && std::find(outs.begin(), outs.end(), ls) != outs.end()) lwhy = "its log_softmax is a result";
      if (lwhy.empty()) {
        log_softmax_.insert(p);
        say(n, "rewritten: row maxima and log-sums of the log_softmax's input, a gather at the targets");
      } else {
        say(n, "rewritten: a gather at the targets (" + lwhy + ")");
      }
    }
  }

  ir::ValueId sub(const ir::Node& f, ir::ValueId a, ir::ValueId b, c10::ArrayRef<int64_t> sizes) {
    return binary(f, "aten::sub", a, b, sizes);
  }
  ir::ValueId row(const ir::Node& f, const char* op, ir::ValueId a) { return reduce(f, op, a, {1}, true); }
  // v [N] viewed [N, 1].
  ir::ValueId column(const ir::Node& f, ir::ValueId v) { return view(f, v, {meta(v).sizes.at(0), 1}); }
  ir::ValueId valid_mask(const ir::Node& f, ir::ValueId t, int64_t ignore) {
    return call(f, "aten::ne", "Scalar", {ir::Arg::value(t, "self"), ir::Arg::integer(ignore, "other")},
                dense_meta(c10::kBool, meta(t).sizes, meta(t).device));
  }
  // _log_softmax(x, 1, false) -> (x - m) - log(sum(exp(x - m))), keeping m and the log-sum.
  void log_softmax(const ir::Node& n) {
    const ir::ValueId x = map_.at(n.args[0].values[0]);
    const std::vector<int64_t> sizes(meta(x).sizes.begin(), meta(x).sizes.end());
    const ir::ValueId m = row(n, "aten::amax", x);
    const ir::ValueId sh = sub(n, x, m, sizes);
    const ir::ValueId ls = unary(n, "aten::log", row(n, "aten::sum", unary(n, "aten::exp", sh)));
    result(n, 0, sub(n, sh, ls, sizes));
    rows_[n.outputs[0].values[0]] = {x, m, ls};
  }

  // (self, target, weight, reduction, ignore_index) -> (output, total_weight)
  void nll_forward(const ir::Node& n) {
    const ir::ValueId self = map_.at(n.args[0].values[0]), t = map_.at(n.args[1].values[0]);
    const ir::TensorMeta sm = meta(self);  // a copy: making values moves the graph's
    const int64_t rows = sm.sizes[0];
    const ir::ValueId valid = valid_mask(n, t, n.args[4].i);
    const ir::ValueId index =
        call(n, "aten::where", "ScalarOther",
             {ir::Arg::value(valid, "condition"), ir::Arg::value(t, "self"), ir::Arg::integer(0, "other")}, meta(t));
    const ir::TensorMeta col = dense_meta(sm.dtype, {rows, 1}, sm.device);
    auto gather = [&](ir::ValueId from) {
      return call(n, "aten::gather", "",
                  {ir::Arg::value(from, "self"), ir::Arg::integer(1, "dim"), ir::Arg::value(column(n, index), "index"),
                   ir::Arg::boolean(false, "sparse_grad")},
                  col);
    };
    ir::ValueId picked;
    auto r = rows_.find(n.args[0].values[0]);
    if (r != rows_.end()) {
      const auto& [x, m, ls] = r->second;
      picked = sub(n, sub(n, gather(x), m, {rows, 1}), ls, {rows, 1});
    } else {
      picked = gather(self);
    }
    const ir::ValueId losses =
        call(n, "aten::where", "ScalarOther",
             {ir::Arg::value(column(n, valid), "condition"), ir::Arg::value(unary(n, "aten::neg", picked), "self"),
              ir::Arg::real(0.0, "other")},
             col);
    const ir::TensorMeta scalar = dense_meta(sm.dtype, {}, sm.device);
    const ir::ValueId total = call(n, "aten::sum", "", {ir::Arg::value(losses, "self"), ir::Arg::none("dtype")}, scalar);
    const ir::ValueId weight =
        call(n, "aten::sum", "", {ir::Arg::value(valid, "self"), scalar_type_arg(sm.dtype, "dtype")}, scalar);
    const bool mean = n.args[3].i == 1;
    result(n, 0,
           mean ? call(n, "aten::div", "Tensor", {ir::Arg::value(total, "self"), ir::Arg::value(weight, "other")}, scalar)
                : total);
    result(n, 1, weight);
  }

  // (grad_output, self, target, weight, reduction, ignore_index, total_weight) -> grad_self
  void nll_backward(const ir::Node& n) {
    const ir::ValueId g = map_.at(n.args[0].values[0]), self = map_.at(n.args[1].values[0]),
                      t = map_.at(n.args[2].values[0]), w = map_.at(n.args[6].values[0]);
    const ir::TensorMeta sm = meta(self);  // a copy: making values moves the graph's
    const int64_t rows = sm.sizes[0], classes = sm.sizes[1];
    const ir::TensorMeta scalar = dense_meta(meta(g).dtype, {}, sm.device);
    ir::ValueId coef = unary(n, "aten::neg", g);
    if (n.args[4].i == 1) {
      coef = call(n, "aten::div", "Tensor", {ir::Arg::value(coef, "self"), ir::Arg::value(w, "other")}, scalar);
    }
    const ir::ValueId iota =
        call(n, "aten::arange", "",
             {ir::Arg::integer(classes, "end"), scalar_type_arg(c10::kLong, "dtype"), ir::Arg::none("layout"),
              device_arg(sm.device, "device"), ir::Arg::none("pin_memory")},
             dense_meta(c10::kLong, {classes}, sm.device));
    const ir::TensorMeta hits = dense_meta(c10::kBool, {rows, classes}, sm.device);
    const ir::ValueId at_target =
        call(n, "aten::eq", "Tensor", {ir::Arg::value(iota, "self"), ir::Arg::value(column(n, t), "other")}, hits);
    const ir::ValueId hit = call(n, "aten::logical_and", "",
                                 {ir::Arg::value(at_target, "self"), ir::Arg::value(column(n, valid_mask(n, t, n.args[5].i)), "other")},
                                 hits);
    result(n, 0,
           call(n, "aten::where", "ScalarOther",
                {ir::Arg::value(hit, "condition"), ir::Arg::value(coef, "self"), ir::Arg::real(0.0, "other")},
                dense_meta(sm.dtype, {rows, classes}, sm.device)));
  }

  struct Rows {
    ir::ValueId x, m, ls;  // in out_
  };
  bool selected(const ir::Node& n) const override {
    return forward_.count(n.id) || backward_.count(n.id) || log_softmax_.count(n.id);
  }
  bool rewrite(const ir::Node& n) override {
    if (log_softmax_.count(n.id)) {
      log_softmax(n);
      return false;  // counted with its nll_loss_forward
    }
    if (forward_.count(n.id)) nll_forward(n);
    else nll_backward(n);
    return true;
  }

  std::set<ir::NodeId> forward_, backward_, log_softmax_;
  std::unordered_map<ir::ValueId, Rows> rows_;  // log_softmax result (in g_) -> its row numbers
};

}  // namespace

Decomposed decompose_losses(const ir::Graph& g, const c10::Device& device) { return LossRewriter(g, device).run(); }

}  // namespace tcap::fuse
