#include "codegen/cuda/plan.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <sstream>

namespace tcap::codegen::cuda {

using kir::DType;
using kir::OpCode;

namespace {

int64_t max_offset(const kir::Access& a, const std::vector<int64_t>& sizes) {
  int64_t m = std::abs(a.offset);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 0) m += (sizes[d] - 1) * std::abs(a.strides[d]);
  }
  return m;
}

int64_t pow2_ceil(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// The unit-stride accesses of a vector path along the innermost coalesced dim: what the
// host checks for alignment (LaunchPlan::aligned), and the vector width they allow.
class UnitAccesses {
 public:
  explicit UnitAccesses(const kir::Kernel& k) : k_(k) {}
  void add(int32_t buffer, const kir::Access& a) {
    const int64_t size = kir::dtype_size(k_.buffers[static_cast<size_t>(buffer)].dtype);
    widest_ = std::max(widest_, size);
    unit_.push_back({{buffer, a.offset, size}, &a});
  }
  // 16 bytes of the widest element (at most 8 elements), narrowed until `row` (when given)
  // and every unit access's stride along every dim but `along` (the vectors' dim) are
  // multiples of it, so that vectors never straddle rows and one aligned row start means
  // all are aligned.
  int width(std::optional<int64_t> row, size_t along) const {
    auto fits = [&](int w) {
      if (row && *row % w != 0) return false;
      for (const auto& u : unit_) {
        for (size_t d = 0; d < u.second->strides.size(); ++d) {
          if (d != along && u.second->strides[d] % w != 0) return false;
        }
      }
      return true;
    };
    int w = static_cast<int>(std::min<int64_t>(8, 16 / widest_));
    while (w > 1 && !fits(w)) w /= 2;
    return w;
  }
  void aligned_into(LaunchPlan& p) const {
    for (const auto& u : unit_) p.aligned.push_back(u.first);
  }
  bool empty() const { return unit_.empty(); }

 private:
  const kir::Kernel& k_;
  int64_t widest_ = 1;
  std::vector<std::pair<LaunchPlan::Aligned, const kir::Access*>> unit_;
};

// Note [Split column reductions]
// A column reduction (reducing the rows of a row-major matrix: bias gradients, layer-norm
// weight gradients, BatchNorm statistics) reads along the outer dims. One thread per column
// with a serial loop over the rows (ThreadRow) leaves a GPU almost idle when there are a
// few thousand columns (a [1024, 2048] bias gradient is 2048 threads, ~1% of an H100's),
// and one block per column (BlockRow) reads one element per 32-byte sector. The Column
// strategy (Note [CUDA kernel shapes]) tiles the columns in blocks of `lanes` x `vec`
// columns and 256 / lanes rows of threads, and splits the rows of a tile over `splits`
// blocks, so that there are enough blocks to fill the device and every thread runs about
// kSplitItemsPerThread rows. Per tile and split:
//   1. each thread accumulates its `vec` columns over the rows ty, ty + rows, ... of the
//      split, reading `vec` columns at once (16 bytes) on the vector path;
//   2. the block combines its row-threads through shared memory, in row-thread order;
//   3. with one split, the first row of threads runs the epilogue (outer-level values and
//      stores); with several, it writes the partial results to the workspace, fences, and
//      one thread counts the split in the tile's semaphore; the block that counts last
//      reads every split's partial result (volatile: not from L1) in split order and runs
//      the epilogue.
// Nothing depends on which block arrives last or on the device: the combination order is
// fixed by the kernel's shape, so the results are deterministic and the same on every GPU.
// The semaphores must be zero at launch: cuda::launch zeroes them on the launch's stream
// (cuMemsetD32Async, a memset node under CUDA-graph capture) before the kernel.
// Only single-pass kernels are Column kernels; multi-pass ones (a softmax over dim 0) run
// as ThreadRow.
constexpr int kColumnBlock = 256;
constexpr int64_t kSplitItemsPerThread = 8;  // rows (Column) or vectors (BlockRow) per thread and split
constexpr int64_t kColumnMaxSplits = 256;
constexpr int64_t kColumnMaxSharedBytes = 32 * 1024;
constexpr int64_t kRowSplitBlocks = 512;
constexpr int64_t kWarpRowsPerBlock = 8;

// Bytes of a Reduce's accumulator (its register type).
int64_t acc_bytes(DType t) {
  if (t == DType::Bool) return 1;
  if (t == DType::F16 || t == DType::BF16) return 4;
  return kir::dtype_size(t);
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

class Planner {
 public:
  Planner(const kir::Kernel& k, const kir::Coalesced& c, const std::vector<bool>& elem, const std::vector<int>& level,
          const RenderOptions& o)
      : k_(k), o_(o), c_(c), elem_(elem), level_(level) {}

  KernelPlan run() {
    plan();
    return {plan_, split_len_, workspace_offset_};
  }

 private:
  void plan();
  int num_passes() const { return cuda::num_passes(k_, elem_, level_); }
  // Plans a Column kernel (Note [Split column reductions]); false when its shared memory
  // would not fit.
  bool plan_column(int64_t outer, int64_t red);
  // Splits the reduce extent into about `wanted` (>= 1) parts of a whole number of `unit`
  // points, none empty (plan_.splits, split_len_); with several, plans the scratch: the
  // semaphores (one per tile or row) and each Reduce's workspace.
  void plan_splits(int64_t wanted, int64_t unit, int64_t semaphores);

  const kir::Kernel& k_;
  const RenderOptions& o_;
  const kir::Coalesced& c_;
  const std::vector<bool>& elem_;
  const std::vector<int>& level_;
  LaunchPlan plan_;
  int64_t split_len_ = 0;
  std::vector<int64_t> workspace_offset_;
};

void Planner::plan() {
  const int rank = static_cast<int>(c_.sizes.size());
  int64_t biggest = 0;
  for (size_t id = 0; id < k_.instrs.size(); ++id) {
    if (k_.instrs[id].op == OpCode::Load) biggest = std::max(biggest, max_offset(c_.loads[id], c_.sizes));
  }
  for (const auto& a : c_.stores) biggest = std::max(biggest, max_offset(a, c_.sizes));
  const int64_t numel = k_.numel();
  plan_.index32 = biggest < (int64_t{1} << 31) - 1 && numel < (int64_t{1} << 30);
  plan_.elements = numel;
  if (k_.num_reduce_dims == 0) {
    plan_.strategy = Strategy::Pointwise;
    plan_.block = o_.pointwise_block;
    // Vector path: along the innermost coalesced dim, where every load has stride 0 or 1
    // and every store stride 1. With more than one dim, vectors must not straddle rows:
    // the innermost size is a multiple of the width and, for unit-stride accesses, so is
    // every outer stride (then one aligned row start means all are aligned).
    const size_t last = static_cast<size_t>(rank - 1);
    bool ok = numel >= 2;
    UnitAccesses unit(k_);
    for (size_t id = 0; id < k_.instrs.size() && ok; ++id) {
      const kir::Instr& in = k_.instrs[id];
      if (in.op != OpCode::Load) continue;
      const int64_t s = c_.loads[id].strides[last];
      ok = s == 0 || s == 1;
      if (s == 1) unit.add(in.buffer, c_.loads[id]);
    }
    for (size_t s = 0; s < k_.stores.size() && ok; ++s) {
      ok = c_.stores[s].strides[last] == 1;
      unit.add(k_.stores[s].buffer, c_.stores[s]);
    }
    // One dim: a scalar tail finishes the odd elements, so no row constraint.
    plan_.vec = ok ? unit.width(rank > 1 ? std::optional<int64_t>(c_.sizes[last]) : std::nullopt, last) : 1;
    if (plan_.vec > 1) unit.aligned_into(plan_);
    plan_.work_items = plan_.vec > 1 ? (numel + plan_.vec - 1) / plan_.vec : numel;
    return;
  }
  const int64_t outer = k_.outer_numel();
  const int64_t red = k_.reduce_numel();
  plan_.work_items = outer;
  // Column reductions: element loads contiguous along the innermost outer dim and not along
  // the innermost reduce dim. Single-pass ones are Column kernels (Note [Split column
  // reductions]); multi-pass ones with enough columns run a thread per column (ThreadRow),
  // whose adjacent threads read adjacent columns.
  const size_t olast = static_cast<size_t>(c_.num_outer - 1);
  const size_t last = static_cast<size_t>(rank - 1);
  bool outer_unit = true, inner_unit = true, some_outer_unit = false;
  for (size_t id = 0; id < k_.instrs.size(); ++id) {
    if (k_.instrs[id].op != OpCode::Load || !elem_[id]) continue;
    const int64_t so = c_.loads[id].strides[olast], si = c_.loads[id].strides[last];
    outer_unit = outer_unit && (so == 0 || so == 1);
    inner_unit = inner_unit && (si == 0 || si == 1);
    some_outer_unit = some_outer_unit || so == 1;
  }
  const int passes = num_passes();
  if (red > o_.thread_row_max && outer_unit && some_outer_unit && !inner_unit && passes == 1 && plan_column(outer, red)) {
    return;
  }
  const bool column = outer_unit && !inner_unit && outer >= 1024;
  if (red <= o_.thread_row_max || column) {
    plan_.strategy = Strategy::ThreadRow;
    plan_.block = o_.pointwise_block;
    return;
  }
  plan_.strategy = Strategy::BlockRow;
  // Row vector path (Note [CUDA kernel shapes]): one coalesced reduce dim, read with
  // stride 1 by every element-level load and written with stride 1 by every per-element
  // store, the row a whole number of vectors and every unit-stride access's outer strides
  // multiples of the width (then one aligned row start means all are).
  int vec = 1;
  if (rank - c_.num_outer == 1) {
    bool ok = true;
    UnitAccesses unit(k_);
    for (size_t id = 0; id < k_.instrs.size() && ok; ++id) {
      if (k_.instrs[id].op != OpCode::Load || !elem_[id]) continue;
      ok = c_.loads[id].strides[last] == 1;
      unit.add(k_.instrs[id].buffer, c_.loads[id]);
    }
    for (size_t s = 0; s < k_.stores.size() && ok; ++s) {
      if (!kir::per_element(k_, k_.stores[s], elem_)) continue;
      ok = c_.stores[s].strides[last] == 1;
      unit.add(k_.stores[s].buffer, c_.stores[s]);
    }
    if (ok && !unit.empty()) vec = unit.width(red, last);
    if (vec > 1) unit.aligned_into(plan_);
  }
  plan_.vec = vec;
  // Threads: enough for one vector (or element) each, a power of two in [32, row_block_max].
  plan_.block = static_cast<int>(std::clamp<int64_t>(pow2_ceil((red + vec - 1) / vec), 32, o_.row_block_max));
  // Rows kept in registers across passes (a persistent reduction): on the vector path of a
  // kernel with several passes, when each thread's share of the row's element loads is at
  // most kMaxRowChunks vectors per load and kMaxRowBytes in all.
  if (vec > 1 && passes >= 2) {
    constexpr int64_t kMaxRowChunks = 4, kMaxRowBytes = 256;
    const int64_t chunks = (red / vec + plan_.block - 1) / plan_.block;
    int64_t bytes = 0;
    for (size_t id = 0; id < k_.instrs.size(); ++id) {
      if (k_.instrs[id].op == OpCode::Load && elem_[id]) {
        bytes += chunks * vec * kir::dtype_size(k_.buffers[static_cast<size_t>(k_.instrs[id].buffer)].dtype);
      }
    }
    if (chunks <= kMaxRowChunks && bytes <= kMaxRowBytes) plan_.row_chunks = static_cast<int>(chunks);
  }
  // Few long rows (a full reduction to a scalar, a loss): a single-pass kernel splits each
  // row over several blocks, as Column kernels split their rows (Note [Split column
  // reductions]): enough blocks for about kRowSplitBlocks in all, each thread at least
  // kSplitItemsPerThread vectors (or elements) of its row. A split is a whole number of
  // vectors, so the vector path's alignment holds in every split.
  if (passes == 1 && outer < kRowSplitBlocks) {
    const int64_t per_thread = plan_.block * vec * kSplitItemsPerThread;
    plan_splits(std::min((kRowSplitBlocks + outer - 1) / outer, (red + per_thread - 1) / per_thread), vec, outer);
    plan_.work_items = outer * plan_.splits;
  }
  // Short rows (32 threads each: up to 32 vectors, e.g. an attention softmax over 128
  // keys): a warp per row and several rows per block, so that the SM's limit on resident
  // blocks does not cap the threads at half of what it holds (Note [CUDA kernel shapes]).
  if (plan_.block == 32 && plan_.splits == 1 && outer > 1) {
    plan_.rows_per_block = static_cast<int>(std::min<int64_t>(kWarpRowsPerBlock, pow2_ceil(outer)));
    plan_.block = 32 * plan_.rows_per_block;
  }
}

bool Planner::plan_column(int64_t outer, int64_t red) {
  const size_t olast = static_cast<size_t>(c_.num_outer - 1);
  // Vector path along the innermost outer dim: element loads read it with stride 0 or 1
  // (the caller checked), per-element stores write it with stride 1.
  bool ok = true;
  UnitAccesses unit(k_);
  for (size_t id = 0; id < k_.instrs.size(); ++id) {
    if (k_.instrs[id].op == OpCode::Load && elem_[id] && c_.loads[id].strides[olast] == 1) {
      unit.add(k_.instrs[id].buffer, c_.loads[id]);
    }
  }
  for (size_t s = 0; s < k_.stores.size() && ok; ++s) {
    if (!kir::per_element(k_, k_.stores[s], elem_)) continue;
    ok = c_.stores[s].strides[olast] == 1;
    unit.add(k_.stores[s].buffer, c_.stores[s]);
  }
  int vec = ok ? unit.width(c_.sizes[olast], olast) : 1;
  // Shared memory: one accumulator per thread, column and Reduce.
  int64_t per_column = 0;
  for (const kir::Instr& in : k_.instrs) {
    if (kir::is_reduce(in.op)) per_column += acc_bytes(in.dtype);
  }
  while (vec > 1 && kColumnBlock * vec * per_column > kColumnMaxSharedBytes) vec /= 2;
  if (kColumnBlock * vec * per_column > kColumnMaxSharedBytes) return false;
  const int64_t lanes = std::min<int64_t>(32, pow2_ceil((outer + vec - 1) / vec));
  const int64_t rows = kColumnBlock / lanes;
  const int64_t tiles = (outer + lanes * vec - 1) / (lanes * vec);
  plan_.strategy = Strategy::Column;
  plan_.block = kColumnBlock;
  plan_.vec = vec;
  plan_.lanes = static_cast<int>(lanes);
  if (vec > 1) unit.aligned_into(plan_);
  // Splits: about kSplitItemsPerThread rows per thread.
  plan_splits((red + rows * kSplitItemsPerThread - 1) / (rows * kSplitItemsPerThread), 1, tiles);
  plan_.work_items = tiles * plan_.splits;
  return true;
}

void Planner::plan_splits(int64_t wanted, int64_t unit, int64_t semaphores) {
  const int64_t outer = k_.outer_numel(), red = k_.reduce_numel();
  // At most kColumnMaxSplits, and the workspace (splits x outer) indexable in int.
  wanted = std::clamp<int64_t>(wanted, 1, std::min<int64_t>(kColumnMaxSplits, std::max<int64_t>(1, (int64_t{1} << 30) / outer)));
  split_len_ = round_up((red + wanted - 1) / wanted, unit);
  plan_.splits = static_cast<int>((red + split_len_ - 1) / split_len_);
  if (plan_.splits <= 1) return;
  plan_.semaphore_bytes = round_up(semaphores * 4, 256);
  int64_t at = plan_.semaphore_bytes;
  workspace_offset_.assign(k_.instrs.size(), -1);
  for (size_t id = 0; id < k_.instrs.size(); ++id) {
    if (!kir::is_reduce(k_.instrs[id].op)) continue;
    workspace_offset_[id] = at;
    at += round_up(plan_.splits * outer * acc_bytes(k_.instrs[id].dtype), 256);
  }
  plan_.scratch_bytes = at;
}

}  // namespace

int num_passes(const kir::Kernel& k, const std::vector<bool>& elem, const std::vector<int>& level) {
  int passes = 0;
  for (const kir::Instr& in : k.instrs) {
    if (kir::is_reduce(in.op)) passes = std::max(passes, level[static_cast<size_t>(in.args[0])] + 1);
  }
  for (const kir::Store& s : k.stores) {
    if (kir::per_element(k, s, elem)) passes = std::max(passes, level[static_cast<size_t>(s.value)] + 1);
  }
  return passes;
}

KernelPlan plan_kernel(const kir::Kernel& k, const kir::Coalesced& c, const std::vector<bool>& elem,
                       const std::vector<int>& level, const RenderOptions& o) {
  return Planner(k, c, elem, level, o).run();
}

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::Pointwise: return "pointwise";
    case Strategy::BlockRow: return "block_row";
    case Strategy::ThreadRow: return "thread_row";
    case Strategy::Column: return "column";
  }
  return "?";
}

int64_t LaunchPlan::blocks_needed() const {
  if (strategy == Strategy::BlockRow) return (work_items + rows_per_block - 1) / rows_per_block;
  if (strategy == Strategy::Column) return work_items;
  return (work_items + block - 1) / block;
}

int64_t launch_grid(const LaunchPlan& p, int multiprocessors) {
  const int64_t resident = int64_t{std::max(1, multiprocessors)} * std::max(1, 2048 / p.block);
  return std::max<int64_t>(1, std::min(p.blocks_needed(), resident * 4));
}

int vector_path_ok(const LaunchPlan& p, void* const* buffers) {
  if (p.vec <= 1) return 0;
  for (const auto& a : p.aligned) {
    const auto addr = reinterpret_cast<uintptr_t>(buffers[a.buffer]) + static_cast<uintptr_t>(a.offset * a.elem_size);
    if (addr % static_cast<uintptr_t>(p.vec * a.elem_size) != 0) return 0;
  }
  return 1;
}

std::string to_string(const LaunchPlan& p) {
  std::ostringstream os;
  os << "strategy=" << to_string(p.strategy) << " block=" << p.block << " vec=" << p.vec;
  if (p.row_chunks > 0) os << " row_chunks=" << p.row_chunks;
  if (p.rows_per_block > 1) os << " rows_per_block=" << p.rows_per_block;
  if (p.strategy == Strategy::Column) os << " lanes=" << p.lanes;
  if (p.splits > 1) os << " splits=" << p.splits;
  os << " index=" << (p.index32 ? "int32" : "int64") << " work_items=" << p.work_items;
  return os.str();
}

}  // namespace tcap::codegen::cuda
