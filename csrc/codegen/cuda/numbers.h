// Sizes read at launch by the cuda backend's kernels.
//
// Note [CUDA sizes at launch]
// A CUDA kernel's source used to have every number built in: the coalesced sizes, each
// access's offset and strides, the element, row and column counts and a mean's 1/n. A
// dynamic entry specialized to a new batch size or sequence length therefore rendered new
// sources, and NVRTC compiled each again (tens to hundreds of ms a kernel). As on the CPU
// (Note [Sizes at launch] in cpu_llvm.h):
// - A kernel's *structure* is its kernel IR with those numbers left out, plus each
//   coalesced stride's class (0, 1, other), each coalesced size's class (0, 1, other)
//   and every decision of its launch plan (strategy, block, vector width, persistent
//   chunks, rows per block, lanes, whether rows are split, index width): everything the
//   emitted code's shape depends on.
// - Its *numbers* are one int64 slot each (NumberLayout): the coalesced sizes, each Load's
//   and Store's offset and strides, the counts derived from them that the code uses (the
//   elements, the outer and reduce extents, the work items, the number of splits and a
//   split's length, each split Reduce's workspace offset) and each F32/F64 constant's double bits (not pow's
//   exponents, whose literal values pick ATen's special cases).
// - The first kernel of a structure is rendered with its numbers built in. A kernel of the
//   same structure with other numbers gets a source that reads the numbers that differed
//   (and those that differed before: the set only widens) from a by-value parameter,
//   `tcap_n`, and keeps the rest built in; that source, and so its binary, serves every
//   later kernel of the structure that differs only there. Each kernel keeps its own
//   launch plan (grid, alignment checks, scratch bytes) and numbers, passed at launch.
// Because the plan's decisions are part of the structure, a kernel whose sizes lead to
// another strategy or vector width has another structure (a compile of its own), and code
// never runs under a decision taken for other sizes. A workload whose batch varies pays
// two compiles per kernel structure, whatever the number of batch sizes.
#pragma once

#include "codegen/cuda/plan.h"
#include "kir/kir.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tcap::codegen::cuda {

// Where a kernel's numbers live (Note [CUDA sizes at launch]).
struct NumberLayout {
  std::vector<int32_t> load;       // value id -> slot of the Load's offset (one per coalesced dim follows); -1
  std::vector<int32_t> store;      // store index -> slot of its offset (its strides follow)
  std::vector<int32_t> constant;   // value id -> slot of an F32/F64 Const read at launch; -1
  std::vector<int32_t> workspace;  // value id -> slot of a Reduce's workspace offset (split kernels); -1
  int32_t elements = 0, outer = 0, reduce = 0, work_items = 0, split_len = 0, splits = 0;
  int32_t count = 0;               // the coalesced sizes are slots [0, rank)
};
NumberLayout number_layout(const kir::Kernel& k, const kir::Coalesced& c);

// The kernel's numbers in slot order, as planned by `p`.
std::vector<int64_t> launch_numbers(const kir::Kernel& k, const kir::Coalesced& c, const KernelPlan& p,
                                    const NumberLayout& l);

// What a kernel shares with every kernel its code can serve (text; part of a map key).
std::string launch_structure(const kir::Kernel& k, const kir::Coalesced& c, const std::vector<bool>& elem,
                             const LaunchPlan& p);

// The structures seen, and the numbers each reads at launch (thread-safe). One per
// backend: the cuda backend's kernel cache, and the CUDA host emulator's.
class LaunchShapes {
 public:
  // The slots kernel k (of `structure`, with `numbers`) must read at launch: empty when it
  // is the first of its structure or has its first kernel's numbers; else every slot that
  // differed from the first kernel's numbers in any kernel of the structure so far.
  std::vector<bool> at_launch(const std::string& structure, const std::vector<int64_t>& numbers);
  void clear();
  // Tests: every kernel's code reads every number at launch (the renderer's launch path
  // checked on every kernel a test builds, not only on kernels met at a second size).
  void read_everything_for_testing(bool on);

 private:
  struct Seen {
    std::vector<int64_t> first;
    std::vector<bool> varying;
  };
  std::mutex mu_;
  std::map<std::string, Seen> seen_;
  bool everything_ = false;
};

}  // namespace tcap::codegen::cuda
