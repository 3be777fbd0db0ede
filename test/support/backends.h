// Which code generators this build has. tcap builds without LLVM (a machine with only
// CUDA, say): there a test that compiles with the llvm backend is skipped with the reason
// rather than failing on the clear error the backend gives (which its own tests check).
#pragma once

#include "codegen/cpu_llvm/cpu_llvm.h"

#include <gtest/gtest.h>

#include <string>

namespace tcap::testing {

// Whether `backend` can compile here; `why` gets the reason when not.
inline bool backend_built(const std::string& backend, std::string* why) {
  if (backend == "llvm") return codegen::cpu_llvm::cpu_llvm_available(why);
  return true;
}

}  // namespace tcap::testing

// Skips the calling test (returns from the calling function) when `backend` cannot compile here.
#define TCAP_SKIP_WITHOUT_BACKEND(backend)                                          \
  do {                                                                              \
    std::string tcap_skip_why_;                                                     \
    if (!::tcap::testing::backend_built((backend), &tcap_skip_why_))                \
      GTEST_SKIP() << "backend '" << (backend) << "' is not built: " << tcap_skip_why_; \
  } while (0)
