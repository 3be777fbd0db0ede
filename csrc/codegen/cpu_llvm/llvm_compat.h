// The one place that knows which LLVM release tcap is built against (STYLE.md: one shim
// per outside API). Everything else in codegen/cpu_llvm/ calls these wrappers instead of
// testing LLVM_VERSION_MAJOR itself. Written against LLVM 19 (Debian's llvm-19-dev); the
// #if branches note the renames of later releases that we know of.
#pragma once

#include <llvm/Config/llvm-config.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/CodeGen.h>
#include <llvm/TargetParser/Triple.h>

#include <string>

#if LLVM_VERSION_MAJOR < 18
#error "tcap's cpu_llvm backend needs LLVM 18 or newer (built and tested with LLVM 19)"
#endif

namespace tcap::codegen::cpu_llvm::llvm_compat {

// "19.1.7": part of the kernel cache key.
inline std::string version_string() { return LLVM_VERSION_STRING; }

// "Does not capture" on a pointer argument: Attribute::NoCapture until LLVM 20, the
// captures(none) attribute from LLVM 21 on.
inline void set_no_capture(llvm::Function& f, unsigned arg) {
#if LLVM_VERSION_MAJOR >= 21
  f.addParamAttr(arg, llvm::Attribute::getWithCaptureInfo(f.getContext(), llvm::CaptureInfo::none()));
#else
  f.addParamAttr(arg, llvm::Attribute::NoCapture);
#endif
}

// Module::setTargetTriple takes a Triple from LLVM 21 on, a string before.
inline void set_target_triple(llvm::Module& m, const llvm::Triple& t) {
#if LLVM_VERSION_MAJOR >= 21
  m.setTargetTriple(t);
#else
  m.setTargetTriple(t.str());
#endif
}

// The enum-class spellings introduced in LLVM 18.
constexpr llvm::CodeGenFileType kObjectFile = llvm::CodeGenFileType::ObjectFile;
constexpr llvm::CodeGenOptLevel kCodeGenO3 = llvm::CodeGenOptLevel::Aggressive;

}  // namespace tcap::codegen::cpu_llvm::llvm_compat
