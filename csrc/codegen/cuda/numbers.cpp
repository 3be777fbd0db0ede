#include "codegen/cuda/numbers.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <sstream>

namespace tcap::codegen::cuda {

namespace {

// An F32/F64 constant the code may read at launch: not pow's exponent, whose literal value
// picks ATen's special cases (x * x for 2), as the CPU renderer keeps it.
bool constant_at_launch(const kir::Kernel& k, size_t v) {
  const kir::Instr& c = k.instrs[v];
  if (c.op != kir::OpCode::Const || (c.dtype != kir::DType::F32 && c.dtype != kir::DType::F64)) return false;
  for (const kir::Instr& in : k.instrs) {
    if (in.op == kir::OpCode::Pow && in.args.size() == 2 && in.args[1] == static_cast<int32_t>(v)) return false;
  }
  return true;
}

char size_class(int64_t n) { return n == 0 ? '0' : n == 1 ? '1' : 'x'; }

}  // namespace

NumberLayout number_layout(const kir::Kernel& k, const kir::Coalesced& c) {
  NumberLayout l;
  const auto rank = static_cast<int32_t>(c.sizes.size());
  int32_t next = rank;
  l.load.assign(k.instrs.size(), -1);
  l.constant.assign(k.instrs.size(), -1);
  l.workspace.assign(k.instrs.size(), -1);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (k.instrs[v].op == kir::OpCode::Load) {
      l.load[v] = next;
      next += 1 + rank;
    }
  }
  for (size_t s = 0; s < k.stores.size(); ++s) {
    l.store.push_back(next);
    next += 1 + rank;
  }
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (constant_at_launch(k, v)) l.constant[v] = next++;
    if (kir::is_reduce(k.instrs[v].op)) l.workspace[v] = next++;
  }
  l.elements = next++;
  l.outer = next++;
  l.reduce = next++;
  l.work_items = next++;
  l.split_len = next++;
  l.splits = next++;
  l.count = next;
  return l;
}

std::vector<int64_t> launch_numbers(const kir::Kernel& k, const kir::Coalesced& c, const KernelPlan& p,
                                    const NumberLayout& l) {
  std::vector<int64_t> n(static_cast<size_t>(l.count), 0);
  for (size_t d = 0; d < c.sizes.size(); ++d) n[d] = c.sizes[d];
  auto put = [&n](int32_t at, const kir::Access& a) {
    n[static_cast<size_t>(at)] = a.offset;
    for (size_t d = 0; d < a.strides.size(); ++d) n[static_cast<size_t>(at) + 1 + d] = a.strides[d];
  };
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (l.load[v] >= 0) put(l.load[v], c.loads[v]);
    if (l.constant[v] >= 0) std::memcpy(&n[static_cast<size_t>(l.constant[v])], &k.instrs[v].f, sizeof(int64_t));
    if (l.workspace[v] >= 0 && v < p.workspace_offset.size()) n[static_cast<size_t>(l.workspace[v])] = p.workspace_offset[v];
  }
  for (size_t s = 0; s < k.stores.size(); ++s) put(l.store[s], c.stores[s]);
  n[static_cast<size_t>(l.elements)] = p.launch.elements;
  n[static_cast<size_t>(l.outer)] = k.outer_numel();
  n[static_cast<size_t>(l.reduce)] = k.reduce_numel();
  n[static_cast<size_t>(l.work_items)] = p.launch.work_items;
  n[static_cast<size_t>(l.split_len)] = p.split_len;
  n[static_cast<size_t>(l.splits)] = p.launch.splits;
  return n;
}

std::string launch_structure(const kir::Kernel& k, const kir::Coalesced& c, const std::vector<bool>& elem,
                             const LaunchPlan& p) {
  std::ostringstream os;
  os << "rank=" << c.sizes.size() << " outer=" << c.num_outer << " reduce_dims=" << k.num_reduce_dims << " sizes [";
  for (int64_t s : c.sizes) os << size_class(s);
  os << "]\nplan strategy=" << to_string(p.strategy) << " block=" << p.block << " vec=" << p.vec
     << " row_chunks=" << p.row_chunks << " rows_per_block=" << p.rows_per_block << " lanes=" << p.lanes
     << " split=" << (p.splits > 1) << " index32=" << p.index32 << " scratch=" << (p.scratch_bytes > 0) << "\n";
  os << kir::structure_text(k, c.loads, c.stores, elem);
  // Constants the code cannot read at launch are part of the structure.
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const kir::Instr& in = k.instrs[v];
    if (in.op != kir::OpCode::Const || constant_at_launch(k, v)) continue;
    int64_t bits = 0;  // exactly: two constants that print alike are still two structures
    std::memcpy(&bits, &in.f, sizeof bits);
    os << "const %" << v << " " << bits << " " << in.i << "\n";
  }
  return os.str();
}

std::vector<bool> LaunchShapes::at_launch(const std::string& structure, const std::vector<int64_t>& numbers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (everything_) return std::vector<bool>(numbers.size(), true);
  auto [it, first] = seen_.try_emplace(structure);
  Seen& s = it->second;
  if (first) {
    s.first = numbers;
    s.varying.assign(numbers.size(), false);
    return {};
  }
  TORCH_INTERNAL_ASSERT(s.first.size() == numbers.size(), "cuda: kernels of one structure with ", s.first.size(),
                        " and ", numbers.size(), " numbers");
  bool differs = false;
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (numbers[i] != s.first[i]) {
      s.varying[i] = true;
      differs = true;
    }
  }
  if (!differs) return {};
  return s.varying;
}

void LaunchShapes::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  seen_.clear();
}

void LaunchShapes::read_everything_for_testing(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  everything_ = on;
}

}  // namespace tcap::codegen::cuda
