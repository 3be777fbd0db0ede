// Note [Masked tails] (codegen/cpu_llvm/render.cpp): the last elements of a row that do not
// fill a vector run as one masked vector, in pointwise kernels and in the passes of row
// reductions. Checked end to end through tcap::compile with the llvm backend, at row
// lengths around every multiple of the vector width (1 to 2 vectors and a tail, odd and
// prime lengths), with sizes built in and read at launch, contiguous, broadcast, strided
// and in-place operands, against eager ATen and against the scalar tails
// (TCAP_MASKED_TAILS=0).
//
// Tolerances (float32): rtol 1e-5, atol 1e-6 for pointwise kernels (the same operations);
// 1e-4 / 1e-5 for reductions (the tail's lanes are summed in another order than ATen's).
#include <tcap/compile.h>

#include "support/compare.h"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

using Tensors = std::vector<at::Tensor>;
using tcap::testing::close;

namespace {

bool llvm_here() { return tcap::Backend("llvm").available(); }

// Sets TCAP_MASKED_TAILS for a scope.
struct MaskedTails {
  explicit MaskedTails(bool on) { ::setenv("TCAP_MASKED_TAILS", on ? "1" : "0", 1); }
  ~MaskedTails() { ::unsetenv("TCAP_MASKED_TAILS"); }
};

// Row lengths around the multiples of 16 lanes (float32 on AVX-512; 8 on AVX2: covered too).
const std::vector<int64_t> kLengths = {1, 2, 3, 7, 8, 9, 15, 16, 17, 23, 31, 33, 47, 63, 64, 65, 79, 126, 127};

struct Case {
  const char* name;
  std::function<Tensors(const Tensors&)> fn;
  std::function<Tensors(int64_t)> inputs;  // fresh inputs for row length n
  double rtol, atol;
};

std::vector<Case> cases() {
  return {
      {"pointwise", [](const Tensors& in) { return Tensors{torch::gelu(in[0]) * in[1] + 1}; },
       [](int64_t n) { return Tensors{torch::randn({5, n}), torch::randn({5, n})}; }, 1e-5, 1e-6},
      {"broadcast_row", [](const Tensors& in) { return Tensors{torch::exp(in[0]) - in[1]}; },
       [](int64_t n) { return Tensors{torch::randn({6, n}), torch::randn({n})}; }, 1e-5, 1e-6},
      {"strided_input", [](const Tensors& in) { return Tensors{torch::sigmoid(in[0] * 3)}; },
       [](int64_t n) { return Tensors{torch::randn({n, 4}).t()}; }, 1e-5, 1e-6},
      {"softmax_with_mask", [](const Tensors& in) { return Tensors{torch::softmax(in[0] + in[1], -1)}; },
       [](int64_t n) { return Tensors{torch::randn({4, 3, n}), torch::randn({3, n})}; }, 1e-4, 1e-5},
      {"softmax_with_causal_mask", [](const Tensors& in) { return Tensors{torch::softmax(in[0] + in[1], -1)}; },
       [](int64_t n) {
         return Tensors{torch::randn({2, n, n}),
                        torch::full({n, n}, -std::numeric_limits<float>::infinity()).triu(1)};
       },
       1e-4, 1e-5},
      {"log_softmax", [](const Tensors& in) { return Tensors{torch::log_softmax(in[0], -1)}; },
       [](int64_t n) { return Tensors{torch::randn({7, n}) * 4}; }, 1e-4, 1e-5},
      {"layer_norm", [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {in[0].size(-1)})}; },
       [](int64_t n) { return Tensors{torch::randn({6, n}) + 2}; }, 1e-4, 1e-4},
      {"row_max_and_sum", [](const Tensors& in) {
         return Tensors{std::get<0>(in[0].max(-1)), in[0].abs().sum(-1)};
       },
       [](int64_t n) { return Tensors{torch::randn({9, n})}; }, 1e-4, 1e-5},
      {"in_place_then_reduce", [](const Tensors& in) {
         at::Tensor y = in[0].clone();
         y.add_(in[1]);
         return Tensors{y, torch::softmax(y, -1)};
       },
       [](int64_t n) { return Tensors{torch::randn({4, n}), torch::randn({4, n})}; }, 1e-4, 1e-5},
      {"integer_division", [](const Tensors& in) { return Tensors{torch::div(in[0], in[1], "floor") + 1}; },
       [](int64_t n) {
         return Tensors{torch::randint(-50, 50, {3, n}, at::kLong), torch::randint(1, 7, {3, n}, at::kLong)};
       },
       0, 0},
  };
}

// Each case at every length, through one compiled function (static entries at the first
// lengths, a dynamic entry from the second: its kernels read their sizes at launch).
void check_every_length(bool masked) {
  MaskedTails setting(masked);
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(c.name) + (masked ? " masked" : " scalar tails"));
    tcap::CompileOptions o;
    o.name = std::string("tails_") + c.name;
    o.backend = "llvm";
    o.cache_size_limit = 64;
    auto f = tcap::compile(c.fn, o);
    torch::NoGradGuard no_grad;
    for (int64_t n : kLengths) {
      for (int call = 0; call < 2; ++call) {  // the second call at a length replays
        const Tensors in = c.inputs(n);
        const Tensors want = c.fn(in);
        const Tensors got = (*f)(in);
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < got.size(); ++k) {
          EXPECT_TRUE(close(got[k], want[k], c.rtol, c.atol)) << "length " << n << " call " << call << " output " << k;
        }
      }
    }
    EXPECT_GT(f->stats().replays, 0);
    EXPECT_EQ(f->eager_reason(), "");
  }
}

// The .ll files a function's kernels were compiled from, read whole.
std::string kernels_ir(const std::function<Tensors(const Tensors&)>& fn, const Tensors& in, bool masked) {
  MaskedTails setting(masked);
  char templ[] = "/tmp/tcap_masked_tails_XXXXXX";
  TORCH_CHECK(::mkdtemp(templ) != nullptr);
  const std::filesystem::path dir = templ;
  tcap::CompileOptions o;
  o.name = masked ? "ir_masked" : "ir_scalar";
  o.backend = "llvm";
  o.dump_dir = dir.string();
  auto f = tcap::compile(fn, o);
  torch::NoGradGuard no_grad;
  for (int call = 0; call < 3; ++call) (*f)(in);
  std::string all;
  for (const auto& e : std::filesystem::directory_iterator(dir / "kernels")) {
    if (e.path().extension() != ".ll") continue;
    std::ifstream file(e.path());
    std::stringstream s;
    s << file.rdbuf();
    all += s.str();
  }
  EXPECT_EQ(std::system(("rm -rf '" + dir.string() + "'").c_str()), 0);
  return all;
}

TEST(MaskedTails, EveryRowLengthMatchesEager) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  check_every_length(true);
}

TEST(MaskedTails, ScalarTailsStillMatchEager) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  check_every_length(false);
}

// The tail of a softmax row is masked vector code, and TCAP_MASKED_TAILS=0 turns it off
// (the switch is part of the kernel cache key: the two settings never share code).
TEST(MaskedTails, RowTailsAreMaskedVectorCode) {
  if (!llvm_here()) GTEST_SKIP() << "no LLVM backend here";
  auto fn = [](const Tensors& in) { return Tensors{torch::softmax(in[0], -1)}; };
  const Tensors in = {torch::randn({8, 126})};
  const std::string masked = kernels_ir(fn, in, true);
  const std::string scalar = kernels_ir(fn, in, false);
  ASSERT_FALSE(masked.empty());
  ASSERT_FALSE(scalar.empty());
  EXPECT_NE(masked.find("llvm.masked.load"), std::string::npos);
  EXPECT_NE(masked.find("llvm.masked.store"), std::string::npos);
  EXPECT_EQ(scalar.find("llvm.masked.load"), std::string::npos);
}

}  // namespace
