#include "fuse/decompose_norms.h"

#include "fuse/rewriter.h"

#include "ir/op_facts.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <set>

namespace tcap::fuse {

// Note [Group norm as kernels]
// native_group_norm and its backward are ATen calls of their own, so the ops around them
// (the SiLU after a GroupNorm in a U-Net block, the residual add) cannot join them. Viewed
// as [N, G, D, HxW] (D = C / G channels per group), a group norm is a reduction over dims
// 2 and 3 and pointwise ops, with the per-channel weight and bias viewed [1, G, D, 1]:
//
//   forward   x4 = view(x, [N, G, D, HxW]); mean = mean(x4, [2, 3], keepdim)
//             xc = x4 - mean; rstd = rsqrt(mean(xc * xc, [2, 3], keepdim) + eps)
//             out = view(xc * rstd * w + b, x.sizes); mean, rstd viewed [N, G]
//   backward  xhat = (x4 - mean) * rstd; dyw = dy4 * w
//             dx = (dyw - mean(dyw, [2, 3]) - xhat * mean(dyw * xhat, [2, 3])) * rstd
//             dw = sum(dy4 * xhat, [0, 3]); db = sum(dy4, [0, 3])   (viewed [C])
//
// One row kernel per direction (the two sums of dx in one pass), and one column kernel for
// dw and db (Note [Sibling reductions]). ATen computes the same quantities (its backward
// with dx = c1 * dy + c2 * x + c3, the same terms expanded); the kernels sum in the
// tensors' dtype (float32 or float64 only), a relative difference of about 1e-6 in
// float32. Kept as ATen calls, and said why: other dtypes (ATen accumulates bf16 and f16
// in float), non-dense tensors, a weight or bias of another dtype or device, host-scalar
// arguments.

namespace {

class NormRewriter : public Rewriter {
 public:
  using Rewriter::Rewriter;

 private:
  static bool is_forward(const ir::Node& n) { return is_call(n, "aten::native_group_norm"); }
  static bool is_backward(const ir::Node& n) { return is_call(n, "aten::native_group_norm_backward"); }

  std::string refusal(const ir::Node& n, ir::ValueId x) const {
    if (ir::reads_host_scalar(g_, n)) return "a host scalar argument";
    return dense_float_refusal(g_, n, x, device_);
  }

  // The [N, C, HxW, group] arguments at `first`, checked against x's sizes.
  bool shape(const ir::Node& n, size_t first, ir::ValueId x, int64_t* N, int64_t* C, int64_t* HW, int64_t* G) const {
    for (size_t i = first; i < first + 4; ++i) {
      if (n.args.at(i).kind != ir::ArgKind::Int) return false;
    }
    *N = n.args[first].i, *C = n.args[first + 1].i, *HW = n.args[first + 2].i, *G = n.args[first + 3].i;
    const auto& s = g_.value(x).meta.sizes;
    return s.size() >= 2 && s[0] == *N && s[1] == *C && *G > 0 && *C % *G == 0 && *N * *C * *HW == g_.value(x).meta.numel();
  }

  void plan(Decomposed* d) override {
    for (const auto& n : g_.nodes()) {
      const bool fw = is_forward(n), bw = is_backward(n);
      if (!fw && !bw) continue;
      std::string why;
      int64_t N = 0, C = 0, HW = 0, G = 0;
      const size_t x = fw ? 0 : 1;
      if (n.args.size() != (fw ? 8u : 10u) || n.args[x].kind != ir::ArgKind::Value || n.outputs.size() != 3) {
        why = "unexpected arguments";
      } else if (!shape(n, fw ? 3 : 5, n.args[x].values[0], &N, &C, &HW, &G)) {
        why = "unexpected sizes";
      } else if (fw && n.args[7].kind != ir::ArgKind::Double) {
        why = "unexpected eps";
      } else if (bw && (n.args[0].kind != ir::ArgKind::Value || n.args[2].kind != ir::ArgKind::Value ||
                        n.args[3].kind != ir::ArgKind::Value || n.args[9].kind != ir::ArgKind::BoolList)) {
        why = "unexpected arguments";
      } else {
        why = refusal(n, n.args[x].values[0]);
      }
      if (why.empty() && bw && !absent(n.args[4]) && n.args[4].kind != ir::ArgKind::Value) why = "unexpected weight";
      if (why.empty() && fw && (!absent(n.args[1]) && n.args[1].kind != ir::ArgKind::Value)) why = "unexpected weight";
      if (why.empty() && fw && (!absent(n.args[2]) && n.args[2].kind != ir::ArgKind::Value)) why = "unexpected bias";
      if (!why.empty()) {
        d->decisions.push_back("%" + std::to_string(n.id) + " " + n.qualified_op() + ": kept as one ATen call: " + why);
        continue;
      }
      selected_.insert(n.id);
      d->decisions.push_back("%" + std::to_string(n.id) + " " + n.qualified_op() +
                             (fw ? ": decomposed for a row kernel over each group" :
                                   ": decomposed for a row kernel (input gradient) and a column kernel (weight, bias)"));
    }
  }
  bool selected(const ir::Node& n) const override { return selected_.count(n.id) > 0; }
  bool rewrite(const ir::Node& n) override {
    if (is_forward(n)) forward(n);
    else backward(n);
    return true;
  }

  std::vector<int64_t> sizes_of(ir::ValueId v) const {
    const auto& s = meta(v).sizes;
    return std::vector<int64_t>(s.begin(), s.end());
  }
  ir::ValueId mul(const ir::Node& n, ir::ValueId a, ir::ValueId b) { return binary(n, "aten::mul", a, b, broadcast(a, b)); }
  ir::ValueId sub(const ir::Node& n, ir::ValueId a, ir::ValueId b) { return binary(n, "aten::sub", a, b, broadcast(a, b)); }
  std::vector<int64_t> broadcast(ir::ValueId a, ir::ValueId b) const {
    std::vector<int64_t> s = sizes_of(a);
    const auto t = sizes_of(b);
    for (size_t d = 0; d < s.size() && d < t.size(); ++d) s[d] = std::max(s[d], t[d]);
    return s;
  }

  // (input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd)
  void forward(const ir::Node& n) {
    const int64_t N = n.args[3].i, C = n.args[4].i, HW = n.args[5].i, G = n.args[6].i, D = C / G;
    const ir::ValueId x = map_.at(n.args[0].values[0]);
    const std::vector<int64_t> xs = sizes_of(x), shape{N, G, D, HW}, per_channel{1, G, D, 1};
    const ir::ValueId x4 = view(n, x, shape);
    const ir::ValueId mean = reduce(n, "aten::mean", x4, {2, 3}, true);
    const ir::ValueId xc = sub(n, x4, mean);
    const ir::ValueId var = reduce(n, "aten::mean", mul(n, xc, xc), {2, 3}, true);
    const ir::ValueId rstd = unary(n, "aten::rsqrt", add_scalar(n, var, n.args[7].d));
    ir::ValueId y = mul(n, xc, rstd);
    if (n.args[1].kind == ir::ArgKind::Value) y = mul(n, y, view(n, map_.at(n.args[1].values[0]), per_channel));
    if (n.args[2].kind == ir::ArgKind::Value) {
      y = binary(n, "aten::add", y, view(n, map_.at(n.args[2].values[0]), per_channel), shape);
    }
    result(n, 0, view(n, y, xs));
    if (n.outputs[1].kind == ir::ArgKind::Value) result(n, 1, view(n, mean, {N, G}));
    if (n.outputs[2].kind == ir::ArgKind::Value) result(n, 2, view(n, rstd, {N, G}));
  }

  // (grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask) -> (dx, dw, db)
  void backward(const ir::Node& n) {
    const int64_t N = n.args[5].i, C = n.args[6].i, HW = n.args[7].i, G = n.args[8].i, D = C / G;
    auto wants = [&](size_t k) { return n.args[9].ints.at(k) != 0 && n.outputs[k].kind == ir::ArgKind::Value; };
    const ir::ValueId x = map_.at(n.args[1].values[0]);
    const std::vector<int64_t> xs = sizes_of(x), shape{N, G, D, HW}, stat{N, G, 1, 1}, per_channel{1, G, D, 1};
    const ir::ValueId dy4 = view(n, map_.at(n.args[0].values[0]), shape);
    const ir::ValueId rstd = view(n, map_.at(n.args[3].values[0]), stat);
    const ir::ValueId xhat = mul(n, sub(n, view(n, x, shape), view(n, map_.at(n.args[2].values[0]), stat)), rstd);
    if (wants(0)) {
      const bool affine = n.args[4].kind == ir::ArgKind::Value;
      const ir::ValueId dyw = affine ? mul(n, dy4, view(n, map_.at(n.args[4].values[0]), per_channel)) : dy4;
      const ir::ValueId a = reduce(n, "aten::mean", dyw, {2, 3}, true);
      const ir::ValueId b = reduce(n, "aten::mean", mul(n, dyw, xhat), {2, 3}, true);
      result(n, 0, view(n, mul(n, sub(n, sub(n, dyw, a), mul(n, xhat, b)), rstd), xs));
    }
    if (wants(1)) result(n, 1, view(n, reduce(n, "aten::sum", mul(n, dy4, xhat), {0, 3}, false), {C}));
    if (wants(2)) result(n, 2, view(n, reduce(n, "aten::sum", dy4, {0, 3}, false), {C}));
  }

  std::set<ir::NodeId> selected_;
};

}  // namespace

Decomposed decompose_norms(const ir::Graph& g, const c10::Device& device) { return NormRewriter(g, device).run(); }

}  // namespace tcap::fuse
