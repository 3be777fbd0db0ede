#include "fuse/onednn_gemms.h"

#include "fuse/rewriter.h"

#include <set>

namespace tcap::fuse {
namespace {

class GemmRewriter : public Rewriter {
 public:
  GemmRewriter(const ir::Graph& g, const GemmChooser& choose) : Rewriter(g, c10::Device(c10::kCPU)), choose_(choose) {}

 private:
  static bool one(const ir::Arg& a) {
    return (a.kind == ir::ArgKind::Int && a.i == 1) || (a.kind == ir::ArgKind::Double && a.d == 1.0);
  }

  // Why node n stays ATen's (before measuring), or "".
  std::string refusal(const ir::Node& n, bool addmm) const {
    const size_t a = addmm ? 1 : 0;
    if (n.args.size() != (addmm ? 5u : 2u) || n.outputs.size() != 1) return "unexpected arguments";
    if (ir::reads_host_scalar(g_, n)) return "a host scalar argument";
    if (!n.args[a].is_value() || !n.args[a + 1].is_value()) return "unexpected arguments";
    if (addmm && (!n.args[0].is_value() || !one(n.args[3]) || !one(n.args[4]))) return "beta or alpha is not 1";
    const auto& am = g_.value(n.args[a].values[0]).meta;
    const auto& bm = g_.value(n.args[a + 1].values[0]).meta;
    const auto& om = g_.value(n.outputs[0].values[0]).meta;
    for (const auto* m : {&am, &bm, &om}) {
      if (m->dtype != c10::kFloat) return "not float32";
      if (!m->device.is_cpu()) return "not on the CPU";
      if (m->sizes.size() != 2) return "not two-dimensional";
    }
    if (!om.is_contiguous()) return "its result is not row-major";
    if (addmm) {
      const auto& bias = g_.value(n.args[0].values[0]).meta;
      if (bias.dtype != c10::kFloat || bias.sizes.size() != 1 || bias.sizes[0] != bm.sizes[1] || !bias.is_contiguous()) {
        return "its self is not one row of bias";
      }
    }
    if (am.sizes[0] * am.sizes[1] * bm.sizes[1] < kMinOneDnnMacs) return "too small";
    return "";
  }

  void plan(Decomposed* d) override {
    for (const auto& n : g_.nodes()) {
      const bool mm = is_call(n, "aten::mm"), addmm = is_call(n, "aten::addmm");
      if (!mm && !addmm) continue;
      std::string why = refusal(n, addmm);
      bool chosen = false;
      if (why.empty()) {
        const size_t a = addmm ? 1 : 0;
        const auto& am = g_.value(n.args[a].values[0]).meta;
        const auto& bm = g_.value(n.args[a + 1].values[0]).meta;
        chosen = choose_(am.sizes[0], am.sizes[1], bm.sizes[1], std::vector<int64_t>(am.strides.begin(), am.strides.end()),
                         std::vector<int64_t>(bm.strides.begin(), bm.strides.end()), addmm, &why);
      }
      if (chosen) chosen_.insert(n.id);
      d->decisions.push_back("node %" + std::to_string(n.id) + " (" + n.qualified_op() + ") " +
                             (chosen ? "runs as tcap::onednn_mm: " : "stays ATen's: ") + why);
    }
  }

  bool selected(const ir::Node& n) const override { return chosen_.count(n.id) > 0; }

  bool rewrite(const ir::Node& n) override {
    const bool addmm = n.op == "aten::addmm";
    const size_t a = addmm ? 1 : 0;
    const ir::ValueId out = n.outputs[0].values[0];
    std::vector<ir::Arg> args{ir::Arg::value(map_.at(n.args[a].values[0]), "self"),
                              ir::Arg::value(map_.at(n.args[a + 1].values[0]), "mat2"),
                              addmm ? ir::Arg::value(map_.at(n.args[0].values[0]), "bias") : ir::Arg::none("bias")};
    result(n, 0, call(n, "tcap::onednn_mm", "", std::move(args), g_.value(out).meta));
    return true;
  }

  const GemmChooser& choose_;
  std::set<ir::NodeId> chosen_;
};

}  // namespace

Decomposed gemms_through_onednn(const ir::Graph& g, const GemmChooser& choose) { return GemmRewriter(g, choose).run(); }

}  // namespace tcap::fuse
