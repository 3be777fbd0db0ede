#include "codegen/cpu_llvm/plan.h"

#include "support/env.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace tcap::codegen::cpu_llvm {

namespace {

bool is_unit(int64_t stride) { return stride == 0 || stride == 1; }

// Whether the code reads plan dim d's size at launch (Note [Sizes at launch]).
bool size_at_launch(const KernelPlan& p, int d) { return !p.at_launch.empty() && p.at_launch[static_cast<size_t>(d)]; }

bool sizes_built_in(const KernelPlan& p) {
  for (int d = 0; d < p.rank(); ++d) {
    if (size_at_launch(p, d)) return false;
  }
  return true;
}

// Note [Streaming stores] (render.cpp): which stores stream. Each of them writes whole
// vectors along the lanes (stride 1), every element once per domain point (an element-
// level store), into a buffer the kernel does not read, at least `stream_bytes` of them
// with sizes built into the code (code that reads its sizes at launch serves small sizes
// too, and stores normally).
void plan_streams(const kir::Kernel& k, const TargetInfo& t, const PlanOptions& o, KernelPlan& p) {
  p.stream.assign(k.stores.size(), false);
  if (!t.x86 || p.vf <= 1 || p.lane_dim < 0 || !sizes_built_in(p)) return;
  for (size_t s = 0; s < k.stores.size(); ++s) {
    const kir::Store& st = k.stores[s];
    const Access& a = p.stores[s];
    if (a.strides[static_cast<size_t>(p.lane_dim)] != 1) continue;
    if (p.is_reduction() && !kir::per_element(k, st, p.elem)) continue;
    bool read = false;
    for (const kir::Instr& in : k.instrs) read = read || (in.op == kir::OpCode::Load && in.buffer == st.buffer);
    if (read) continue;
    int64_t bytes = kir::dtype_size(k.buffers[static_cast<size_t>(st.buffer)].dtype);
    for (size_t d = 0; d < a.strides.size(); ++d) {
      if (a.strides[d] != 0) bytes *= p.sizes[d];
    }
    p.stream[s] = bytes >= o.stream_bytes;
  }
}

// Note [Prefetching the next row] (render.cpp): whether a ReduceInner kernel's second
// pass prefetches. Several passes over rows that fit the cache, many of them in all, whose
// first pass reads contiguous rows from memory; sizes built into the code.
bool plan_prefetch(const kir::Kernel& k, const PlanOptions& o, const KernelPlan& p) {
  if (p.mode != LoopMode::ReduceInner || p.vf <= 1 || p.num_passes < 2 || p.num_outer < 1 || !sizes_built_in(p)) {
    return false;
  }
  const size_t lane = static_cast<size_t>(p.lane_dim), row = static_cast<size_t>(p.num_outer - 1);
  int64_t row_bytes = 0, bytes = 0;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const kir::Instr& in = k.instrs[v];
    if (in.op != kir::OpCode::Load || !p.elem[v]) continue;
    const Access& a = p.loads[v];
    if (a.strides[lane] != 1 || a.strides[row] == 0) continue;
    const int64_t r = kir::dtype_size(in.dtype) * k.reduce_numel();
    row_bytes += r;
    bytes += r * k.outer_numel();
  }
  return row_bytes > 0 && row_bytes <= o.prefetch_row_bytes && bytes >= o.prefetch_min_bytes;
}

}  // namespace

const char* to_string(LoopMode m) {
  switch (m) {
    case LoopMode::Pointwise: return "pointwise";
    case LoopMode::ReduceInner: return "reduce_inner";
    case LoopMode::ReduceOuter: return "reduce_outer";
  }
  return "?";
}

KernelPlan make_plan(const kir::Kernel& k, const TargetInfo& t, const PlanOptions& o,
                     const std::vector<bool>* varying) {
  kir::check_renderable(k, "cpu_llvm", "CPU");
  KernelPlan p;
  p.elem = kir::element_level(k);
  p.level = kir::reduce_level(k);
  const size_t nr = static_cast<size_t>(k.num_reduce_dims);

  kir::Coalesced c = kir::coalesce(k);
  p.sizes = std::move(c.sizes);
  p.num_outer = c.num_outer;
  p.loads = std::move(c.loads);
  p.stores = std::move(c.stores);
  std::vector<int32_t> load_ids;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (k.instrs[v].op == kir::OpCode::Load) load_ids.push_back(static_cast<int32_t>(v));
  }
  if (varying) {
    const NumberSlots slots = number_slots(k, p);
    TORCH_INTERNAL_ASSERT(varying->size() == static_cast<size_t>(slots.count), "cpu_llvm: a mask of ",
                          varying->size(), " numbers for a kernel of ", slots.count);
    p.at_launch = *varying;
  }

  // Passes (reductions only): pass q computes the Reduces whose operand has level q and
  // the element-level Stores of level-q values.
  for (const kir::Instr& in : k.instrs) {
    if (kir::is_reduce(in.op)) p.num_passes = std::max(p.num_passes, p.level[static_cast<size_t>(in.args[0])] + 1);
  }
  for (const kir::Store& s : k.stores) {
    const size_t v = static_cast<size_t>(s.value);
    if (nr > 0 && kir::per_element(k, s, p.elem)) p.num_passes = std::max(p.num_passes, p.level[v] + 1);
  }

  // Vector width: one register of the widest value type (F16/BF16 compute in f32).
  int bits = 32;
  for (const kir::Instr& in : k.instrs) {
    if (in.dtype == kir::DType::F64 || in.dtype == kir::DType::I64) bits = 64;
  }
  const int vmax = std::max(1, t.vector_bits / bits);
  const int last = p.rank() - 1;
  // A size seen to vary may be any size: decide as for a large one.
  auto at_least = [&p](int d, int64_t n) { return size_at_launch(p, d) || p.sizes[static_cast<size_t>(d)] >= n; };

  if (nr == 0) {
    p.mode = LoopMode::Pointwise;
    if (vmax > 1 && at_least(last, vmax)) {
      p.lane_dim = last;
      p.vf = vmax;
    }
    p.grain = o.chunk_work;
    plan_streams(k, t, o, p);
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
    if (kir::per_element(k, k.stores[s], p.elem)) {
      inner_unit = inner_unit && is_unit(a.strides[static_cast<size_t>(last)]);
    }
    outer_unit = outer_unit && is_unit(a.strides[static_cast<size_t>(olast)]);
  }
  const bool big_inner = vmax > 1 && at_least(last, vmax);
  const bool big_outer = vmax > 1 && at_least(olast, vmax);
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
    while (p.unroll * 2 <= o.max_unroll && at_least(p.lane_dim, int64_t{2} * p.unroll * p.vf)) p.unroll *= 2;
  }
  p.grain = std::max<int64_t>(1, o.chunk_work / std::max<int64_t>(1, k.reduce_numel()));
  plan_streams(k, t, o, p);
  p.prefetch_next_row = plan_prefetch(k, o, p);
  return p;
}

NumberSlots number_slots(const kir::Kernel& k, const KernelPlan& p) {
  NumberSlots s;
  int32_t next = p.rank();
  const int32_t access = 1 + p.rank();
  s.load.assign(k.instrs.size(), -1);
  s.value.assign(k.instrs.size(), -1);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (k.instrs[v].op == kir::OpCode::Load) {
      s.load[v] = next;
      next += access;
    }
  }
  for (size_t i = 0; i < k.stores.size(); ++i) {
    s.store.push_back(next);
    next += access;
  }
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (k.instrs[v].op == kir::OpCode::Const) s.value[v] = next++;
  }
  s.count = next;
  return s;
}

std::vector<int64_t> kernel_numbers(const kir::Kernel& k, const KernelPlan& p, const NumberSlots& slots) {
  std::vector<int64_t> n(static_cast<size_t>(slots.count), 0);
  for (int d = 0; d < p.rank(); ++d) n[static_cast<size_t>(d)] = p.sizes[static_cast<size_t>(d)];
  auto put = [&n](int32_t at, const Access& a) {
    n[static_cast<size_t>(at)] = a.offset;
    for (size_t d = 0; d < a.strides.size(); ++d) n[static_cast<size_t>(at) + 1 + d] = a.strides[d];
  };
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const kir::Instr& in = k.instrs[v];
    if (slots.load[v] >= 0) put(slots.load[v], p.loads[v]);
    if (slots.value[v] >= 0) {
      int64_t bits = in.i;
      if (kir::is_floating(in.dtype)) std::memcpy(&bits, &in.f, sizeof bits);
      n[static_cast<size_t>(slots.value[v])] = bits;
    }
  }
  for (size_t i = 0; i < k.stores.size(); ++i) put(slots.store[i], p.stores[i]);
  return n;
}

std::string kernel_structure(const kir::Kernel& k, const KernelPlan& p) {
  return "rank=" + std::to_string(p.rank()) + " outer=" + std::to_string(p.num_outer) + "\n" +
         kir::structure_text(k, p.loads, p.stores, p.elem);
}

bool may_read_at_launch(const kir::Kernel& k, const NumberSlots& slots, int32_t slot) {
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (slots.value[v] != slot) continue;
    if (k.instrs[v].dtype != kir::DType::F32 && k.instrs[v].dtype != kir::DType::F64) return false;
    // pow's exponent: a literal one picks ATen's special cases (x * x for 2), which keep
    // results bit-identical to eager's.
    for (const kir::Instr& in : k.instrs) {
      if (in.op == kir::OpCode::Pow && in.args.size() == 2 && in.args[1] == static_cast<int32_t>(v)) return false;
    }
    return true;
  }
  return true;  // a size, an offset, or a stride (one that differs between kernels of a structure is of class other)
}

std::string to_string(const KernelPlan& p) {
  std::ostringstream os;
  os << "mode=" << to_string(p.mode) << " vf=" << p.vf << " unroll=" << p.unroll << " lane_dim=" << p.lane_dim
     << " sizes=[";
  for (size_t d = 0; d < p.sizes.size(); ++d) os << (d ? ", " : "") << p.sizes[d];
  os << "] outer_dims=" << p.num_outer << " passes=" << p.num_passes << " grain=" << p.grain;
  const auto read = std::count(p.at_launch.begin(), p.at_launch.end(), true);
  if (read > 0) os << " numbers_at_launch=" << read;
  const auto streams = std::count(p.stream.begin(), p.stream.end(), true);
  if (streams > 0) os << " streaming_stores=" << streams;
  if (p.prefetch_next_row) os << " prefetch_next_row";
  return os.str();
}

bool masked_tails_on() { return env_switch("TCAP_MASKED_TAILS", true); }

}  // namespace tcap::codegen::cpu_llvm
