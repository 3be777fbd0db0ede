#include "fuse/group_kernel.h"

#include "fuse/emitter.h"
#include "fuse/lowering.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <utility>

namespace tcap::fuse {

namespace {

// Merges adjacent domain dims that every access walks as one (d's stride = size(d+1) *
// stride(d+1) everywhere) and drops size-1 dims, so contiguous tensors become one loop.
void coalesce(kir::Kernel& k) {
  std::vector<std::vector<int64_t>*> accesses;
  for (auto& in : k.instrs) {
    if (in.op == kir::OpCode::Load) accesses.push_back(&in.strides);
  }
  for (auto& s : k.stores) accesses.push_back(&s.strides);
  // Drop size-1 dims (keep at least one dim of each class present).
  auto drop = [&](size_t d) {
    k.sizes.erase(k.sizes.begin() + static_cast<long>(d));
    for (auto* a : accesses) a->erase(a->begin() + static_cast<long>(d));
  };
  const size_t outer = k.sizes.size() - static_cast<size_t>(k.num_reduce_dims);
  size_t n_outer = outer, n_red = static_cast<size_t>(k.num_reduce_dims);
  for (size_t d = k.sizes.size(); d-- > 0;) {
    const bool red = d >= n_outer;
    if (k.sizes[d] != 1) continue;
    if (red && n_red == 1) continue;
    drop(d);
    if (red) --n_red; else --n_outer;
  }
  k.num_reduce_dims = static_cast<int>(n_red);
  for (size_t d = 0; d + 1 < k.sizes.size();) {
    const bool same_class = (d + 1 < n_outer) || (d >= n_outer);
    bool ok = same_class;
    for (auto* a : accesses) ok = ok && (*a)[d] == (*a)[d + 1] * k.sizes[d + 1];
    if (!ok) {
      ++d;
      continue;
    }
    k.sizes[d + 1] *= k.sizes[d];
    k.sizes.erase(k.sizes.begin() + static_cast<long>(d));
    for (auto* a : accesses) a->erase(a->begin() + static_cast<long>(d));
    if (d < n_outer) --n_outer; else --n_red;
  }
  k.num_reduce_dims = static_cast<int>(n_red);
}

}  // namespace

kir::Kernel lower_group(const ir::Graph& g, const Grouping& grouping, const Group& gr, const FusedGroup& fg) {
  kir::Kernel k;
  k.name = fg.name;
  const size_t rank = gr.S.size();
  std::vector<size_t> perm;  // domain dim -> S dim
  for (size_t d = 0; d < rank; ++d) {
    if (!std::binary_search(gr.R.begin(), gr.R.end(), static_cast<int64_t>(d))) perm.push_back(d);
  }
  for (int64_t d : gr.R) perm.push_back(static_cast<size_t>(d));
  for (size_t j : perm) k.sizes.push_back(gr.S[j]);
  k.num_reduce_dims = static_cast<int>(gr.R.size());
  auto to_domain = [&](const std::vector<int64_t>& s_strides) {
    std::vector<int64_t> out;
    for (size_t j : perm) out.push_back(s_strides[j]);
    return out;
  };
  // Strides over S of an outside value read by a node of the given space / output shape.
  auto load_strides = [&](const ir::TensorMeta& m, Space space, const std::vector<int64_t>& node_out) {
    std::vector<int64_t> st(rank, 0);
    if (space == Space::Full) {
      std::vector<int> src;
      TORCH_CHECK(broadcast_src(m.sizes, gr.S, &src), "input ", shape_str(m.sizes), " does not broadcast to ",
                  shape_str(gr.S));
      for (size_t d = 0; d < rank; ++d) st[d] = src[d] < 0 ? 0 : m.strides[static_cast<size_t>(src[d])];
      return st;
    }
    // Outer node: broadcast onto the node's output shape, then place its dims.
    std::vector<int> src;
    TORCH_CHECK(broadcast_src(m.sizes, node_out, &src), "input ", shape_str(m.sizes), " does not broadcast to ",
                shape_str(node_out));
    std::vector<int> osrc;
    TORCH_CHECK(outer_src(node_out, gr, &osrc), "bad outer shape");
    for (size_t d = 0; d < rank; ++d) {
      if (osrc[d] < 0) continue;
      const int s = src[static_cast<size_t>(osrc[d])];
      st[d] = s < 0 ? 0 : m.strides[static_cast<size_t>(s)];
    }
    return st;
  };
  std::map<ir::ValueId, int32_t> buffer_of;
  for (ir::ValueId v : fg.inputs) {
    buffer_of[v] = static_cast<int32_t>(k.buffers.size());
    // A host scalar is a parameter (Note [Kernel parameters]); its 0-dim meta gives its
    // Loads all-zero strides.
    k.buffers.push_back({"%" + std::to_string(v), *to_kir(g.value(v).meta.dtype), false, ir::is_host_scalar(g, v)});
  }
  std::map<ir::ValueId, Val> val_of;
  std::map<std::pair<ir::ValueId, std::vector<int64_t>>, Val> loads;
  Space cur_space = Space::Full;
  std::vector<int64_t> cur_out;
  // One Load per outside value and access pattern (over the domain). A view the group
  // took in is read from its base's buffer through its own strides (Note [Views read
  // through their base]: same first element).
  auto buffer_for = [&](ir::ValueId v) {
    // (A view another group wrote is this group's input like any value.)
    while (!buffer_of.count(v)) v = grouping.view_source.at(v);
    return buffer_of.at(v);
  };
  auto load = [&](ir::ValueId v, std::vector<int64_t> strides) -> Val {
    const auto& m = g.value(v).meta;
    auto key = std::make_pair(v, strides);
    auto lit = loads.find(key);
    if (lit != loads.end()) return lit->second;
    kir::Instr in;
    in.op = kir::OpCode::Load;
    in.dtype = *to_kir(m.dtype);
    in.buffer = buffer_for(v);
    in.strides = std::move(strides);
    Val r{kir::add(k, std::move(in)), *to_kir(m.dtype)};
    loads[key] = r;
    return r;
  };
  auto resolve = [&](ir::ValueId v) -> Val {
    auto it = val_of.find(v);
    if (it != val_of.end()) return it->second;
    return load(v, to_domain(load_strides(g.value(v).meta, cur_space, cur_out)));
  };
  // A Contraction operand: an outside value read along the dims `src` names (a dim of
  // size 1 is read with stride 0 like a broadcast one).
  auto resolve_mapped = [&](ir::ValueId v, const std::vector<int>& src) -> Val {
    TORCH_INTERNAL_ASSERT(!val_of.count(v) && src.size() == rank, "tcap fusion: a matmul operand inside its kernel");
    const auto& m = g.value(v).meta;
    std::vector<int64_t> st(rank, 0);
    for (size_t d = 0; d < rank; ++d) {
      if (src[d] < 0) continue;
      const auto s = static_cast<size_t>(src[d]);
      TORCH_INTERNAL_ASSERT(s < m.sizes.size() && (m.sizes[s] == gr.S[d] || m.sizes[s] == 1),
                            "tcap fusion: matmul operand ", shape_str(m.sizes), " against ", shape_str(gr.S));
      st[d] = m.sizes[s] == 1 ? 0 : m.strides[s];
    }
    return load(v, to_domain(st));
  };
  Emitter em(g, k, resolve, resolve_mapped);
  for (ir::NodeId id : gr.nodes) {
    if (grouping.view_nodes.count(id)) continue;  // read or written through strides
    const ir::Node& n = g.node(id);
    // Reductions and Row ops read their tensors in the full space.
    cur_space = grouping.node_class.at(id) == OpClass::Pointwise ? grouping.node_space.at(id) : Space::Full;
    cur_out = out_sizes(g, n);
    auto vals = lower(em, n);
    size_t i = 0;
    for (const auto& o : n.outputs) {
      if (o.kind != ir::ArgKind::Value) continue;
      TORCH_INTERNAL_ASSERT(i < vals.size(), "lowering of ", n.qualified_op(), " returned too few values");
      val_of[o.values[0]] = vals[i++];
    }
  }
  for (size_t oi = 0; oi < fg.outputs.size(); ++oi) {
    ir::ValueId v = fg.outputs[oi];
    ir::TensorMeta m = fg.output_metas[oi];
    if (grouping.view_source.count(v)) {
      // A view of a result (through views): the result's elements, where the result's
      // strides put them (all dense, same size: the view's tensor is the same bytes).
      while (!val_of.count(v)) v = grouping.view_source.at(v);
      m.sizes = g.value(v).meta.sizes;
      m.strides = g.value(v).meta.strides;
    }
    const int32_t b = static_cast<int32_t>(k.buffers.size());
    const kir::DType dt = *to_kir(m.dtype);
    k.buffers.push_back({"%" + std::to_string(v), dt, true});
    std::vector<int64_t> st(rank, 0);
    if (grouping.space_of_value[static_cast<size_t>(v)] == Space::Full) {
      for (size_t d = 0; d < rank; ++d) st[d] = m.sizes[d] == 1 ? 0 : m.strides[d];
    } else {
      std::vector<int> src;
      TORCH_CHECK(outer_src(m.sizes, gr, &src), "bad outer output shape");
      for (size_t d = 0; d < rank; ++d) st[d] = src[d] < 0 ? 0 : m.strides[static_cast<size_t>(src[d])];
    }
    kir::Store s;
    s.value = em.cast(val_of.at(v), dt).id;
    s.buffer = b;
    s.strides = to_domain(st);
    k.stores.push_back(std::move(s));
  }
  coalesce(k);
  kir::verify(k);
  return k;
}

}  // namespace tcap::fuse
