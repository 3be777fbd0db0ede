// CpuJit: the process-wide LLVM state of the cpu_llvm backend: the host target machine,
// the O3 pipeline, object emission, and one ORC LLJIT that links kernel object files.
// LLVM-free interface (the LLVM objects live in jit.cpp).
#pragma once

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "codegen/cpu_llvm/plan.h"

#include <memory>
#include <string>

namespace tcap::codegen::cpu_llvm {

struct CompiledKernel {
  std::string object;  // ELF relocatable object holding the kernel's symbol
  std::string ir;      // optimised LLVM IR text
};

class CpuJit {
 public:
  // The JIT, created on first use; nullptr (and *why set) when LLVM cannot target the
  // host. Every member is thread-safe: compile() uses a context and a TargetMachine of the
  // calling thread, load() takes a lock (Note [Parallel kernel compilation]).
  static CpuJit* get(std::string* why);

  // Host target with the testing override of the vector width applied.
  TargetInfo target() const;
  // Everything about the target that changes machine code (cache key part).
  std::string target_key() const;
  // False while a testing override asks for vectors wider than the host runs.
  bool target_runnable() const;

  // Renders `k` as `symbol`, runs the O3 pipeline and (with want_object) emits an object.
  CompiledKernel compile(const kir::Kernel& k, const KernelPlan& plan, const std::string& symbol, bool want_object);
  // Links an object into a fresh JITDylib and returns the address of `symbol`. Throws
  // c10::Error when the object does not link or lacks the symbol.
  CpuKernel::Fn load(const std::string& symbol, const std::string& object);

  struct Impl;

 private:
  explicit CpuJit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// See testing.h.
void set_vector_bits_override(int bits);

}  // namespace tcap::codegen::cpu_llvm
