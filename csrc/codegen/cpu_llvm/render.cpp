// Note [CPU loop nests]
// A kernel is one function  void fn(ptr args, i64 begin, i64 end)  over the plan's
// coalesced dims (plan.cpp). Values are computed in "blocks": one evaluation of the
// instructions for L lanes (L = vf or 1) that walk plan.lane_dim from a bound index.
//
//   Pointwise    [begin, end) are row-major elements. The range is walked row by row over
//                the innermost dim: per row, a vf-wide body while vf elements remain,
//                then a scalar tail. Accesses with lane stride 1 are vector loads/stores,
//                0 a scalar load + splat (a store writes the last lane), any other
//                stride a gather/scatter.
//   ReduceInner  for each outer index o in [begin, end): the outer-level values of
//                level 0 (Loads with zero reduce strides, Consts and what is computed
//                from them) are computed once; then pass q = 0 .. passes-1 loops over the
//                reduce dims (nested, outermost first), the innermost one vectorised with
//                `unroll` independent vector accumulators per Reduce, then a one-vector
//                loop and a scalar tail; element-level values are recomputed in every
//                pass that needs them. After pass q the Reduces of level q+1 are
//                finished (accumulators combined, horizontally reduced) and the outer
//                values of level q+1 computed. Outer-level Stores come after the last
//                pass.
//   ReduceOuter  the same passes for unroll*vf (then vf, then 1) adjacent outer indices
//                at once (lanes walk the innermost outer dim, rows walked as in
//                Pointwise): used when the innermost reduce dim is strided (sum over dim 0
//                of a row-major matrix), so every load is a contiguous vector (LLVM splits
//                the unroll*vf-wide vectors into registers) and no horizontal reduce is
//                needed.
//
// Note [Streaming stores]
// A kernel that writes more than the last-level cache holds (a 64 MiB log_softmax of
// [4096, 4096] logits) gains nothing from keeping its output lines in the cache: they are
// evicted before anything reads them. An ordinary store first reads each line it writes
// (read-for-ownership), so such a kernel moves 1.5x the bytes it must; a streaming
// (non-temporal) store writes whole lines without reading them. The plan marks the stores
// that stream (plan.cpp: a whole vector per store, a buffer the kernel does not read, at
// least PlanOptions::stream_bytes written, sizes built into the code; x86 only), and
// each vector store of one tests its address: aligned to the vector's size it streams
// (vmovntps needs it), else it is an ordinary store (a row that starts mid-vector, a
// chunk of at::parallel_for that does). Tails store normally (masked or scalar). The chunk ends with
// an sfence, since streaming stores are weakly ordered. Values are the same bits either
// way. Measured here (2 threads): reading 64 MiB and writing 64 MiB takes 2.3 ms with
// streaming stores against 2.8 ms with ordinary ones.
//
// Note [CPU summation order]
// Sums are reassociated relative to ATen (tests use tolerances). ReduceInner: lane l of
// accumulator u sums the elements j = u*vf + l (mod unroll*vf) of the main loop (the
// one-vector loop and the masked tail add into accumulator 0, the masked lanes adding the
// identity: Note [Masked tails]; with TCAP_MASKED_TAILS=0 the tail goes element by element
// into a scalar accumulator); outer reduce dims keep adding into the same accumulators.
// At the end the accumulators are added pairwise in order (0+1+2+3), reduced horizontally
// with a reassociating llvm.vector.reduce.fadd (a shuffle tree), and the scalar tail sum
// (0 with masked tails) added last.
// ReduceOuter and scalar kernels sum each outer index sequentially in domain order.
// Max/Min are exact in any order (NaN propagates through llvm.maximum and
// llvm.vector.reduce.fmaximum).
#include "codegen/cpu_llvm/render.h"

#include "codegen/cpu_llvm/renderer.h"

#include <c10/util/Exception.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <functional>

namespace tcap::codegen::cpu_llvm {

namespace render_detail {

// for (iv = start; iv < limit; iv += step) body(iv); returns iv's value after the loop.
// Note [Which loops LLVM unrolls]
// The loop after a vector loop runs fewer than vf iterations (after an unrolled one, fewer
// than `unroll`), and LLVM cannot know it: its runtime unroller gives each such remainder a
// prologue and an 8-way body. A loop over rows or outer dims, once its inner remainders
// are small, it unrolls by two, copying every loop inside. Neither is faster at run time
// (the vector loops do the work; a row loop's body is a whole row), and both cost Loop
// Strength Reduction and instruction selection most of a small kernel's compile: an
// elementwise multiply took 11.6 ms of LLVM time, 6.2 ms without them; the 16 kernels of
// an encoder layer 197 ms, 133 ms without (each compiled alone from the same IR, the
// bench's kernel dumps). A reduction's loop gains nothing either: its sums carry a
// dependency from one iteration to the next that unrolling does not break (the renderer
// unrolls into independent accumulators itself where it may reassociate). So remainder
// loops, loops that hold loops and loops that accumulate carry llvm.loop.unroll.disable;
// the pointwise main loops (a vector body, a scalar kernel's element loop, a reduction
// pass that only stores) are left to the unroller.
Value* Renderer::loop(Value* start, Value* limit, int64_t step, const std::function<void(Value*)>& body,
                      Unroll unroll) {
  auto& ctx = m_.getContext();
  llvm::BasicBlock* pre = b_.GetInsertBlock();
  auto* head = llvm::BasicBlock::Create(ctx, "loop", fn_);
  auto* body_bb = llvm::BasicBlock::Create(ctx, "body", fn_);
  auto* exit = llvm::BasicBlock::Create(ctx, "after", fn_);
  b_.CreateBr(head);
  b_.SetInsertPoint(head);
  llvm::PHINode* iv = b_.CreatePHI(b_.getInt64Ty(), 2, "i");
  iv->addIncoming(start, pre);
  b_.CreateCondBr(b_.CreateICmpSLT(iv, limit), body_bb, exit);
  b_.SetInsertPoint(body_bb);
  body(iv);
  Value* next = b_.CreateAdd(iv, i64(step), "", /*HasNUW=*/true, /*HasNSW=*/true);
  iv->addIncoming(next, b_.GetInsertBlock());
  llvm::BranchInst* latch = b_.CreateBr(head);
  if (unroll == Unroll::Off) {
    llvm::MDNode* off = llvm::MDNode::get(ctx, llvm::MDString::get(ctx, "llvm.loop.unroll.disable"));
    llvm::MDNode* id = llvm::MDNode::getDistinct(ctx, {nullptr, off});
    id->replaceOperandWith(0, id);  // a loop id names itself
    latch->setMetadata(llvm::LLVMContext::MD_loop, id);
  }
  b_.SetInsertPoint(exit);
  return iv;
}

// Row-major decomposition of `linear` over plan dims [d0, d1).
void Renderer::decompose(Value* linear, int d0, int d1, Index& idx) {
  Value* rest = linear;
  for (int d = d1 - 1; d >= d0; --d) {
    if (d == d0) {
      idx.iv[static_cast<size_t>(d)] = rest;
    } else {
      idx.iv[static_cast<size_t>(d)] = b_.CreateURem(rest, size(d));
      rest = b_.CreateUDiv(rest, size(d));
    }
  }
}

// Walks [begin, end) of the row-major dims [0, nd) row by row over dim nd-1, binding
// idx for dims [0, nd) and calling run(unroll * vf) per wide block (ReduceOuter), then
// run(vf) per vector block, then run(1) per tail element.
void Renderer::walk_rows(int nd, Index& idx, const std::function<void(int lanes)>& run) {
  const int last = nd - 1;
  const int vf = p_.lane_dim == last ? p_.vf : 1;
  const int wide = p_.mode == LoopMode::ReduceOuter ? vf * p_.unroll : vf;
  auto inner = [&](Value* j0, Value* j1) {
    Value* j = j0;
    if (wide > vf) {
      j = loop(j, b_.CreateSub(j1, i64(wide - 1)), wide, [&](Value* iv) {
        idx.iv[static_cast<size_t>(last)] = iv;
        run(wide);
      });
    }
    if (vf > 1) {
      j = loop(
          j, b_.CreateSub(j1, i64(vf - 1)), vf,
          [&](Value* iv) {
            idx.iv[static_cast<size_t>(last)] = iv;
            run(vf);
          },
          wide > vf ? Unroll::Off : Unroll::Allow);
    }
    if (vf > 1 && p_.mode == LoopMode::Pointwise && masked_tails()) {
      masked_tail(b_.CreateSub(j1, j), vf, [&] {
        idx.iv[static_cast<size_t>(last)] = j;
        run(vf);
      });
      return;
    }
    loop(
        j, j1, 1,
        [&](Value* iv) {
          idx.iv[static_cast<size_t>(last)] = iv;
          run(1);
        },
        vf > 1 ? Unroll::Off : Unroll::Allow);
  };
  if (nd == 1) {
    inner(begin_, end_);
    return;
  }
  Value* n = size(last);
  Value* r0 = b_.CreateUDiv(begin_, n);
  Value* r1 = b_.CreateAdd(b_.CreateUDiv(b_.CreateSub(end_, i64(1)), n), i64(1));
  loop(
      r0, r1, 1,
      [&](Value* r) {
        Value* rs = b_.CreateMul(r, n);
        Value* j0 = b_.CreateSelect(b_.CreateICmpSGT(begin_, rs), b_.CreateSub(begin_, rs), i64(0));
        Value* rem = b_.CreateSub(end_, rs);
        Value* j1 = b_.CreateSelect(b_.CreateICmpSLT(rem, n), rem, n);
        decompose(r, 0, last, idx);
        inner(j0, j1);
      },
      Unroll::Off);
}

// Note [Masked tails]
// A vectorised loop leaves a tail of fewer than vf elements per row (a softmax over 126
// columns with 16 lanes: 14). Run element by element, each costs what a vector does (its
// index arithmetic, a scalar exp through the math library), so a kernel whose rows are
// not a multiple of the lanes ran several times slower than ATen's (the attention softmax
// of a decoder at most lengths: 10x). The tail is one vector block instead, its lanes past
// the row's end masked: loads are masked (those lanes read nothing and compute on zeros,
// whose results are discarded), stores and scatters are masked, a store every lane makes
// to one element takes the last active lane's value, and a Reduce adds its identity for
// masked lanes into its first vector accumulator. A masked lane's zeros trap nowhere: an
// integer division by zero gives 0 in kernels (ValueEmitter::int_div), a float one an
// infinity, and a conversion of one to an integer a poison value in that lane only, which
// no store writes and no Reduce reads. Pointwise kernels and the passes of a ReduceInner
// kernel; a ReduceOuter kernel's tail of outer indices stays scalar. The values are those
// of the scalar tail except the order of a tail's sums (Note [CPU summation order]).
bool Renderer::masked_tails() const { return masked_tails_on(); }

void Renderer::masked_tail(Value* count, int vf, const std::function<void()>& body) {
  auto& ctx = m_.getContext();
  auto* tail = llvm::BasicBlock::Create(ctx, "masked_tail", fn_);
  auto* after = llvm::BasicBlock::Create(ctx, "after_tail", fn_);
  b_.CreateCondBr(b_.CreateICmpSGT(count, i64(0)), tail, after);
  b_.SetInsertPoint(tail);
  std::vector<llvm::Constant*> lanes;
  for (int l = 0; l < vf; ++l) lanes.push_back(b_.getInt64(static_cast<uint64_t>(l)));
  mask_ = b_.CreateICmpSLT(llvm::ConstantVector::get(lanes), ops_.splat(count, vf), "tail_mask");
  mask_count_ = count;
  body();
  mask_ = nullptr;
  mask_count_ = nullptr;
  b_.CreateBr(after);
  b_.SetInsertPoint(after);
}

llvm::AllocaInst* Renderer::entry_alloca(llvm::Type* t) {
  llvm::BasicBlock& entry = fn_->getEntryBlock();
  llvm::IRBuilder<> tmp(&entry, entry.begin());
  return tmp.CreateAlloca(t);
}

Value* Renderer::num(int32_t slot, int64_t literal) {
  const size_t s = static_cast<size_t>(slot);
  if (s >= p_.at_launch.size() || !p_.at_launch[s]) return i64(literal);
  if (!launch_values_[s]) {
    llvm::BasicBlock& entry = fn_->getEntryBlock();
    TORCH_INTERNAL_ASSERT(entry.getTerminator(), "cpu_llvm: a number read before the entry block is complete");
    llvm::IRBuilder<> tmp(entry.getTerminator());
    Value* at = tmp.CreateConstInBoundsGEP1_64(b_.getInt64Ty(), numbers_, s);
    launch_values_[s] = tmp.CreateAlignedLoad(b_.getInt64Ty(), at, llvm::Align(8), "n" + std::to_string(s));
  }
  return launch_values_[s];
}

// The lane offsets <0, s, 2s, ...> of a gather or scatter with stride s (slot stride_slot).
Value* Renderer::lane_steps(int32_t stride_slot, int64_t stride, int lanes) {
  std::vector<llvm::Constant*> steps;
  for (int l = 0; l < lanes; ++l) steps.push_back(b_.getInt64(static_cast<uint64_t>(l)));
  Value* iota = llvm::ConstantVector::get(steps);
  return b_.CreateMul(ops_.splat(num(stride_slot, stride), lanes), iota);
}

// A Const whose value the launch gives (Note [Sizes at launch]): its double bits, rounded
// to the instruction's dtype as ValueEmitter::constant rounds a literal.
Value* Renderer::launch_constant(int32_t v, int lanes) {
  const kir::Instr& in = k_.instrs[static_cast<size_t>(v)];
  Value* x = b_.CreateBitCast(num(slots_.value[static_cast<size_t>(v)], 0), b_.getDoubleTy());
  if (in.dtype == kir::DType::F32) x = b_.CreateFPTrunc(x, b_.getFloatTy());
  return ops_.splat(x, lanes);
}

// offset + sum_d iv[d] * stride[d], outer dims first so LICM can hoist the invariant part.
// `slot`: the access's first number slot (its offset; the strides follow).
Value* Renderer::offset(const Access& a, int32_t slot, const Index& idx) {
  Value* off = num(slot, a.offset);
  for (size_t d = 0; d < a.strides.size(); ++d) {
    const int64_t s = a.strides[d];
    if (s == 0) continue;
    TORCH_INTERNAL_ASSERT(idx.iv[d], "cpu_llvm: access with a stride on an unbound dim");
    Value* term = s == 1 ? idx.iv[d] : b_.CreateMul(idx.iv[d], num(slot + 1 + static_cast<int32_t>(d), s), "", false, true);
    off = b_.CreateAdd(off, term, "", false, true);
  }
  return off;
}

Value* Renderer::load(int32_t v, const Index& idx, int lanes) {
  const kir::Instr& in = k_.instrs[static_cast<size_t>(v)];
  const Access& a = p_.loads[static_cast<size_t>(v)];
  llvm::Type* mt = ops_.memory_type(in.dtype);
  const llvm::Align align(static_cast<uint64_t>(kir::dtype_size(in.dtype)));
  Value* base = bufs_[static_cast<size_t>(in.buffer)];
  const int32_t slot = slots_.load[static_cast<size_t>(v)];
  Value* off = offset(a, slot, idx);
  const int64_t s = lanes > 1 ? a.strides[static_cast<size_t>(p_.lane_dim)] : 0;
  if (s == 0) {
    Value* x = ops_.from_memory(b_.CreateAlignedLoad(mt, b_.CreateGEP(mt, base, off), align), in.dtype);
    return ops_.splat(x, lanes);
  }
  llvm::Type* vt = ops_.vector_type(mt, lanes);
  Value* x = nullptr;
  Value* none = llvm::Constant::getNullValue(vt);  // what a masked lane reads (Note [Masked tails])
  if (s == 1) {
    Value* at = b_.CreateGEP(mt, base, off);
    if (mask_) x = b_.CreateMaskedLoad(vt, at, align, mask_, none);
    else x = b_.CreateAlignedLoad(vt, at, align);
  } else {
    Value* offs = b_.CreateAdd(ops_.splat(off, lanes), lane_steps(slot + 1 + p_.lane_dim, s, lanes));
    x = b_.CreateMaskedGather(vt, b_.CreateGEP(mt, base, offs), align, mask_, mask_ ? none : nullptr);
  }
  return ops_.from_memory(x, in.dtype);
}

void Renderer::store(size_t si, Value* x, const Index& idx, int lanes) {
  const kir::Store& st = k_.stores[si];
  const Access& a = p_.stores[si];
  const kir::DType dt = k_.buffers[static_cast<size_t>(st.buffer)].dtype;
  llvm::Type* mt = ops_.memory_type(dt);
  const llvm::Align align(static_cast<uint64_t>(kir::dtype_size(dt)));
  Value* base = bufs_[static_cast<size_t>(st.buffer)];
  if (ValueEmitter::lanes_of(x) < lanes) x = ops_.splat(x, lanes);
  x = ops_.to_memory(x, dt);
  const int32_t slot = slots_.store[si];
  Value* off = offset(a, slot, idx);
  const int64_t s = lanes > 1 ? a.strides[static_cast<size_t>(p_.lane_dim)] : 0;
  if (lanes == 1) {
    b_.CreateAlignedStore(x, b_.CreateGEP(mt, base, off), align);
  } else if (mask_) {  // Note [Masked tails]
    if (s == 0) {
      Value* last = b_.CreateExtractElement(x, b_.CreateSub(mask_count_, i64(1)));
      b_.CreateAlignedStore(last, b_.CreateGEP(mt, base, off), align);
    } else if (s == 1) {
      b_.CreateMaskedStore(x, b_.CreateGEP(mt, base, off), align, mask_);
    } else {
      Value* offs = b_.CreateAdd(ops_.splat(off, lanes), lane_steps(slot + 1 + p_.lane_dim, s, lanes));
      b_.CreateMaskedScatter(x, b_.CreateGEP(mt, base, offs), align, mask_);
    }
  } else if (s == 0) {
    // Every lane writes the same element: the last one wins, as in sequential order.
    b_.CreateAlignedStore(b_.CreateExtractElement(x, static_cast<uint64_t>(lanes - 1)), b_.CreateGEP(mt, base, off),
                          align);
  } else if (s == 1 && p_.stream[si]) {
    // Note [Streaming stores]: non-temporal where the vector's address is aligned to its
    // size (x86's streaming stores need it), an ordinary store otherwise.
    Value* at = b_.CreateGEP(mt, base, off);
    const uint64_t bytes = static_cast<uint64_t>(lanes * kir::dtype_size(dt));
    Value* aligned = b_.CreateICmpEQ(b_.CreateAnd(b_.CreatePtrToInt(at, b_.getInt64Ty()), i64(static_cast<int64_t>(bytes) - 1)),
                                     i64(0));
    auto& ctx = m_.getContext();
    auto* nt = llvm::BasicBlock::Create(ctx, "stream", fn_);
    auto* plain = llvm::BasicBlock::Create(ctx, "store", fn_);
    auto* next = llvm::BasicBlock::Create(ctx, "stored", fn_);
    b_.CreateCondBr(aligned, nt, plain, llvm::MDBuilder(ctx).createLikelyBranchWeights());
    b_.SetInsertPoint(nt);
    llvm::StoreInst* w = b_.CreateAlignedStore(x, at, llvm::Align(bytes));
    w->setMetadata(llvm::LLVMContext::MD_nontemporal,
                   llvm::MDNode::get(ctx, llvm::ConstantAsMetadata::get(b_.getInt32(1))));
    b_.CreateBr(next);
    b_.SetInsertPoint(plain);
    b_.CreateAlignedStore(x, at, align);
    b_.CreateBr(next);
    b_.SetInsertPoint(next);
  } else if (s == 1) {
    b_.CreateAlignedStore(x, b_.CreateGEP(mt, base, off), align);
  } else {
    Value* offs = b_.CreateAdd(ops_.splat(off, lanes), lane_steps(slot + 1 + p_.lane_dim, s, lanes));
    b_.CreateMaskedScatter(x, b_.CreateGEP(mt, base, offs), align);
  }
}

// The value of instruction v in a block; element-level values are computed here,
// outer-level ones (reductions) come from outer_ and are splat to the block's lanes.
Value* Renderer::value(Block& blk, int32_t v) {
  const size_t vi = static_cast<size_t>(v);
  if (blk.vals[vi]) return blk.vals[vi];
  Value* r = nullptr;
  const kir::Instr& in = k_.instrs[vi];
  if (p_.is_reduction() && !p_.elem[vi]) {
    r = outer_[vi];
    TORCH_INTERNAL_ASSERT(r, "cpu_llvm: outer-level %", v, " used before it is computed");
    if (ValueEmitter::lanes_of(r) < blk.lanes) r = ops_.splat(r, blk.lanes);
  } else if (in.op == kir::OpCode::Load) {
    r = load(v, *blk.idx, blk.lanes);
  } else if (in.op == kir::OpCode::Const) {
    r = ops_.launch_consts[vi] ? launch_constant(v, blk.lanes) : ops_.constant(in, blk.lanes);
  } else {
    std::vector<Value*> args;
    for (int32_t a : in.args) args.push_back(value(blk, a));
    r = ops_.op(k_, in, args);
  }
  blk.vals[vi] = r;
  return r;
}

void Renderer::pointwise_block(const Index& idx, int lanes) {
  Block blk{&idx, lanes, std::vector<Value*>(k_.instrs.size(), nullptr)};
  for (size_t s = 0; s < k_.stores.size(); ++s) store(s, value(blk, k_.stores[s].value), idx, lanes);
}

llvm::Function* Renderer::render(const std::string& symbol) {
  auto& ctx = m_.getContext();
  llvm::Type* ptr = b_.getPtrTy();
  auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, b_.getInt64Ty(), b_.getInt64Ty(), ptr}, false);
  fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, symbol, m_);
  fn_->addFnAttr(llvm::Attribute::NoUnwind);
  fn_->addFnAttr("target-cpu", t_.cpu);
  fn_->addFnAttr("target-features", t_.features);
  // 512-bit vectors stay legal (and are passed to libmvec in zmm registers) even on
  // CPUs whose tuning prefers 256-bit vectors. See Note [CPU math library].
  fn_->addFnAttr("min-legal-vector-width", std::to_string(t_.vector_bits));
  fn_->addFnAttr("prefer-vector-width", std::to_string(t_.vector_bits));
  fn_->addParamAttr(0, llvm::Attribute::NoAlias);
  llvm_compat::set_no_capture(*fn_, 0);
  fn_->addParamAttr(0, llvm::Attribute::ReadOnly);
  fn_->getArg(0)->setName("args");
  begin_ = fn_->getArg(1);
  end_ = fn_->getArg(2);
  begin_->setName("begin");
  end_->setName("end");
  numbers_ = fn_->getArg(3);
  numbers_->setName("numbers");
  fn_->addParamAttr(3, llvm::Attribute::NoAlias);
  llvm_compat::set_no_capture(*fn_, 3);
  fn_->addParamAttr(3, llvm::Attribute::ReadOnly);

  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn_);
  auto* work = llvm::BasicBlock::Create(ctx, "work", fn_);
  auto* done = llvm::BasicBlock::Create(ctx, "done", fn_);
  b_.SetInsertPoint(entry);
  for (size_t i = 0; i < k_.buffers.size(); ++i) {
    Value* slot = b_.CreateConstInBoundsGEP1_64(ptr, fn_->getArg(0), i);
    bufs_.push_back(b_.CreateAlignedLoad(ptr, slot, llvm::Align(8), "buf" + std::to_string(i)));
  }
  b_.CreateCondBr(b_.CreateICmpSLT(begin_, end_), work, done);
  b_.SetInsertPoint(work);
  // Code that reads its sizes at launch serves every size (an empty domain never runs).
  if (k_.parallel_range() > 0 || !p_.at_launch.empty()) {
    Index idx{std::vector<Value*>(p_.sizes.size(), nullptr)};
    switch (p_.mode) {
      case LoopMode::Pointwise:
        walk_rows(p_.rank(), idx, [&](int lanes) { pointwise_block(idx, lanes); });
        break;
      case LoopMode::ReduceOuter:
        walk_rows(p_.num_outer, idx, [&](int lanes) { reduction_body(idx, lanes); });
        break;
      case LoopMode::ReduceInner:
        loop(
            begin_, end_, 1,
            [&](Value* o) {
              decompose(o, 0, p_.num_outer, idx);
              reduction_body(idx, 1);
            },
            Unroll::Off);
        break;
    }
  }
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
  // Streaming stores are weakly ordered: fenced before the chunk returns, so that the
  // threads that read the results after at::parallel_for's join see them.
  if (std::find(p_.stream.begin(), p_.stream.end(), true) != p_.stream.end()) {
    b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::x86_sse_sfence));
  }
  b_.CreateRetVoid();

  std::string err;
  llvm::raw_string_ostream os(err);
  TORCH_INTERNAL_ASSERT(!llvm::verifyFunction(*fn_, &os), "cpu_llvm: rendered invalid IR for kernel ", k_.name, ": ",
                        os.str(), "\n", kir::to_string(k_));
  return fn_;
}

}  // namespace render_detail

llvm::Function* render_kernel(const kir::Kernel& k, const KernelPlan& plan, const TargetInfo& t, llvm::Module& m,
                              const std::string& symbol) {
  return render_detail::Renderer(k, plan, t, m).render(symbol);
}

}  // namespace tcap::codegen::cpu_llvm
