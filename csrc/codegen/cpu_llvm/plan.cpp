#include "codegen/cpu_llvm/plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace tcap::codegen::cpu {

namespace {

// One dim of a coalesced group: its size and the stride of every access along it.
struct Dim {
  int64_t size = 1;
  std::vector<int64_t> strides;
};

// Coalesces dims [lo, hi) of `sizes` for the given accesses (each a full stride vector
// over the kernel's domain). Size-1 dims are dropped; an inner dim merges into the dim
// outside it when, for every access, outer_stride == inner_stride * inner_size, which
// keeps the row-major order of the points. A group with a size-0 dim becomes one size-0
// dim; an empty group becomes one size-1 dim with zero strides.
std::vector<Dim> coalesce(const std::vector<int64_t>& sizes, size_t lo, size_t hi,
                          const std::vector<const std::vector<int64_t>*>& accesses) {
  const size_t n = accesses.size();
  std::vector<Dim> out;
  for (size_t d = lo; d < hi; ++d) {
    if (sizes[d] == 0) return {Dim{0, std::vector<int64_t>(n, 0)}};
    if (sizes[d] == 1) continue;
    Dim cur{sizes[d], {}};
    for (const auto* s : accesses) cur.strides.push_back((*s)[d]);
    if (!out.empty()) {
      Dim& prev = out.back();
      bool mergeable = true;
      for (size_t a = 0; a < n && mergeable; ++a) mergeable = prev.strides[a] == cur.strides[a] * cur.size;
      if (mergeable) {
        prev.size *= cur.size;
        prev.strides = cur.strides;
        continue;
      }
    }
    out.push_back(std::move(cur));
  }
  if (out.empty()) out.push_back(Dim{1, std::vector<int64_t>(n, 0)});
  return out;
}

bool is_unit(int64_t stride) { return stride == 0 || stride == 1; }

}  // namespace

const char* to_string(LoopMode m) {
  switch (m) {
    case LoopMode::Pointwise: return "pointwise";
    case LoopMode::ReduceInner: return "reduce_inner";
    case LoopMode::ReduceOuter: return "reduce_outer";
  }
  return "?";
}

void check_supported(const kir::Kernel& k) {
  kir::verify(k);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const kir::Instr& in = k.instrs[v];
    const char* why = nullptr;
    if (in.dtype == kir::DType::Bool &&
        (in.op == kir::OpCode::Neg || in.op == kir::OpCode::Sub || in.op == kir::OpCode::Div ||
         in.op == kir::OpCode::Pow || in.op == kir::OpCode::ReduceSum)) {
      why = "arithmetic on Bool";
    } else if (in.op == kir::OpCode::Pow && !kir::is_floating(in.dtype)) {
      why = "integer pow";
    }
    TORCH_CHECK(why == nullptr, "tcap cpu_llvm: kernel ", k.name, ": %", v, " = ", kir::to_string(in.op), ".",
                kir::to_string(in.dtype), ": ", why,
                " is not supported by the CPU renderer (leave this op to ATen)\n", kir::to_string(k));
  }
}

KernelPlan make_plan(const kir::Kernel& k, const TargetInfo& t, const PlanOptions& o) {
  check_supported(k);
  KernelPlan p;
  p.elem = kir::element_level(k);
  p.level = kir::reduce_level(k);
  const size_t rank = k.sizes.size();
  const size_t nr = static_cast<size_t>(k.num_reduce_dims);

  // Coalesce the outer and the reduce dims separately (never across the boundary).
  std::vector<const std::vector<int64_t>*> accesses;
  std::vector<int32_t> load_ids;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (k.instrs[v].op == kir::OpCode::Load) {
      accesses.push_back(&k.instrs[v].strides);
      load_ids.push_back(static_cast<int32_t>(v));
    }
  }
  for (const kir::Store& s : k.stores) accesses.push_back(&s.strides);
  std::vector<Dim> dims = coalesce(k.sizes, 0, rank - nr, accesses);
  p.num_outer = static_cast<int>(dims.size());
  if (nr > 0) {
    std::vector<Dim> red = coalesce(k.sizes, rank - nr, rank, accesses);
    dims.insert(dims.end(), red.begin(), red.end());
  }
  for (const Dim& d : dims) p.sizes.push_back(d.size);
  auto access = [&](size_t a, int64_t offset) {
    Access acc{offset, {}};
    for (const Dim& d : dims) acc.strides.push_back(d.strides[a]);
    return acc;
  };
  p.loads.resize(k.instrs.size());
  for (size_t a = 0; a < load_ids.size(); ++a) {
    p.loads[static_cast<size_t>(load_ids[a])] = access(a, k.instrs[static_cast<size_t>(load_ids[a])].offset);
  }
  for (size_t s = 0; s < k.stores.size(); ++s) p.stores.push_back(access(load_ids.size() + s, k.stores[s].offset));

  // Passes (reductions only): pass q computes the Reduces whose operand has level q and
  // the element-level Stores of level-q values.
  for (const kir::Instr& in : k.instrs) {
    if (kir::is_reduce(in.op)) p.num_passes = std::max(p.num_passes, p.level[static_cast<size_t>(in.args[0])] + 1);
  }
  for (const kir::Store& s : k.stores) {
    const size_t v = static_cast<size_t>(s.value);
    if (nr > 0 && p.elem[v]) p.num_passes = std::max(p.num_passes, p.level[v] + 1);
  }

  // Vector width: one register of the widest value type (F16/BF16 compute in f32).
  int bits = 32;
  for (const kir::Instr& in : k.instrs) {
    if (in.dtype == kir::DType::F64 || in.dtype == kir::DType::I64) bits = 64;
  }
  const int vmax = std::max(1, t.vector_bits / bits);
  const int last = p.rank() - 1;

  if (nr == 0) {
    p.mode = LoopMode::Pointwise;
    if (vmax > 1 && p.sizes[static_cast<size_t>(last)] >= vmax) {
      p.lane_dim = last;
      p.vf = vmax;
    }
    p.grain = o.chunk_work;
    return p;
  }

  // Reductions: lanes along the innermost reduce dim when its accesses are contiguous or
  // broadcast, else along the innermost outer dim when those are; gathers otherwise.
  const int olast = p.num_outer - 1;
  bool inner_unit = true;
  bool outer_unit = true;
  for (int32_t v : load_ids) {
    const Access& a = p.loads[static_cast<size_t>(v)];
    if (p.elem[static_cast<size_t>(v)]) inner_unit = inner_unit && is_unit(a.strides[static_cast<size_t>(last)]);
    outer_unit = outer_unit && is_unit(a.strides[static_cast<size_t>(olast)]);
  }
  for (size_t s = 0; s < k.stores.size(); ++s) {
    const Access& a = p.stores[s];
    if (p.elem[static_cast<size_t>(k.stores[s].value)]) {
      inner_unit = inner_unit && is_unit(a.strides[static_cast<size_t>(last)]);
    }
    outer_unit = outer_unit && is_unit(a.strides[static_cast<size_t>(olast)]);
  }
  const bool big_inner = vmax > 1 && p.sizes[static_cast<size_t>(last)] >= vmax;
  const bool big_outer = vmax > 1 && p.sizes[static_cast<size_t>(olast)] >= vmax;
  p.mode = LoopMode::ReduceInner;
  if (big_inner && inner_unit) {
    p.lane_dim = last;
  } else if (big_outer && outer_unit) {
    p.mode = LoopMode::ReduceOuter;
    p.lane_dim = olast;
  } else if (big_inner) {
    p.lane_dim = last;
  } else if (big_outer) {
    p.mode = LoopMode::ReduceOuter;
    p.lane_dim = olast;
  }
  if (p.lane_dim >= 0) p.vf = vmax;
  // Unroll: independent accumulators along a contiguous innermost reduce dim
  // (ReduceInner), or blocks of unroll*vf adjacent outer indices (ReduceOuter), so that
  // each row of a column reduction reads whole cache lines.
  const bool unit = p.mode == LoopMode::ReduceInner ? inner_unit : outer_unit;
  if (p.vf > 1 && unit) {
    const int64_t n = p.sizes[static_cast<size_t>(p.lane_dim)];
    while (p.unroll * 2 <= o.max_unroll && n >= int64_t{2} * p.unroll * p.vf) p.unroll *= 2;
  }
  p.grain = std::max<int64_t>(1, o.chunk_work / std::max<int64_t>(1, k.reduce_numel()));
  return p;
}

std::string to_string(const KernelPlan& p) {
  std::ostringstream os;
  os << "mode=" << to_string(p.mode) << " vf=" << p.vf << " unroll=" << p.unroll << " lane_dim=" << p.lane_dim
     << " sizes=[";
  for (size_t d = 0; d < p.sizes.size(); ++d) os << (d ? ", " : "") << p.sizes[d];
  os << "] outer_dims=" << p.num_outer << " passes=" << p.num_passes << " grain=" << p.grain;
  return os.str();
}

}  // namespace tcap::codegen::cpu
