#include "passes/int_patches.h"

namespace tcap::passes {

std::string find_int_patches(const ir::Graph& ga, const ir::Graph& gb,
                             const std::vector<std::pair<int64_t, int64_t>>& sizes, std::vector<IntPatch>& patches) {
  if (ga.nodes().size() != gb.nodes().size() || ga.values().size() != gb.values().size()) {
    return "the graphs at the two sizes differ in structure";
  }
  bool ambiguous = false;
  auto explain = [&](int64_t x, int64_t y, IntPatch p) {
    if (x == y) return true;
    bool found = false;
    for (size_t c = 0; c < sizes.size(); ++c) {
      const int64_t da = sizes[c].first - sizes[c].second;
      if (da == 0 || (x - y) % da != 0) continue;
      const int64_t m = (x - y) / da;
      if (m == 0) continue;
      if (found) {
        ambiguous = true;
        return false;
      }
      found = true;
      p.size = c;
      p.mul = m;
      p.add = y - m * sizes[c].second;
    }
    if (found) patches.push_back(p);
    return found;
  };
  auto fail = [&](const std::string& why) {
    return ambiguous ? why + " (it follows two of the changed sizes alike)" : why;
  };
  for (size_t i = 0; i < gb.nodes().size(); ++i) {
    const auto& na = ga.nodes()[i];
    const auto& nb = gb.nodes()[i];
    const std::string where = "node %" + std::to_string(i) + " (" + nb.qualified_op() + ")";
    if (na.kind != nb.kind || na.op != nb.op || na.overload != nb.overload || na.phase != nb.phase ||
        na.hook != nb.hook || na.args.size() != nb.args.size() || na.outputs != nb.outputs) {
      return "the graphs at the two sizes differ at " + where;
    }
    for (size_t k = 0; k < nb.args.size(); ++k) {
      const auto& x = na.args[k];
      const auto& y = nb.args[k];
      if (x.kind != y.kind) return "argument kinds differ at " + where;
      if (x.kind == ir::ArgKind::Int) {
        if (!explain(x.i, y.i, {IntPatch::Arg, static_cast<int64_t>(i), k, 0, 0, 0, 0})) {
          return fail("an integer argument of " + where + " does not follow the changed sizes");
        }
      } else if (x.kind == ir::ArgKind::IntList) {
        if (x.ints.size() != y.ints.size()) return "an int list of " + where + " changed length";
        for (size_t e = 0; e < x.ints.size(); ++e) {
          if (!explain(x.ints[e], y.ints[e], {IntPatch::ArgList, static_cast<int64_t>(i), k, e, 0, 0, 0})) {
            return fail("an int list argument of " + where + " does not follow the changed sizes");
          }
        }
      } else if (!(x == y)) {
        return "argument '" + y.name + "' of " + where + " changes with the size (" + ir::to_string(y.kind) + ")";
      }
    }
  }
  for (size_t v = 0; v < gb.values().size(); ++v) {
    const auto& ma = ga.values()[v].meta;
    const auto& mb = gb.values()[v].meta;
    if (ma.dtype != mb.dtype || ma.device != mb.device || ma.sizes.size() != mb.sizes.size() ||
        ma.strides.size() != mb.strides.size() || ga.values()[v].version_of != gb.values()[v].version_of ||
        ga.values()[v].view_of != gb.values()[v].view_of) {
      return "value %" + std::to_string(v) + " differs between the two sizes";
    }
    const auto vid = static_cast<int64_t>(v);
    for (size_t d = 0; d < mb.sizes.size(); ++d) {
      if (!explain(ma.sizes[d], mb.sizes[d], {IntPatch::Size, vid, d, 0, 0, 0, 0}) ||
          (d < mb.strides.size() && !explain(ma.strides[d], mb.strides[d], {IntPatch::Stride, vid, d, 0, 0, 0, 0}))) {
        return fail("the shape of %" + std::to_string(v) + " does not follow the changed sizes");
      }
    }
    if (!explain(ma.storage_offset, mb.storage_offset, {IntPatch::Offset, vid, 0, 0, 0, 0, 0})) {
      return fail("the storage offset of %" + std::to_string(v) + " does not follow the changed sizes");
    }
  }
  return "";
}

void apply_int_patches(ir::Graph& g, const std::vector<IntPatch>& patches, const std::vector<int64_t>& sizes) {
  for (const auto& p : patches) {
    const int64_t v = p.mul * sizes.at(p.size) + p.add;
    switch (p.kind) {
      case IntPatch::Arg: g.edit_constant(p.where, p.index, [v](ir::Arg& a) { a.i = v; }); break;
      case IntPatch::ArgList:
        g.edit_constant(p.where, p.index, [v, &p](ir::Arg& a) { a.ints.at(p.element) = v; });
        break;
      case IntPatch::Size: g.value(p.where).meta.sizes[p.index] = v; break;
      case IntPatch::Stride: g.value(p.where).meta.strides[p.index] = v; break;
      case IntPatch::Offset: g.value(p.where).meta.storage_offset = v; break;
    }
  }
}

}  // namespace tcap::passes
