// The passes of a reduction kernel over its reduce dims (Note [CPU loop nests] and Note
// [CPU summation order] in render.cpp): accumulators, the blocks of one pass, the loops
// over the reduce dims, the outer-level values between passes.
#include "codegen/cpu_llvm/renderer.h"

#include <c10/util/Exception.h>

#include <llvm/IR/Intrinsics.h>

#include <algorithm>

namespace tcap::codegen::cpu_llvm::render_detail {

// Computes the outer-level values of one level that are not Reduces (those are set when
// their pass finishes), in topological order.
void Renderer::materialize_outer(int level, const Index& idx, int lanes) {
  for (size_t v = 0; v < k_.instrs.size(); ++v) {
    const kir::Instr& in = k_.instrs[v];
    if (p_.elem[v] || outer_[v] || p_.level[v] != level || kir::is_reduce(in.op)) continue;
    if (in.op == kir::OpCode::Load) {
      outer_[v] = load(static_cast<int32_t>(v), idx, lanes);
    } else if (in.op == kir::OpCode::Const) {
      outer_[v] = ops_.launch_consts[v] ? launch_constant(static_cast<int32_t>(v), lanes) : ops_.constant(in, lanes);
    } else {
      std::vector<Value*> args;
      for (int32_t a : in.args) {
        Value* x = outer_[static_cast<size_t>(a)];
        TORCH_INTERNAL_ASSERT(x, "cpu_llvm: operand %", a, " of outer-level %", v, " not computed");
        args.push_back(ValueEmitter::lanes_of(x) < lanes ? ops_.splat(x, lanes) : x);
      }
      outer_[v] = ops_.op(k_, in, args);
    }
  }
}

// All passes for one outer index (outer_lanes == 1) or vf adjacent ones (ReduceOuter).
void Renderer::reduction_body(Index& idx, int outer_lanes) {
  outer_.assign(k_.instrs.size(), nullptr);
  materialize_outer(0, idx, outer_lanes);
  for (int q = 0; q < p_.num_passes; ++q) {
    reduce_pass(q, idx, outer_lanes);
    materialize_outer(q + 1, idx, outer_lanes);
  }
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    const size_t v = static_cast<size_t>(k_.stores[s].value);
    if (!kir::per_element(k_, k_.stores[s], p_.elem)) store(s, outer_[v], idx, outer_lanes);
  }
}

// The Reduces finished by pass q and its element-level Stores, with initialised
// accumulators (allocas that SROA turns into registers): `unroll` of acc_lanes each per
// Reduce, plus a scalar one for the tail of a vectorised innermost reduce dim.
Renderer::Pass Renderer::make_pass(int q, int outer_lanes) {
  Pass ps;
  for (size_t v = 0; v < k_.instrs.size(); ++v) {
    const kir::Instr& in = k_.instrs[v];
    if (kir::is_reduce(in.op) && p_.level[static_cast<size_t>(in.args[0])] == q) ps.reds.push_back(static_cast<int32_t>(v));
  }
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    const size_t v = static_cast<size_t>(k_.stores[s].value);
    if (kir::per_element(k_, k_.stores[s], p_.elem) && p_.level[v] == q) ps.stores.push_back(s);
  }
  ps.inner_vec = p_.mode == LoopMode::ReduceInner && p_.vf > 1;
  ps.prefetch = p_.prefetch_next_row && q == 1 && ps.inner_vec;
  // Extra accumulators only pay off for reductions; a store-only pass (softmax's last)
  // stays one vector per iteration, which keeps the code (and compile time) small.
  ps.unroll = ps.inner_vec && !ps.reds.empty() ? p_.unroll : 1;
  const int acc_lanes = ps.inner_vec ? p_.vf : outer_lanes;
  ps.accs.resize(ps.reds.size());
  for (size_t r = 0; r < ps.reds.size(); ++r) {
    const kir::Instr& in = k_.instrs[static_cast<size_t>(ps.reds[r])];
    auto slot = [&](int lanes) {
      Value* init = ops_.reduce_identity(in.op, in.dtype, lanes);
      llvm::AllocaInst* a = entry_alloca(init->getType());
      b_.CreateStore(init, a);
      return a;
    };
    for (int u = 0; u < ps.unroll; ++u) ps.accs[r].vec.push_back(slot(acc_lanes));
    if (ps.inner_vec) ps.accs[r].scalar = slot(1);
  }
  return ps;
}

// One block of a pass: accumulates every Reduce (into vector accumulator u, or the scalar
// one when u < 0) and writes the pass's element-level Stores.
void Renderer::pass_block(const Pass& ps, const Index& idx, int lanes, int u) {
  Block blk{&idx, lanes, std::vector<Value*>(k_.instrs.size(), nullptr)};
  if (ps.prefetch && lanes > 1) prefetch_next_row(idx);
  for (size_t r = 0; r < ps.reds.size(); ++r) {
    const kir::Instr& in = k_.instrs[static_cast<size_t>(ps.reds[r])];
    llvm::AllocaInst* slot = u >= 0 ? ps.accs[r].vec[static_cast<size_t>(u)] : ps.accs[r].scalar;
    Value* x = ops_.to_compute(value(blk, in.args[0]), in.dtype);
    if (mask_ && lanes > 1) x = b_.CreateSelect(mask_, x, ops_.reduce_identity(in.op, in.dtype, lanes));
    Value* acc = b_.CreateLoad(slot->getAllocatedType(), slot);
    b_.CreateStore(ops_.reduce_combine(in.op, in.dtype, acc, x), slot);
  }
  for (size_t s : ps.stores) store(s, value(blk, k_.stores[s].value), idx, lanes);
}

// Note [Prefetching the next row]
// A ReduceInner kernel with several passes (softmax: the maximum, the sum of exponentials,
// the stores) reads each row from memory in its first pass and from the cache in the
// others, so a thread alternates between waiting for memory and computing. Where its rows
// fit the cache, two at a time (PlanOptions::prefetch_row_bytes) and the kernel reads
// more than the caches hold (prefetch_min_bytes), the second pass prefetches, with each
// vector, the same elements of the next row for every contiguous load that moves with the
// row (the address plus the innermost outer dim's stride; at a chunk's last row, or the end
// of an outer dim, the line fetched is one nobody reads, and a prefetch never faults).
// The next row's first pass then reads the cache while this row computes. Values are
// unchanged.
void Renderer::prefetch_next_row(const Index& idx) {
  const size_t row = static_cast<size_t>(p_.num_outer - 1), lane = static_cast<size_t>(p_.lane_dim);
  llvm::Function* fetch = llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::prefetch, {b_.getPtrTy()});
  for (size_t v = 0; v < k_.instrs.size(); ++v) {
    const kir::Instr& in = k_.instrs[v];
    if (in.op != kir::OpCode::Load || !p_.elem[v]) continue;
    const Access& a = p_.loads[v];
    if (a.strides[lane] != 1 || a.strides[row] == 0) continue;
    const int32_t slot = slots_.load[v];
    Value* next = b_.CreateAdd(offset(a, slot, idx), num(slot + 1 + static_cast<int32_t>(row), a.strides[row]));
    llvm::Type* mt = ops_.memory_type(in.dtype);
    b_.CreateCall(fetch, {b_.CreateGEP(mt, bufs_[static_cast<size_t>(in.buffer)], next), b_.getInt32(0), b_.getInt32(3),
                          b_.getInt32(1)});
  }
}

// The loop over reduce dim d and the dims inside it.
void Renderer::pass_loops(const Pass& ps, Index& idx, int d, int outer_lanes) {
  Value* n = size(d);
  auto bind = [&](Value* iv) { idx.iv[static_cast<size_t>(d)] = iv; };
  if (d < p_.rank() - 1) {
    loop(i64(0), n, 1, [&](Value* iv) { bind(iv); pass_loops(ps, idx, d + 1, outer_lanes); }, Unroll::Off);
    return;
  }
  // A pass that accumulates carries its sums from one iteration to the next (unrolled
  // here, into independent accumulators, where the sums may be reassociated); one that only
  // stores is a pointwise loop.
  const Unroll main = ps.reds.empty() ? Unroll::Allow : Unroll::Off;
  if (!ps.inner_vec) {
    loop(i64(0), n, 1, [&](Value* iv) { bind(iv); pass_block(ps, idx, outer_lanes, 0); }, main);
    return;
  }
  const int64_t vf = p_.vf;
  const int64_t step = ps.unroll * vf;
  Value* j = loop(
      i64(0), b_.CreateSub(n, i64(step - 1)), step,
      [&](Value* iv) {
        for (int u = 0; u < ps.unroll; ++u) {
          bind(u == 0 ? iv : b_.CreateAdd(iv, i64(u * vf), "", true, true));
          pass_block(ps, idx, static_cast<int>(vf), u);
        }
      },
      main);
  if (ps.unroll > 1) {
    j = loop(
        j, b_.CreateSub(n, i64(vf - 1)), vf, [&](Value* iv) { bind(iv); pass_block(ps, idx, static_cast<int>(vf), 0); },
        Unroll::Off);
  }
  if (masked_tails()) {  // Note [Masked tails] (render.cpp)
    masked_tail(b_.CreateSub(n, j), static_cast<int>(vf), [&] {
      bind(j);
      pass_block(ps, idx, static_cast<int>(vf), 0);
    });
    return;
  }
  loop(j, n, 1, [&](Value* iv) { bind(iv); pass_block(ps, idx, 1, -1); }, Unroll::Off);
}

void Renderer::reduce_pass(int q, Index& idx, int outer_lanes) {
  const Pass ps = make_pass(q, outer_lanes);
  if (!ps.reds.empty() || !ps.stores.empty()) pass_loops(ps, idx, p_.num_outer, outer_lanes);
  for (int d = p_.num_outer; d < p_.rank(); ++d) idx.iv[static_cast<size_t>(d)] = nullptr;
  // Finish the Reduces: combine the accumulators in order, reduce horizontally, add the tail.
  auto ld = [&](llvm::AllocaInst* a) { return b_.CreateLoad(a->getAllocatedType(), a); };
  for (size_t r = 0; r < ps.reds.size(); ++r) {
    const kir::Instr& in = k_.instrs[static_cast<size_t>(ps.reds[r])];
    Value* acc = ld(ps.accs[r].vec[0]);
    for (int u = 1; u < ps.unroll; ++u) {
      acc = ops_.reduce_combine(in.op, in.dtype, acc, ld(ps.accs[r].vec[static_cast<size_t>(u)]));
    }
    if (ps.inner_vec) {
      acc = ops_.reduce_combine(in.op, in.dtype, ops_.reduce_horizontal(in.op, in.dtype, acc), ld(ps.accs[r].scalar));
    }
    outer_[static_cast<size_t>(ps.reds[r])] = ops_.from_compute(acc, in.dtype);
  }
}

}  // namespace tcap::codegen::cpu_llvm::render_detail
