// The thread-safety contract of docs/limitations.md ("Threads"), under load: several
// threads at once capture (a CaptureGuard each), run compiled autograd (a
// CompiledAutogradGuard each, sharing one cache), and compile and call functions of their
// own; every result is compared with eager on the same thread. Each test runs for about
// a second (at least a few rounds), so the suite stays short and tools/sanitize.sh tsan
// can run it under ThreadSanitizer.
#include <tcap/capture.h>
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/interpreter.h>

#include "runtime/buffer_pool.h"
#include "support/compare.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using tcap::testing::close;
using Clock = std::chrono::steady_clock;

constexpr int kThreads = 4;
constexpr int kMinRounds = 3;
constexpr auto kBudget = std::chrono::milliseconds(1000);

// Runs body(thread, round) on kThreads threads, each for kMinRounds rounds and then until
// the budget is spent; returns the first failure message per thread ("" when none).
std::vector<std::string> on_threads(const std::function<void(int, int)>& body) {
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  const auto start = Clock::now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      try {
        for (int round = 0; round < kMinRounds || Clock::now() - start < kBudget; ++round) body(t, round);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t t = 0; t < errors.size(); ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

// Throws (so on_threads reports it) unless `actual` matches `expected`.
void check_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  const auto r = close(actual, expected, 1e-4, 1e-5);
  if (!r) throw std::runtime_error(what + ": " + r.message());
}

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Eager gradients of loss_fn(model(x)) with respect to model's parameters, by name.
std::map<std::string, at::Tensor> eager_grads(Mlp& model, const at::Tensor& x) {
  Mlp ref;
  {
    torch::NoGradGuard no_grad;
    auto src = model.named_parameters();
    for (auto& p : ref.named_parameters()) p.value().copy_(src[p.key()]);
  }
  (ref.forward(x) * ref.forward(x)).sum().backward();
  std::map<std::string, at::Tensor> out;
  for (auto& p : ref.named_parameters()) out[p.key()] = p.value().grad().clone();
  return out;
}

// The buffer pool's small blocks (Note [Small blocks]) taken and freed on every thread at
// once, a third of them freed by another thread than the one that took them: no block is
// handed out twice (each keeps the values written into it).
TEST(Threads, SmallPooledBlocksOnEveryThread) {
  std::mutex handed_mu;
  std::vector<at::Tensor> handed;  // taken on one thread, freed on another
  expect_no_errors(on_threads([&](int t, int round) {
    tcap::runtime::PoolScope scope;
    std::vector<at::Tensor> mine;
    for (int k = 0; k < 200; ++k) {
      const int64_t n = 1 + (k * 37 + t * 11 + round) % 3000;
      mine.push_back(at::full({n}, float(t * 1000 + k)));
    }
    for (int k = 0; k < 200; ++k) {
      const auto v = float(t * 1000 + k);
      if (!mine[k].eq(v).all().item<bool>()) throw std::runtime_error("a small block was handed out twice");
    }
    std::lock_guard<std::mutex> lock(handed_mu);
    handed.clear();  // frees the blocks another thread left
    for (int k = 0; k < 200; k += 3) handed.push_back(std::move(mine[k]));
  }));
}

// Capture per thread: each thread records its own forward and backward, the graph
// replays to eager's loss and gradients.
TEST(Threads, CaptureOnEveryThread) {
  expect_no_errors(on_threads([](int t, int round) {
    Mlp model;
    const at::Tensor x = torch::randn({4 + t, 6});
    tcap::CaptureGuard cap;
    cap.register_module(model);
    cap.input(x, "x");
    const at::Tensor y = model.forward(x);
    const at::Tensor loss = (y * y).sum();
    cap.output(loss, "loss");
    loss.backward();
    const tcap::ir::Graph g = cap.graph();
    cap.stop();
    tcap::ir::verify(g);
    const auto res = tcap::interpret(g, cap.input_tensors());
    check_close(res.at(0), loss, "loss");
    const auto expected = eager_grads(model, x);
    const tcap::ir::Node& out = *g.output_node();
    size_t grads = 0;
    for (size_t k = 1; k < out.output_names.size(); ++k) {
      check_close(res.at(k), expected.at(out.output_names[k]), "grad of " + out.output_names[k]);
      ++grads;
    }
    if (grads != 4) throw std::runtime_error("round " + std::to_string(round) + ": " + std::to_string(grads) + " grads");
  }));
}

// Compiled autograd on several threads at once, one cache shared by all (same options):
// every backward's gradients match eager, and later rounds are served compiled.
void compiled_autograd_on_every_thread(const std::string& backend) {
  tcap::reset_compiled_autograd();
  tcap::CompileOptions options;
  options.name = "threads_" + backend;
  options.backend = backend;
  std::vector<int> hits(kThreads, 0);
  expect_no_errors(on_threads([&](int t, int round) {
    static thread_local std::unique_ptr<Mlp> model;
    if (round == 0) model = std::make_unique<Mlp>();
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    const at::Tensor x = torch::randn({5, 6});
    {
      tcap::CompiledAutogradGuard ca(options);
      const at::Tensor y = model->forward(x);
      (y * y).sum().backward();
      hits[static_cast<size_t>(t)] = ca.stats().replays;
    }
    const auto expected = eager_grads(*model, x);
    for (auto& p : model->named_parameters()) check_close(p.value().grad(), expected.at(p.key()), p.key());
  }));
  int total = 0;
  for (int h : hits) total += h;
  EXPECT_GT(total, 0) << "no backward was served compiled";
}

TEST(Threads, CompiledAutogradOnEveryThreadEager) { compiled_autograd_on_every_thread("eager"); }
TEST(Threads, CompiledAutogradOnEveryThreadLlvm) {
  if (!TCAP_HAVE_LLVM) GTEST_SKIP() << "built without LLVM";
  compiled_autograd_on_every_thread("llvm");
}

// Compiling and calling different functions on different threads: each thread compiles
// its own function (first calls capture, later ones replay) and checks values and
// gradients against eager.
TEST(Threads, DifferentCompiledFunctionsOnEveryThread) {
  expect_no_errors(on_threads([](int t, int round) {
    static thread_local std::shared_ptr<tcap::CompiledFunction> f;
    const auto fn = [t](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{torch::cos(in[0] * in[1] + static_cast<double>(t)).sum(1)};
    };
    if (round == 0) {
      tcap::CompileOptions o;
      o.name = "thread_fn_" + std::to_string(t);
      f = tcap::compile(fn, o);
    }
    const at::Tensor a = torch::randn({3, 4}, torch::requires_grad());
    const at::Tensor b = torch::randn({3, 4});
    const at::Tensor y = (*f)({a, b})[0];
    y.sum().backward();
    const at::Tensor ea = a.detach().clone().requires_grad_();
    const at::Tensor ey = fn({ea, b})[0];
    ey.sum().backward();
    check_close(y, ey, "value");
    check_close(a.grad(), ea.grad(), "gradient");
  }));
}

// The first calls of one compiled function racing each other (capture, compile, replay
// from several threads): a backward that several threads' first calls could claim is
// claimed by one (capture/armed.h), the others run eagerly or wait.
TEST(Threads, OneCompiledFunctionFirstCallsRace) {
  const auto fn = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{torch::sigmoid(in[0] * in[1]).sum(0)};
  };
  tcap::CompileOptions o;
  o.name = "shared_fn";
  const auto f = tcap::compile(fn, o);
  expect_no_errors(on_threads([&](int, int) {
    const at::Tensor a = torch::randn({5, 3}, torch::requires_grad());
    const at::Tensor b = torch::randn({5, 3});
    const at::Tensor y = (*f)({a, b})[0];
    y.sum().backward();
    const at::Tensor ea = a.detach().clone().requires_grad_();
    fn({ea, b})[0].sum().backward();
    check_close(y, fn({a.detach(), b})[0], "value");
    check_close(a.grad(), ea.grad(), "gradient");
  }));
}

// Deterministic halves of that race (Note [Abandoning a capture]). Another thread gives up
// waiting for the first call's backward while that backward is running on the thread
// that made the graph: the capture is left to the backward, which completes it.
TEST(Threads, GivingUpWaitsForABackwardAlreadyRecording) {
  const auto fn = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{torch::sigmoid(in[0] * in[1]).sum(0)};
  };
  tcap::CompileOptions o;
  o.name = "given_up_while_running";
  const auto f = tcap::compile(fn, o);
  const at::Tensor a = torch::randn({7, 3}, torch::requires_grad());
  const at::Tensor b = torch::randn({7, 3});
  const at::Tensor y = (*f)({a, b})[0];  // captures; waits for its backward
  std::string other;
  // a's hook runs inside the region's backward, after it started recording.
  a.register_hook([&](const at::Tensor& g) {
    std::thread t([&] {
      try {
        for (int k = 0; k < 4; ++k) {
          const at::Tensor x = torch::randn({7, 3}), z = torch::randn({7, 3});
          const at::Tensor got = (*f)({x, z})[0];
          if (!close(got, fn({x, z})[0])) other = "call " + std::to_string(k) + " differs from eager";
        }
      } catch (const std::exception& e) {
        other = e.what();
      }
    });
    t.join();
    return g;
  });
  y.sum().backward();
  EXPECT_EQ(other, "");
  const at::Tensor ea = a.detach().clone().requires_grad_();
  fn({ea, b})[0].sum().backward();
  EXPECT_TRUE(close(a.grad(), ea.grad()));
  // The backward completed the capture: one entry with a backward, which now replays.
  const auto entries = f->entries();
  ASSERT_EQ(entries.size(), 1U);
  EXPECT_EQ(entries[0].joint.num_tangents, 1U);
  const at::Tensor a2 = torch::randn({7, 3}, torch::requires_grad());
  const at::Tensor y2 = (*f)({a2, b})[0];
  y2.sum().backward();
  const at::Tensor ea2 = a2.detach().clone().requires_grad_();
  fn({ea2, b})[0].sum().backward();
  EXPECT_TRUE(close(y2, fn({a2.detach(), b})[0]));
  EXPECT_TRUE(close(a2.grad(), ea2.grad()));
  const auto st = f->stats();
  EXPECT_EQ(st.captures, 1);
  EXPECT_EQ(st.compiles, 1);
  EXPECT_GE(st.replays, 1);
}

// The other half: another thread gives up before the backward starts. Its calls say
// nothing of the first call's backward (Note [Waiting for the first backward]): they run
// eagerly until 64 have passed, then the capture is dropped, its observers left inert on
// the owner's graph, and that thread captures again, its own backward completing the
// entry. The first call's backward, run later on its own thread, is plain eager and right.
TEST(Threads, GivingUpOnAnotherThreadLeavesTheOwnersGraphRight) {
  const auto fn = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{torch::tanh(in[0] * in[1]).sum(1)};
  };
  tcap::CompileOptions o;
  o.name = "given_up_elsewhere";
  const auto f = tcap::compile(fn, o);
  const at::Tensor a = torch::randn({5, 6}, torch::requires_grad());
  const at::Tensor b = torch::randn({5, 6});
  const at::Tensor y = (*f)({a, b})[0];
  constexpr int kOtherThreadCalls = 64;  // PendingCapture::kOtherThreadCalls
  std::string other;
  std::thread t([&] {
    try {
      for (int k = 0; k < kOtherThreadCalls + 4; ++k) {
        const at::Tensor x = torch::randn({5, 6}, torch::requires_grad()), z = torch::randn({5, 6});
        const at::Tensor got = (*f)({x, z})[0];
        got.sum().backward();
        const at::Tensor ex = x.detach().clone().requires_grad_();
        fn({ex, z})[0].sum().backward();
        if (!close(got, fn({x.detach(), z})[0]) || !close(x.grad(), ex.grad())) {
          other = "call " + std::to_string(k) + " differs from eager";
        }
      }
    } catch (const std::exception& e) {
      other = e.what();
    }
  });
  t.join();
  EXPECT_EQ(other, "");
  const auto st = f->stats();
  EXPECT_EQ(st.eager_calls, kOtherThreadCalls) << "the other thread's calls before it gave up";
  EXPECT_EQ(st.captures, 2);
  EXPECT_EQ(st.compiles, 1);
  EXPECT_EQ(st.replays, 3) << "the calls after the other thread's capture";
  // The entry has the other thread's backward: compiled, not recomputed.
  const auto entries = f->entries();
  ASSERT_EQ(entries.size(), 1U);
  EXPECT_EQ(entries[0].joint.num_tangents, 1U);
  y.sum().backward();
  const at::Tensor ea = a.detach().clone().requires_grad_();
  fn({ea, b})[0].sum().backward();
  EXPECT_TRUE(close(a.grad(), ea.grad()));
  EXPECT_EQ(f->stats().compiles, 1) << "the first call's late backward completed nothing";
}

// The capturing thread itself calling on without a backward: two more calls run eagerly,
// the next compiles the forward alone, whatever other threads do meanwhile.
TEST(Threads, CallsOnTheCapturingThreadAloneCompileTheForwardAlone) {
  const auto fn = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{torch::sin(in[0]) * in[1]};
  };
  tcap::CompileOptions o;
  o.name = "no_backward_on_its_thread";
  const auto f = tcap::compile(fn, o);
  const at::Tensor b = torch::randn({4, 3});
  std::vector<at::Tensor> kept;  // outputs alive, no backward
  for (int k = 0; k < 3; ++k) {
    const at::Tensor a = torch::randn({4, 3}, torch::requires_grad());
    kept.push_back((*f)({a, b})[0]);
    // Calls on another thread meanwhile, with backwards of their own: not counted.
    std::thread t([&] {
      const at::Tensor x = torch::randn({4, 3}, torch::requires_grad());
      (*f)({x, b})[0].sum().backward();
    });
    t.join();
  }
  EXPECT_EQ(f->stats().compiles, 0) << "two calls on the capturing thread still wait";
  const at::Tensor a = torch::randn({4, 3}, torch::requires_grad());
  const at::Tensor y = (*f)({a, b})[0];
  EXPECT_EQ(f->stats().compiles, 1);
  const auto entries = f->entries();
  ASSERT_EQ(entries.size(), 1U);
  EXPECT_EQ(entries[0].joint.num_tangents, 0U) << "compiled without a backward";
  y.sum().backward();
  const at::Tensor ea = a.detach().clone().requires_grad_();
  fn({ea, b})[0].sum().backward();
  EXPECT_TRUE(close(y, fn({a.detach(), b})[0]));
  EXPECT_TRUE(close(a.grad(), ea.grad()));
}

}  // namespace
