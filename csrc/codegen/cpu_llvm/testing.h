// Test hooks of the cpu_llvm backend (LLVM-free; not part of the public interface).
#pragma once

namespace tcap::codegen::cpu_llvm {

// Renders kernels for a vector width of `bits` instead of the host's (0 restores the
// host's): 128 exercises the SSE paths on an AVX2 machine, 32 makes every kernel scalar.
// The width is part of the cache key. A width wider than the host supports is only safe
// for cpu_kernel_llvm_ir (no code is run): 512 shows the AVX-512 IR on an AVX2 machine.
void cpu_llvm_set_vector_bits_for_testing(int bits);

}  // namespace tcap::codegen::cpu_llvm
