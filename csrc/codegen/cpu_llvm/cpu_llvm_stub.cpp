// The cpu_llvm interface when tcap is built without LLVM (TCAP_WITH_LLVM=OFF or no
// llvm-19-dev at configure time): nothing is available, compiles throw.
#include "codegen/cpu_llvm/cpu_llvm.h"
#include "codegen/cpu_llvm/testing.h"

#include <c10/util/Exception.h>

namespace tcap::codegen::cpu_llvm {

namespace {
constexpr const char* kWhy = "tcap was built without LLVM (install llvm-19-dev and reconfigure)";
}  // namespace

bool cpu_llvm_available(std::string* why) {
  if (why) *why = kWhy;
  return false;
}

std::shared_ptr<const CpuKernel> compile_cpu_kernel(const kir::Kernel& k) {
  TORCH_CHECK(false, "tcap cpu_llvm: cannot compile kernel ", k.name, ": ", kWhy);
}

std::shared_ptr<const CpuKernel> find_cpu_kernel(const kir::Kernel& k) {
  TORCH_CHECK(false, "tcap cpu_llvm: cannot compile kernel ", k.name, ": ", kWhy);
}

std::string cpu_kernel_llvm_ir(const kir::Kernel& k) {
  TORCH_CHECK(false, "tcap cpu_llvm: cannot render kernel ", k.name, ": ", kWhy);
}

std::string cpu_target_description() { return std::string("unavailable: ") + kWhy; }

CpuLlvmStats cpu_llvm_stats() { return {}; }

void cpu_llvm_clear_memory_cache_for_testing() {}

void cpu_llvm_set_vector_bits_for_testing(int) {}

}  // namespace tcap::codegen::cpu_llvm
