// The LLVM IR renderer of one kernel (Note [CPU loop nests] in render.cpp): internal to
// codegen/cpu_llvm, shared by render.cpp (loops, addressing, loads, stores, pointwise
// blocks, the function) and render_reductions.cpp (the passes of a reduction).
#pragma once

#include "codegen/cpu_llvm/emit.h"
#include "codegen/cpu_llvm/llvm_compat.h"
#include "codegen/cpu_llvm/plan.h"
#include "kir/kir.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tcap::codegen::cpu_llvm::render_detail {

using llvm::Value;

// The index of one block: one value per plan dim (null where the dim is not bound; the
// access must then have stride 0 there).
struct Index {
  std::vector<Value*> iv;
};

class Renderer {
 public:
  Renderer(const kir::Kernel& k, const KernelPlan& p, const TargetInfo& t, llvm::Module& m)
      : k_(k), p_(p), t_(t), m_(m), b_(m.getContext()), ops_(b_, m, t), slots_(number_slots(k, p)) {
    launch_values_.assign(static_cast<size_t>(slots_.count), nullptr);
    ops_.launch_consts.assign(k.instrs.size(), false);
    for (size_t v = 0; v < k.instrs.size(); ++v) {
      const int32_t s = slots_.value[v];
      ops_.launch_consts[v] = s >= 0 && static_cast<size_t>(s) < p.at_launch.size() && p.at_launch[static_cast<size_t>(s)];
    }
  }

  llvm::Function* render(const std::string& symbol);

 private:
  struct Block {
    const Index* idx;
    int lanes;
    std::vector<Value*> vals;
  };

  Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }
  // Number `slot` (Note [Sizes at launch]): `literal`, or the launch's number when the
  // plan reads it at launch.
  Value* num(int32_t slot, int64_t literal);
  Value* size(int d) { return num(d, p_.sizes[static_cast<size_t>(d)]); }
  Value* lane_steps(int32_t stride_slot, int64_t stride, int lanes);
  Value* launch_constant(int32_t v, int lanes);
  // Off: a remainder loop, or one that holds other loops (Note [Which loops LLVM unrolls]).
  enum class Unroll { Allow, Off };
  Value* loop(Value* start, Value* limit, int64_t step, const std::function<void(Value*)>& body,
              Unroll unroll = Unroll::Allow);
  void decompose(Value* linear, int d0, int d1, Index& idx);
  void walk_rows(int nd, Index& idx, const std::function<void(int lanes)>& run);
  // Note [Masked tails]: whether the kernel's tails run as one masked vector, and the block
  // that runs `body` as one with the first `count` of vf lanes active, when count > 0.
  bool masked_tails() const;
  void masked_tail(Value* count, int vf, const std::function<void()>& body);
  llvm::AllocaInst* entry_alloca(llvm::Type* t);

  Value* offset(const Access& a, int32_t slot, const Index& idx);
  Value* load(int32_t v, const Index& idx, int lanes);
  void store(size_t s, Value* x, const Index& idx, int lanes);
  Value* value(Block& blk, int32_t v);

  void pointwise_block(const Index& idx, int lanes);
  void reduction_body(Index& idx, int outer_lanes);
  void materialize_outer(int level, const Index& idx, int lanes);
  void reduce_pass(int q, Index& idx, int outer_lanes);

  // One pass over the reduce dims (Note [CPU loop nests]).
  struct Pass {
    struct Acc {
      std::vector<llvm::AllocaInst*> vec;
      llvm::AllocaInst* scalar = nullptr;
    };
    std::vector<int32_t> reds;   // the Reduces it finishes
    std::vector<size_t> stores;  // its element-level Stores
    bool inner_vec = false;      // lanes walk the innermost reduce dim
    bool prefetch = false;       // Note [Prefetching the next row]
    int unroll = 1;
    std::vector<Acc> accs;       // per Reduce
  };
  Pass make_pass(int q, int outer_lanes);
  void pass_block(const Pass& ps, const Index& idx, int lanes, int u);
  void pass_loops(const Pass& ps, Index& idx, int d, int outer_lanes);
  void prefetch_next_row(const Index& idx);

  const kir::Kernel& k_;
  const KernelPlan& p_;
  const TargetInfo& t_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  ValueEmitter ops_;
  NumberSlots slots_;
  llvm::Function* fn_ = nullptr;
  Value* numbers_ = nullptr;            // the launch's numbers (ptr to i64)
  std::vector<Value*> launch_values_;   // per slot, loaded in the entry block once used
  Value* begin_ = nullptr;
  Value* end_ = nullptr;
  std::vector<Value*> bufs_;    // data pointer per kernel buffer
  std::vector<Value*> outer_;   // outer-level values of the current outer index (reductions)
  // Note [Masked tails]: while a masked block renders, its lane mask (<vf x i1>) and its
  // count of active lanes (i64); null otherwise.
  Value* mask_ = nullptr;
  Value* mask_count_ = nullptr;
};

}  // namespace tcap::codegen::cpu_llvm::render_detail
