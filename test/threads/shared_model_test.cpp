// Many threads, one model (docs/limitations.md, "Threads"): one compiled module served
// from a thread pool (forward only, under InferenceMode and NoGradGuard), trained by
// several threads at once (Hogwild: gradients of every thread accumulate into the shared
// .grad, as eager allows), compiled autograd on several threads whose graphs share the
// model's leaves (their first backwards capture at the same moment), and one compile_step
// called from two threads (calls are serialized). Every result is eager's (accumulated
// gradients up to summation order). Random yields and sleeps shuffle the interleavings.
//
// The iterations per thread come from TCAP_STRESS_ITERATIONS (default 25, what CTest runs);
// the long form, under the sanitizers too (tools/sanitize.sh):
//   TCAP_STRESS_ITERATIONS=2000 build/test/tcap_thread_tests --gtest_filter='*SharedModel*'
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/train_step.h>

#include "support/backends.h"
#include "support/compare.h"
#include "support/models.h"

#include <ATen/CPUGeneratorImpl.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

namespace {

using Tensors = std::vector<at::Tensor>;

int iterations() {
  const char* v = std::getenv("TCAP_STRESS_ITERATIONS");
  const int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 25;
}
constexpr int kWorkers = 4;

// Sometimes gives the CPU away, to shuffle how the threads interleave.
void jitter(std::mt19937& rng) {
  const unsigned r = rng() % 16;
  if (r < 4) std::this_thread::yield();
  else if (r == 4) std::this_thread::sleep_for(std::chrono::microseconds(50 + rng() % 200));
}

// Threads that meet at the start of every round.
class Rounds {
 public:
  explicit Rounds(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    const int gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return generation_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0, generation_ = 0;
};

// Runs body(thread) on kWorkers threads started together; returns each one's first error.
std::vector<std::string> run_workers(const std::function<void(int)>& body) {
  std::vector<std::string> errors(kWorkers);
  std::vector<std::thread> threads;
  Rounds start(kWorkers);
  for (int t = 0; t < kWorkers; ++t) {
    threads.emplace_back([&, t] {
      start.wait();
      try {
        body(t);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return errors;
}

void expect_none(const std::vector<std::string>& errors) {
  for (size_t t = 0; t < errors.size(); ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

void require_close(const at::Tensor& a, const at::Tensor& b, const std::string& what, double rtol = 1e-4,
                   double atol = 1e-5) {
  const auto r = tcap::testing::close(a, b, rtol, atol);
  if (!r) throw std::runtime_error(what + ": " + r.message());
}

struct ServedImpl : torch::nn::Module {
  ServedImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(12, 16));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
    fc2 = register_module("fc2", torch::nn::Linear(16, 5));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::gelu(ln(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(Served);

// Inputs of (thread, iteration), the same whoever asks.
at::Tensor batch(int t, int i, int64_t rows = 3) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1000 * t + i));
  return at::randn({rows, 12}, gen);
}

class SharedModel : public ::testing::TestWithParam<std::string> {};

// A thread pool serving one compiled module, forward only.
TEST_P(SharedModel, ServedFromAThreadPoolForwardOnly) {
  const std::string backend = GetParam();
  std::string why;
  if (backend == "llvm" && !tcap::testing::backend_built("llvm", &why)) GTEST_SKIP() << why;
  torch::manual_seed(0);
  Served model;
  tcap::CompileOptions o;
  o.backend = backend;
  auto f = tcap::compile(model, o);
  const int n = iterations();
  // A served model is warmed up before the pool starts (its first calls of each shape and
  // mode capture); the threads racing those first calls are CompiledFunction's contract
  // too (Note [One capture at a time]), tested by OneCompiledFunctionFirstCallsRace.
  for (const int64_t rows : {1, 8}) {
    {
      c10::InferenceMode mode;
      f->forward(batch(9, 9, rows));
    }
    torch::NoGradGuard mode;
    f->forward(batch(9, 9, rows));
  }
  const int warm = f->stats().replays;
  for (const bool inference : {true, false}) {
    expect_none(run_workers([&](int t) {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < n; ++i) {
        const at::Tensor x = batch(t, i, 1 + (i % 2) * 7);  // batch 1 and 8
        at::Tensor got, ref;
        if (inference) {
          c10::InferenceMode mode;
          got = f->forward(x);
          ref = model->forward(x);
        } else {
          torch::NoGradGuard mode;
          got = f->forward(x);
          ref = model->forward(x);
        }
        require_close(got, ref, "thread " + std::to_string(t) + " call " + std::to_string(i));
        jitter(rng);
      }
    }));
  }
  const auto s = f->stats();
  EXPECT_EQ(s.replays - warm, 2 * kWorkers * n)
      << "not every call was served compiled: " << s.captures << " captures, " << s.eager_calls << " eager calls";
}

// Hogwild: every thread runs forward and backward through the compiled module; all
// gradients accumulate into the one model's .grad. Two rounds: the first races the
// module's first calls (one captures, the others run eagerly until its entry is
// compiled), the second starts with the entry compiled and every call replays it. How many
// calls of the first round replay depends on how the threads are scheduled (a late
// backward of the capturing call keeps the others eager meanwhile), so only the second
// round's count is checked.
TEST_P(SharedModel, TrainedByThreadsThatShareItsParameters) {
  const std::string backend = GetParam();
  std::string why;
  if (backend == "llvm" && !tcap::testing::backend_built("llvm", &why)) GTEST_SKIP() << why;
  torch::manual_seed(0);
  Served model, twin;
  tcap::testing::copy_parameters(*model, *twin);
  tcap::CompileOptions o;
  o.backend = backend;
  auto f = tcap::compile(model, o);
  const int n = iterations();
  tcap::CompileStats before;
  for (const int round : {0, 1}) {
    before = f->stats();
    expect_none(run_workers([&](int t) {
      std::mt19937 rng(static_cast<unsigned>(t + 10 * round) + 100);
      for (int i = 0; i < n; ++i) {
        f->forward(batch(t, round * n + i)).pow(2).mean().backward();
        jitter(rng);
      }
    }));
    for (int t = 0; t < kWorkers; ++t) {
      for (int i = 0; i < n; ++i) twin->forward(batch(t, round * n + i)).pow(2).mean().backward();
    }
    auto pt = twin->named_parameters();
    for (const auto& p : model->named_parameters()) {
      EXPECT_TRUE(tcap::testing::close(p.value().grad(), pt[p.key()].grad(), 1e-4, 1e-5))
          << p.key() << " after round " << round;
    }
  }
  const auto s = f->stats();
  EXPECT_EQ(s.replays - before.replays, kWorkers * n)
      << "not every call of the second round was served compiled: " << s.captures - before.captures
      << " captures, " << s.eager_calls - before.eager_calls << " eager calls";
  EXPECT_EQ(s.captures, before.captures);
}

// Compiled autograd on every thread, the graphs sharing the model's leaves: each round
// uses a cache of its own, so the threads' first backwards capture at the same moment
// (this crashed about one run in fifty: the captures edited the AccumulateGrad nodes' hook
// lists while the other threads' backwards read them; Note [Backwards and graph edits on
// several threads]).
TEST_P(SharedModel, CompiledAutogradWhoseGraphsShareLeaves) {
  const std::string backend = GetParam();
  std::string why;
  if (backend == "llvm" && !tcap::testing::backend_built("llvm", &why)) GTEST_SKIP() << why;
  torch::manual_seed(0);
  Served model, twin;
  tcap::testing::copy_parameters(*model, *twin);
  const int n = iterations();
  const int per_round = 3;  // backwards per thread in each cache: one capture, then hits
  Rounds rounds(kWorkers);
  std::atomic<int> hits{0};
  expect_none(run_workers([&](int t) {
    std::mt19937 rng(static_cast<unsigned>(t) + 200);
    for (int i = 0; i < n; ++i) {
      rounds.wait();
      tcap::CompileOptions o;
      o.backend = backend;
      o.name = "shared_leaves_" + backend + "_" + std::to_string(i / per_round);
      const at::Tensor loss = model->forward(batch(t, i)).pow(2).mean();
      jitter(rng);
      tcap::CompiledAutogradGuard ca(o);
      loss.backward();
      if (i % per_round == per_round - 1) hits += ca.stats().replays;
    }
  }));
  for (int t = 0; t < kWorkers; ++t) {
    for (int i = 0; i < n; ++i) twin->forward(batch(t, i)).pow(2).mean().backward();
  }
  auto pt = twin->named_parameters();
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(tcap::testing::close(p.value().grad(), pt[p.key()].grad(), 1e-4, 1e-5)) << p.key();
  }
  EXPECT_GT(hits.load(), 0) << "no backward was served compiled";
  tcap::reset_compiled_autograd();
}

// One compiled step called from two threads: calls are serialized, whole steps one after
// the other. With the same batch for every step the result does not depend on their order:
// it is eager's 2N steps.
TEST_P(SharedModel, CompileStepFromTwoThreadsIsSerialized) {
  const std::string backend = GetParam();
  std::string why;
  if (backend == "llvm" && !tcap::testing::backend_built("llvm", &why)) GTEST_SKIP() << why;
  torch::manual_seed(0);
  Served model, twin;
  tcap::testing::copy_parameters(*model, *twin);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_twin(twin->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const at::Tensor x = batch(0, 0, 6);
  auto body = [](Served& m, torch::optim::SGD& o, const at::Tensor& in) {
    o.zero_grad();
    auto loss = m->forward(in).pow(2).mean();
    loss.backward();
    o.step();
    return loss;
  };
  tcap::CompileOptions co;
  co.backend = backend;
  auto step = tcap::compile_step(model, opt, [&](const Tensors& in) { return Tensors{body(model, opt, in[0])}; }, co);
  const int n = iterations();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 300);
      try {
        for (int i = 0; i < n; ++i) {
          (*step)({x});
          jitter(rng);
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  expect_none(errors);
  for (int i = 0; i < 2 * n; ++i) body(twin, opt_twin, x);
  auto pt = twin->named_parameters();
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(tcap::testing::close(p.value(), pt[p.key()], 1e-4, 1e-5)) << p.key();
  }
  EXPECT_GT(step->stats().replays, n);
}

INSTANTIATE_TEST_SUITE_P(Threads, SharedModel, ::testing::Values(std::string("eager"), std::string("llvm")));

}  // namespace
