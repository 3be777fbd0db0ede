// Split reductions (Note [Split reductions], kir/split_reduction.cpp): which kernels split
// and how, and every split kind compiled with the llvm backend against eager: full,
// column and few-row reductions, several reductions and element-wise results in one
// kernel, int64 and float64, non-contiguous inputs, sizes with no usable divisor (not
// split), and the same bits at one and two threads.
//
// Tolerances (vs eager): float32 rtol 1e-5 atol 1e-4 * sqrt(n) for sums of n elements
// (reassociated: chunk sums combined in order), exact for max/min and integer sums;
// float64 rtol 1e-12.
#include <tcap/compile.h>

#include "kir/split_reduction.h"
#include "support/compare.h"
#include "support/log_capture.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace split_reduction_test {

// sum over all dims of a dense f32 tensor of n elements, as lower_group would make it.
tcap::kir::Kernel full_sum(int64_t n, bool two_pass = false) {
  using namespace tcap::kir;
  Kernel k;
  k.name = "full_sum";
  k.sizes = {n};
  k.num_reduce_dims = 1;
  k.buffers = {{"%0", DType::F32, false}, {"%1", DType::F32, true}};
  Instr load;
  load.op = OpCode::Load;
  load.buffer = 0;
  load.strides = {1};
  const int32_t x = add(k, load);
  Instr red;
  red.op = OpCode::ReduceSum;
  red.args = {x};
  int32_t s = add(k, red);
  if (two_pass) {  // sum(x - sum(x)): a Reduce of a value computed from a Reduce
    Instr sub;
    sub.op = OpCode::Sub;
    sub.args = {x, s};
    red.args = {add(k, sub)};
    s = add(k, red);
  }
  k.stores.push_back({s, 1, {0}, 0});
  verify(k);
  return k;
}

// softmax over the rows of a dense f32 [rows, n], as lowering makes it; with `shifted`,
// the sum's exponent is taken around a function of the maximum (where(m == -inf, 0, m)),
// which no online pass rescales.
tcap::kir::Kernel row_softmax(int64_t rows, int64_t n, bool shifted = false) {
  using namespace tcap::kir;
  Kernel k;
  k.name = "row_softmax";
  k.sizes = {rows, n};
  k.num_reduce_dims = 1;
  k.buffers = {{"%0", DType::F32, false}, {"%1", DType::F32, true}};
  auto op = [&](OpCode code, DType t, std::vector<int32_t> args) {
    Instr in;
    in.op = code;
    in.dtype = t;
    in.args = std::move(args);
    return add(k, in);
  };
  Instr load;
  load.op = OpCode::Load;
  load.buffer = 0;
  load.strides = {n, 1};
  const int32_t x = add(k, load);
  int32_t m = op(OpCode::ReduceMax, DType::F32, {x});
  if (shifted) {
    Instr c;
    c.op = OpCode::Const;
    c.f = -std::numeric_limits<double>::infinity();
    Instr zero;
    zero.op = OpCode::Const;
    m = op(OpCode::Where, DType::F32, {op(OpCode::Eq, DType::Bool, {m, add(k, c)}), add(k, zero), m});
  }
  const int32_t ex = op(OpCode::Exp, DType::F32, {op(OpCode::Sub, DType::F32, {x, m})});
  const int32_t s = op(OpCode::ReduceSum, DType::F32, {ex});
  k.stores.push_back({op(OpCode::Div, DType::F32, {ex, s}), 1, {n, 1}, 0});
  verify(k);
  return k;
}

bool bitwise_equal(const Tensors& a, const Tensors& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

struct Case {
  std::string name;
  std::function<Tensors(const Tensors&)> fn;
  std::function<Tensors()> inputs;
  bool splits;  // whether a kernel of it is expected to split
  double rtol = -1, atol = -1;  // where the sum's default tolerance (below) does not fit
};

std::vector<Case> cases() {
  auto f32 = [](std::vector<int64_t> s) { return torch::randn(s); };
  return {
      {"full_sum_and_max", [](const Tensors& in) { return Tensors{(in[0] * in[0]).sum(), in[0].amax()}; },
       [=] { return Tensors{f32({1 << 18})}; }, true},
      {"mean_of_a_matrix", [](const Tensors& in) { return Tensors{in[0].mean()}; }, [=] { return Tensors{f32({513, 1024})}; },
       true},
      {"columns", [](const Tensors& in) { return Tensors{in[0].sum(0), in[0].amin(0)}; },
       [=] { return Tensors{f32({1 << 17, 5})}; }, true},
      {"few_rows", [](const Tensors& in) { return Tensors{in[0].sum(1), (in[0] - 1).abs().mean(1)}; },
       [=] { return Tensors{f32({3, 1 << 17})}; }, true},
      {"batch_and_spatial", [](const Tensors& in) { return Tensors{in[0].sum(at::IntArrayRef{0, 2})}; },
       [=] { return Tensors{f32({32, 3, 4096})}; }, true},
      {"elementwise_result_too", [](const Tensors& in) { auto y = in[0].exp(); return Tensors{y, y.sum()}; },
       [=] { return Tensors{f32({1 << 17})}; }, true},
      {"transposed", [](const Tensors& in) { return Tensors{in[0].t().sum(1)}; }, [=] { return Tensors{f32({1 << 17, 4})}; },
       true},
      {"int64", [](const Tensors& in) { return Tensors{(in[0] * 3).sum()}; },
       [] { return Tensors{torch::randint(-1000, 1000, {1 << 18}, torch::kLong)}; }, true},
      {"float64", [](const Tensors& in) { return Tensors{in[0].sum()}; },
       [] { return Tensors{torch::randn({1 << 18}, torch::kDouble)}; }, true},
      // Several levels of Reduces: partials and combines per level, then a tail.
      {"softmax_few_long_rows", [](const Tensors& in) { return Tensors{torch::softmax(in[0], 1)}; },
       [=] { return Tensors{f32({2, 1 << 17}) * 4}; }, true, 1e-4, 1e-10},
      {"log_softmax_one_row", [](const Tensors& in) { return Tensors{torch::log_softmax(in[0], 0)}; },
       [=] { return Tensors{f32({3 << 16})}; }, true, 1e-5, 1e-4},
      {"softmax_over_dim0_strided", [](const Tensors& in) { return Tensors{torch::softmax(in[0], 0)}; },
       [=] { return Tensors{f32({1 << 17, 3})}; }, true, 1e-4, 1e-10},
      {"logsumexp_no_tail", [](const Tensors& in) {
         const at::Tensor m = in[0].amax(1, true);
         return Tensors{(in[0] - m).exp().sum(1).log() + m.squeeze(1)};
       },
       [=] { return Tensors{f32({5, 1 << 17})}; }, true, 1e-5, 1e-4},
      {"variance_of_everything", [](const Tensors& in) { return Tensors{(in[0] - in[0].mean()).pow(2).mean()}; },
       [=] { return Tensors{f32({1 << 18}) + 3}; }, true, 1e-4, 1e-5},
      {"standardized_whole", [](const Tensors& in) {
         auto c = in[0] - in[0].mean();
         return Tensors{c / (c * c).mean().sqrt()};
       },
       [=] { return Tensors{f32({512, 512}) * 2 + 1}; }, true, 1e-4, 1e-4},
      {"layer_norm_few_long_rows", [](const Tensors& in) {
         return Tensors{torch::layer_norm(in[0], {1 << 17}, in[1], in[2])};
       },
       [=] { return Tensors{f32({3, 1 << 17}), f32({1 << 17}), f32({1 << 17})}; }, true, 1e-4, 1e-4},
      {"cross_entropy_two_samples", [](const Tensors& in) {
         return Tensors{torch::cross_entropy_loss(in[0], in[1])};
       },
       [] { return Tensors{torch::randn({2, 1 << 17}), torch::randint(0, 1 << 17, {2}, torch::kLong)}; }, true, 1e-5,
       1e-5},
      {"softmax_bfloat16_rows", [](const Tensors& in) { return Tensors{torch::softmax(in[0], 1)}; },
       [=] { return Tensors{f32({2, 1 << 17}).to(torch::kBFloat16)}; }, true, 1e-2, 1e-6},
      {"layer_norm_float64_rows", [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {1 << 17})}; },
       [] { return Tensors{torch::randn({2, 1 << 17}, torch::kDouble) * 3 + 1}; }, true, 1e-10, 1e-10},
      // 64 long rows or more are not split: a kernel parallel over rows has work for every
      // thread (and splitting them for their online pass alone measured no faster, bench/
      // RESULTS.md: the L3 holds a row between passes).
      {"softmax_many_long_rows", [](const Tensors& in) { return Tensors{torch::softmax(in[0], 1)}; },
       [=] { return Tensors{f32({64, 1 << 17}) * 4}; }, false, 1e-4, 1e-10},
      {"cross_entropy_vocabulary_rows", [](const Tensors& in) {
         return Tensors{torch::cross_entropy_loss(in[0], in[1])};
       },
       [] { return Tensors{torch::randn({65, 128256}) * 3, torch::randint(0, 128256, {65}, torch::kLong)}; }, false,
       1e-5, 1e-5},
      {"log_softmax_rows_with_a_prime_factor", [](const Tensors& in) { return Tensors{torch::log_softmax(in[0], 1)}; },
       [=] { return Tensors{f32({64, 2 * 65537})}; }, false, 1e-5, 1e-4},
      {"softmax_many_rows_in_cache", [](const Tensors& in) { return Tensors{torch::softmax(in[0], 1)}; },
       [=] { return Tensors{f32({64, 1 << 16})}; }, false, 1e-5, 1e-10},
      {"layer_norm_many_long_rows", [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {1 << 17})}; },
       [=] { return Tensors{f32({64, 1 << 17})}; }, false, 1e-4, 1e-4},
      {"prime_size", [](const Tensors& in) { return Tensors{in[0].sum()}; }, [=] { return Tensors{f32({131101})}; }, false},
      {"small", [](const Tensors& in) { return Tensors{in[0].sum()}; }, [=] { return Tensors{f32({4096})}; }, false},
  };
}

void expect_close(const at::Tensor& got, const at::Tensor& want, int64_t n, double rtol = -1, double atol = -1) {
  if (rtol >= 0) {
    EXPECT_TRUE(close(got, want, rtol, atol));
  } else if (!got.is_floating_point()) {
    EXPECT_TRUE(at::equal(got, want));
  } else if (got.scalar_type() == at::kDouble) {
    EXPECT_TRUE(close(got, want, 1e-12, 1e-12 * std::sqrt(static_cast<double>(n))));
  } else {
    EXPECT_TRUE(close(got, want, 1e-5, 1e-4 * std::sqrt(static_cast<double>(n))));
  }
}

class SplitReduction : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tcap::Backend(tcap::Backend::Llvm).available()) GTEST_SKIP() << "LLVM backend not available";
    threads_ = at::get_num_threads();
  }
  void TearDown() override { at::set_num_threads(threads_); }
  int threads_ = 1;
};


TEST(SplitReductionKernels, WhichKernelsSplitAndHow) {
  auto s = tcap::kir::split_reduction(full_sum(1 << 20));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->splits, 64);
  ASSERT_EQ(s->kernels.size(), 2u);  // a partial and a combine
  const auto& partial = s->kernels[0];
  const auto& combine = s->kernels[1];
  EXPECT_EQ(partial.sizes, (std::vector<int64_t>{64, 1 << 14}));
  EXPECT_EQ(partial.parallel_range(), 64);
  EXPECT_EQ(combine.sizes, (std::vector<int64_t>{64}));
  EXPECT_EQ(s->scratch, (std::vector<int64_t>{64}));
  EXPECT_EQ(partial.buffers.size(), 3u);
  EXPECT_TRUE(partial.buffers[2].is_output);
  EXPECT_FALSE(combine.buffers[2].is_output);
  // Chunks of at least kMinChunk elements: 2^17 elements give 32 chunks.
  EXPECT_EQ(tcap::kir::split_reduction(full_sum(1 << 17))->splits, 32);
  EXPECT_FALSE(tcap::kir::split_reduction(full_sum(131101)));          // prime
  EXPECT_FALSE(tcap::kir::split_reduction(full_sum(1 << 16)));         // below kMinSplitElements
  // Two levels (sum(x - sum(x))): a partial and a combine per level, the first level's
  // result kept for the second partial; no element-wise store, so no tail.
  auto two = tcap::kir::split_reduction(full_sum(1 << 20, true));
  ASSERT_TRUE(two.has_value());
  ASSERT_EQ(two->kernels.size(), 4u);
  EXPECT_EQ(two->scratch, (std::vector<int64_t>{64, 64, 1}));  // two partials, the first sum's final result
  EXPECT_TRUE(two->kernels[1].buffers[4].is_output);            // combine 0 writes it
  EXPECT_FALSE(two->kernels[2].buffers[4].is_output);           // partial 1 reads it
  for (const auto& part : two->kernels) {  // each one pass over its domain
    const std::vector<int> level = tcap::kir::reduce_level(part);
    EXPECT_LE(*std::max_element(level.begin(), level.end()), 1) << tcap::kir::to_string(part);
  }
}

// Note [Online softmax in split reductions]: the sum of exponentials is computed in its
// maximum's pass, each chunk around its own maximum, and rescaled by the combine.
TEST(SplitReductionKernels, ASoftmaxSumsInItsMaximumsPass) {
  using tcap::kir::OpCode;
  auto s = tcap::kir::split_reduction(row_softmax(2, 1 << 22));
  ASSERT_TRUE(s.has_value());
  // Chunks of at most kMaxOnlineChunk elements (2^22 / 64 = 2^16), so that the partial's
  // second pass over a chunk reads the cache; 32 splits would make 64 parallel iterations.
  EXPECT_EQ(s->splits, 64);
  ASSERT_EQ(s->kernels.size(), 3u);  // partial 0 (max and sum), combine 0, the tail
  auto count = [](const tcap::kir::Kernel& k, OpCode op) {
    return std::count_if(k.instrs.begin(), k.instrs.end(), [&](const auto& in) { return in.op == op; });
  };
  auto levels = [](const tcap::kir::Kernel& k) {
    const std::vector<int> l = tcap::kir::reduce_level(k);
    return *std::max_element(l.begin(), l.end());
  };
  const auto& partial = s->kernels[0];
  const auto& combine = s->kernels[1];
  EXPECT_EQ(count(partial, OpCode::ReduceMax), 1) << tcap::kir::to_string(partial);
  EXPECT_EQ(count(partial, OpCode::ReduceSum), 1);
  EXPECT_EQ(levels(partial), 2);  // two passes over a chunk: its maximum, then its sum
  EXPECT_EQ(levels(combine), 2);  // the row's maximum, then the rescaled sums
  EXPECT_EQ(count(combine, OpCode::Exp), 1) << tcap::kir::to_string(combine);
  EXPECT_EQ(levels(s->kernels[2]), 0);
  // A sum around a function of the maximum keeps a level of its own: five kernels.
  auto shifted = tcap::kir::split_reduction(row_softmax(2, 1 << 22, true));
  ASSERT_TRUE(shifted.has_value());
  EXPECT_EQ(shifted->kernels.size(), 5u);
  EXPECT_EQ(shifted->splits, 32);
}

TEST_F(SplitReduction, CompiledMatchesEagerAtEveryThreadCount) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = "split_" + c.name;
    auto f = tcap::compile(c.fn, o);
    torch::NoGradGuard no_grad;
    {
      tcap::testing::LogCapture log("fusion");
      for (int call = 0; call < 3; ++call) {
        const Tensors in = c.inputs();
        Tensors got = f(in), want = c.fn(in);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], in[0].numel(), c.rtol, c.atol);
      }
      EXPECT_EQ(log.count("Note [Split reductions]") > 0, c.splits) << log.text();
    }
    EXPECT_GE(f->stats().replays, 1);
    // The bits do not depend on the number of threads.
    const Tensors in = c.inputs();
    at::set_num_threads(1);
    const Tensors one = f(in);
    at::set_num_threads(2);
    const Tensors two = f(in);
    EXPECT_TRUE(bitwise_equal(one, two));
  }
}

TEST_F(SplitReduction, BackwardOfASplitMean) {
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "split_backward";
  auto fn = [](const Tensors& in) { return Tensors{(in[0] * in[1]).pow(2).mean()}; };
  auto f = tcap::compile(fn, o);
  for (int call = 0; call < 3; ++call) {
    at::Tensor a = torch::randn({1 << 18}, torch::requires_grad()), b = torch::randn({1 << 18});
    at::Tensor want = fn({a, b})[0];
    want.backward();
    at::Tensor ga = a.grad().clone();
    a.mutable_grad().reset();
    at::Tensor got = f({a, b})[0];
    got.backward();
    EXPECT_TRUE(close(got, want, 1e-5, 1e-6));
    EXPECT_TRUE(close(a.grad(), ga, 1e-5, 1e-9));
  }
  EXPECT_GE(f->stats().replays, 1);
}

// Backwards with several levels of Reduces over few long rows: softmax's (a sum of
// grad * y, then y * (grad - sum)) and layer norm's (two sums, then the input's gradient).
TEST_F(SplitReduction, BackwardsOfFewLongRows) {
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "split_rows_backward";
  auto fn = [](const Tensors& in) {
    const at::Tensor y = torch::layer_norm(in[0], {1 << 17}, in[1], {});
    return Tensors{(torch::softmax(y, 1) * in[2]).sum() + y.pow(2).mean()};
  };
  auto f = tcap::compile(fn, o);
  tcap::testing::LogCapture log("fusion");
  for (int call = 0; call < 3; ++call) {
    at::Tensor x = torch::randn({2, 1 << 17}, torch::requires_grad());
    at::Tensor w = (torch::rand({1 << 17}) + 0.5).requires_grad_();
    const at::Tensor c = torch::randn({2, 1 << 17});
    at::Tensor want = fn({x, w, c})[0];
    want.backward();
    const at::Tensor gx = x.grad().clone(), gw = w.grad().clone();
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    at::Tensor got = f({x, w, c})[0];
    got.backward();
    EXPECT_TRUE(close(got, want, 1e-4, 1e-4));
    EXPECT_TRUE(close(x.grad(), gx, 1e-3, 1e-6));
    EXPECT_TRUE(close(w.grad(), gw, 1e-3, 1e-6));
  }
  EXPECT_GE(f->stats().replays, 1);
  EXPECT_GE(log.count("Note [Split reductions]"), 3) << log.text();
}

// A language model's loss over a vocabulary of 128,256 tokens in training, its logits
// computed inside the function (so the backward recomputes the log-probabilities from two
// numbers per row) and given to it (so the forward writes them), at 1 and 2 threads,
// against eager.
TEST_F(SplitReduction, CrossEntropyOverALargeVocabularyTrains) {
  constexpr int64_t kVocab = 128256, kRows = 66;
  for (bool inside : {false, true}) {
    SCOPED_TRACE(inside ? "logits computed inside" : "logits given");
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = inside ? "vocab_inside" : "vocab_given";
    auto fn = [inside](const Tensors& in) {
      const at::Tensor logits = inside ? in[0] * in[2] : in[0];
      return Tensors{torch::cross_entropy_loss(logits, in[1])};
    };
    auto f = tcap::compile(fn, o);
    for (int call = 0; call < 4; ++call) {
      at::set_num_threads(call % 2 ? 2 : 1);
      at::Tensor x = (torch::randn({kRows, kVocab}) * 3).requires_grad_();
      const at::Tensor t = torch::randint(0, kVocab, {kRows}, torch::kLong), scale = torch::rand({kVocab}) + 0.5;
      at::Tensor want = fn({x, t, scale})[0];
      want.backward();
      const at::Tensor gx = x.grad().clone();
      x.mutable_grad().reset();
      at::Tensor got = f({x, t, scale})[0];
      got.backward();
      EXPECT_TRUE(close(got, want, 1e-5, 1e-5));
      EXPECT_TRUE(close(x.grad(), gx, 1e-4, 1e-9));
    }
    EXPECT_GE(f->stats().replays, 2);
  }
}

// aten::logsumexp as a kernel (fuse/lowering.cpp): rows whose maximum is -inf, +inf or
// nan give eager's -inf, +inf and nan (not the nan of inf - inf), over one dim and two,
// with and without keepdim, and over few long rows (split at two levels); values and the
// gradient against eager.
TEST_F(SplitReduction, LogSumExpOfRowsWithInfinitiesAndNaN) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  struct LseCase {
    std::string name;
    std::vector<int64_t> dims;
    bool keepdim;
    std::vector<int64_t> sizes;
  };
  for (const LseCase& c : {LseCase{"rows", {1}, false, {6, 9}}, LseCase{"rows_keepdim", {1}, true, {6, 9}},
                           LseCase{"two_dims", {0, 2}, false, {6, 3, 5}}, LseCase{"long_rows", {1}, false, {6, 1 << 17}}}) {
    SCOPED_TRACE(c.name);
    tcap::CompileOptions o;
    o.backend = tcap::Backend::Llvm;
    o.name = "lse_" + c.name;
    auto fn = [&](const Tensors& in) { return Tensors{torch::logsumexp(in[0], c.dims, c.keepdim)}; };
    auto f = tcap::compile(fn, o);
    tcap::testing::LogCapture log("fusion");
    for (int call = 0; call < 3; ++call) {
      at::Tensor x = torch::randn(c.sizes, torch::kFloat) * 3;
      if (c.name != "two_dims") {
        x[1].fill_(-inf);              // every element -inf: -inf
        x[2].select(0, 4).fill_(inf);  // one +inf: +inf
        x[3].select(0, 2).fill_(nan);  // one nan: nan
      }
      x.requires_grad_();
      const at::Tensor want = fn({x})[0], got = f({x})[0];
      ASSERT_TRUE(close(got, want, 1e-5, 1e-5)) << got << want;
      EXPECT_TRUE(at::equal(got.isnan(), want.isnan()));
      EXPECT_TRUE(at::equal(got.isinf(), want.isinf()));
      // The gradient (a backward completes the capture); compared where x has no infinity.
      want.sum().backward();
      const at::Tensor gw = x.grad().clone();
      x.mutable_grad().reset();
      got.sum().backward();
      if (c.name == "two_dims") {
        EXPECT_TRUE(close(x.grad(), gw, 1e-5, 1e-6));
      }
    }
    EXPECT_GE(f->stats().replays, 1);
    EXPECT_GE(log.count("fused_0_logsumexp"), 1) << log.text();
    if (c.name == "long_rows") {
      EXPECT_GE(log.count("Note [Split reductions]"), 1) << log.text();
    }
  }
}

// Note [Online softmax in split reductions] with infinities, over few long rows (split,
// chunks of 8192): a row of -inf (nan, as eager), a row whose first half is -inf (whole
// chunks of -inf, as a causal mask makes), a +inf, a nan, large magnitudes (exponentials
// that underflow within a chunk but not across), and an ordinary row; softmax and
// log_softmax with their gradients where the row is finite, and cross-entropy.
// Tolerances: rtol 1e-4 on values (a chunk's exp(e - m_c) * exp(m_c - m) against eager's
// exp(e - m)); gradients below.
TEST_F(SplitReduction, OnlineSoftmaxOfRowsWithInfinitiesAndNaN) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const int64_t n = 1 << 17;
  auto fn = [](const Tensors& in) {
    return Tensors{torch::softmax(in[0], 1), torch::log_softmax(in[0], 1) * 0.5,
                   torch::cross_entropy_loss(in[0].narrow(0, 4, 2), in[1])};
  };
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Llvm;
  o.name = "online_softmax";
  auto f = tcap::compile(fn, o);
  tcap::testing::LogCapture log("fusion");
  for (int call = 0; call < 3; ++call) {
    at::Tensor x = torch::randn({6, n}) * 3;
    x[0].fill_(-inf);
    x[1].narrow(0, 0, n / 2).fill_(-inf);
    x[2].select(0, 77).fill_(inf);
    x[3].select(0, n - 5).fill_(nan);
    x[4] *= 30;
    x[4].narrow(0, 8192, 8192).fill_(-inf);
    x.requires_grad_();
    const at::Tensor t = torch::randint(0, n, {2}, torch::kLong);
    const Tensors want = fn({x, t}), got = f({x, t});
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(close(got[i], want[i], 1e-4, 1e-10)) << i;
      EXPECT_TRUE(at::equal(got[i].isnan(), want[i].isnan())) << i;
      EXPECT_TRUE(at::equal(got[i].isinf(), want[i].isinf())) << i;
    }
    EXPECT_TRUE(close(got[2], want[2], 1e-5, 1e-5));
    // Gradients of the rows without infinity or nan (4 and 5), through all three results.
    auto loss = [](const Tensors& r) { return r[0].narrow(0, 4, 2).pow(2).sum() + r[1].narrow(0, 5, 1).sum() + r[2]; };
    loss(want).backward();
    const at::Tensor gw = x.grad().narrow(0, 4, 2).clone();
    x.mutable_grad().reset();
    loss(got).backward();
    // Entries reach -6000 (log_softmax's 1 - n * p at a row's maximum); eager's own
    // float32 error there is about 1e-2 (against float64), so atol follows the scale.
    EXPECT_TRUE(close(x.grad().narrow(0, 4, 2), gw, 1e-4, 1e-5 * gw.abs().max().item<double>()));
  }
  EXPECT_GE(f->stats().replays, 1);
  EXPECT_GE(log.count("Note [Split reductions]"), 1) << log.text();
}

}  // namespace split_reduction_test
