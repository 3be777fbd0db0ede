// render_kernel: kir::Kernel + KernelPlan -> one LLVM function
//   void <symbol>(ptr args, i64 begin, i64 end, ptr numbers)
// in `m` (see cpu_llvm.h for the calling convention and Note [CPU loop nests] in
// render.cpp for the loops). Precondition: `plan` was made for `k` and `t`
// (make_plan), so every instruction is supported. Postcondition: `m` verifies; the
// function is unoptimised (jit.cpp runs the O3 pipeline).
#pragma once

#include "codegen/cpu_llvm/plan.h"
#include "kir/kir.h"

#include <llvm/IR/Module.h>

#include <string>

namespace tcap::codegen::cpu_llvm {

llvm::Function* render_kernel(const kir::Kernel& k, const KernelPlan& plan, const TargetInfo& t, llvm::Module& m,
                              const std::string& symbol);

}  // namespace tcap::codegen::cpu_llvm
