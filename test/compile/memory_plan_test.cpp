// Static memory planning per graph (Note [Memory plans], csrc/runtime/buffer_pool.h): the
// first run under a plan records its allocations, later runs take the intermediates from
// one arena at planned offsets, and nothing a caller can see depends on the plan being
// right: pieces that outlive their run, requests larger than recorded, lifetimes longer than
// recorded and raw allocations all stay correct. The first half drives a plan directly with
// ATen calls; the second half runs compiled graphs (every executable has a plan) against
// eager LibTorch: values and gradients, dynamic sizes, outputs that alias inputs or
// intermediates, saved tensors that outlive the call.
//
// Tolerances: exact where the plan only moves bytes (the same ATen kernels run); rtol 1e-4,
// atol 1e-5 against eager for compiled graphs (the fused kernels round differently).
#include <tcap/compile.h>

#include "runtime/buffer_pool.h"
#include "support/compare.h"
#include "support/log_capture.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <cstring>
#include <memory>
#include <thread>

using tcap::runtime::MemoryPlan;
using tcap::runtime::PoolScope;
using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

// Installs the pool (the plans need it) and skips when it cannot be.
#define NEED_POOL()                                                                       \
  do {                                                                                    \
    { PoolScope install; }                                                                \
    if (!tcap::buffer_pool_stats().enabled) GTEST_SKIP() << "the CPU buffer pool is off"; \
  } while (0)

// Two intermediates that die inside the run, one result that escapes it (tensor operands
// only: a Scalar operand would add a wrapped-number tensor per op to the count).
at::Tensor chain(const at::Tensor& x) {
  at::Tensor a = x * x;
  at::Tensor b = a + x;
  return b.sin();
}

at::Tensor run_chain(MemoryPlan& plan, const at::Tensor& x) {
  PoolScope scope(&plan);
  return chain(x);
}

TEST(MemoryPlan, IntermediatesComeFromOneArenaEveryCall) {
  NEED_POOL();
  MemoryPlan plan("chain");
  Tensors inputs, outputs;
  for (int call = 0; call < 10; ++call) {
    inputs.push_back(at::randn({1000 + call % 3}));
    outputs.push_back(run_chain(plan, inputs.back()));
  }
  // Every result is still its own (none lives in the arena the later calls reuse).
  for (size_t k = 0; k < inputs.size(); ++k) EXPECT_TRUE(outputs[k].equal(chain(inputs[k]))) << "call " << k;
  const auto s = plan.stats();
  EXPECT_FALSE(s.disabled);
  EXPECT_EQ(s.runs, 10);
  EXPECT_EQ(s.recordings, 1);
  EXPECT_EQ(s.arenas_made, 1);
  EXPECT_EQ(s.missed, 0);
  EXPECT_EQ(s.planned, 2);   // a and b
  EXPECT_EQ(s.escaping, 1);  // the result
  EXPECT_EQ(s.served, 2 * 9);
  // a and b are alive together (b = a + 1), so they do not share bytes.
  EXPECT_GE(s.arena_bytes, int64_t{2} * 1000 * 4);
}

TEST(MemoryPlan, SmallerSizesFitLargerSizesPlanAgain) {
  NEED_POOL();
  MemoryPlan plan("sizes");
  const int64_t sizes[] = {4000, 1500, 3999, 9000, 9000, 9000, 100, 4000};
  for (int64_t n : sizes) {
    at::Tensor x = at::randn({n});
    EXPECT_TRUE(run_chain(plan, x).equal(chain(x))) << n;
  }
  const auto s = plan.stats();
  // The first call records; 1500 and 3999 fit; 9000 misses and the next call records
  // again; from then on everything fits the larger arena.
  EXPECT_EQ(s.recordings, 2);
  EXPECT_EQ(s.arenas_made, 2);
  EXPECT_GE(s.missed, 1);
  EXPECT_EQ(s.served, 2 * 2 + 2 * 3);
  EXPECT_GE(s.arena_bytes, int64_t{2} * 9000 * 4);
}

TEST(MemoryPlan, APieceThatOutlivesItsRunKeepsItsBytes) {
  NEED_POOL();
  MemoryPlan plan("escape");
  at::Tensor kept;
  auto run = [&](const at::Tensor& x, bool keep) {
    PoolScope scope(&plan);
    at::Tensor a = x * x;
    if (keep) kept = a;  // planned (it died when recorded), alive after this run
    return (a + x).cos();
  };
  at::Tensor x = at::randn({2048});
  run(x, false);  // records
  run(x, false);  // planned
  run(x, true);   // a escapes: the arena stays with it
  const at::Tensor want = x * x;
  ASSERT_TRUE(kept.equal(want));
  for (int k = 0; k < 3; ++k) run(at::randn({2048}), false);  // must not write over `kept`
  EXPECT_TRUE(kept.equal(want));
  const auto s = plan.stats();
  // The run that kept `a` did not go as recorded, so the next one records again (where
  // `a` dies, as usual), and the run after that takes a fresh arena: the first still holds
  // `kept`.
  EXPECT_EQ(s.recordings, 2);
  EXPECT_EQ(s.arenas_made, 2);
  EXPECT_EQ(s.escaping, 1);
  kept.reset();                 // the old arena goes back with its last piece
}

// An arena of 64 KiB or more is lent a pool block per run: between runs its bytes are the
// pool's (another graph's run can use them), and in steady state taking it back is a hit.
TEST(MemoryPlan, ALargeArenaIsAPoolBlockBetweenRuns) {
  NEED_POOL();
  MemoryPlan plan("large");
  const int64_t live_before = tcap::buffer_pool_stats().live_bytes;
  at::Tensor x = at::randn({100000});
  const at::Tensor want = chain(x);
  int64_t misses = 0;
  for (int call = 0; call < 6; ++call) {
    EXPECT_TRUE(run_chain(plan, x).equal(want)) << call;
    EXPECT_EQ(tcap::buffer_pool_stats().live_bytes, live_before) << "call " << call << " kept a block";
    if (call == 2) misses = tcap::buffer_pool_stats().misses;
  }
  EXPECT_EQ(tcap::buffer_pool_stats().misses, misses) << "a steady-state run took a new block";
  const auto s = plan.stats();
  EXPECT_EQ(s.arenas_made, 1);
  EXPECT_EQ(s.served, 2 * 5);
  // A piece that escapes keeps the block until it dies; then the block is the pool's again.
  at::Tensor kept;
  {
    PoolScope scope(&plan);
    kept = x * x;  // planned: it died when recorded
  }
  EXPECT_GT(tcap::buffer_pool_stats().live_bytes, live_before);
  for (int call = 0; call < 3; ++call) EXPECT_TRUE(run_chain(plan, x).equal(want));
  EXPECT_TRUE(kept.equal(x * x));
  kept.reset();
  EXPECT_EQ(tcap::buffer_pool_stats().live_bytes, live_before);
}

TEST(MemoryPlan, ALongerLifetimeThanRecordedIsServedElsewhere) {
  NEED_POOL();
  MemoryPlan plan("lifetimes");
  auto run = [&](const at::Tensor& x, bool overlap) {
    PoolScope scope(&plan);
    at::Tensor a = x * 2.0;
    at::Tensor s = a.sum();  // a dies here when recorded ...
    at::Tensor keep_a = overlap ? a : at::Tensor();
    a.reset();
    at::Tensor b = x * 5.0;  // ... so b may take a's bytes
    at::Tensor out = b + s;
    if (overlap) out = out + keep_a;  // a alive beside b
    return out;
  };
  at::Tensor x = at::randn({4096});
  run(x, false);
  EXPECT_TRUE(run(x, false).equal(x * 5.0 + (x * 2.0).sum()));
  EXPECT_TRUE(run(x, true).equal(x * 5.0 + (x * 2.0).sum() + x * 2.0));
  EXPECT_GE(plan.stats().missed, 1);
  EXPECT_TRUE(run(x, false).equal(x * 5.0 + (x * 2.0).sum()));
}

// A piece may die on another thread (an autograd worker, a data loader): its bytes come
// back to the arena all the same.
TEST(MemoryPlan, APieceFreedOnAnotherThread) {
  NEED_POOL();
  MemoryPlan plan("threads");
  at::Tensor x = at::randn({3000});
  for (int call = 0; call < 5; ++call) {
    PoolScope scope(&plan);
    at::Tensor a = x * x;
    std::thread([t = std::move(a)]() mutable { t.reset(); }).join();
    at::Tensor b = x + x;
    EXPECT_TRUE(b.equal(x * 2)) << call;
  }
  const auto s = plan.stats();
  EXPECT_EQ(s.recordings, 1);
  EXPECT_EQ(s.missed, 0);
  EXPECT_GE(s.planned, 2);  // a and b, and what the check allocates
  EXPECT_EQ(s.served, s.planned * 4);
}

TEST(MemoryPlan, RawAllocationsArePlannedToo) {
  NEED_POOL();
  MemoryPlan plan("raw");
  c10::Allocator* alloc = c10::GetCPUAllocator();
  for (int call = 0; call < 4; ++call) {
    PoolScope scope(&plan);
    void* p = alloc->raw_allocate(1000);
    std::memset(p, call, 1000);
    EXPECT_EQ(static_cast<unsigned char*>(p)[999], call);
    alloc->raw_deallocate(p);
  }
  const auto s = plan.stats();
  EXPECT_EQ(s.planned, 1);
  EXPECT_EQ(s.served, 3);
}

TEST(MemoryPlan, APlanDestroyedWhileAPieceLivesLeavesItIntact) {
  NEED_POOL();
  auto plan = std::make_unique<MemoryPlan>("short-lived");
  at::Tensor kept;
  auto run = [&](bool keep) {
    PoolScope scope(plan.get());
    at::Tensor a = at::full({512}, 7.0);
    if (keep) kept = a;
  };
  run(false);
  run(true);
  plan.reset();
  EXPECT_TRUE(kept.equal(at::full({512}, 7.0)));
  at::Tensor other = at::full({512}, 1.0);  // not in the old arena
  EXPECT_TRUE(kept.equal(at::full({512}, 7.0)));
  kept.reset();
}

TEST(MemoryPlan, GivesUpWhenSizesKeepGrowing) {
  NEED_POOL();
  tcap::testing::LogCapture logs("perf");
  MemoryPlan plan("growing");
  for (int k = 0; k < 2 * MemoryPlan::kMaxRecordings + 2; ++k) {
    at::Tensor x = at::randn({1000 * (k + 1)});
    EXPECT_TRUE(run_chain(plan, x).equal(chain(x))) << k;
  }
  const auto s = plan.stats();
  EXPECT_TRUE(s.disabled);
  EXPECT_EQ(s.recordings, MemoryPlan::kMaxRecordings);
  EXPECT_NE(logs.text().find("memory plan of growing: off after 8 recordings"), std::string::npos) << logs.text();
}

// --- compiled graphs -----------------------------------------------------------------

// Several intermediates (each dies inside the graph) and a reduction.
Tensors body(const Tensors& in) {
  auto h = torch::tanh(torch::mm(in[0], in[1]) + in[2]);
  auto g = torch::sigmoid(h * 1.5 - in[2]);
  return {(g * h).sum(1), torch::relu(g - 0.25)};
}

Tensors leaves(int64_t rows) {
  return {torch::randn({rows, 33}, torch::requires_grad()), torch::randn({33, 47}, torch::requires_grad()),
          torch::randn({47}, torch::requires_grad())};
}

Tensors detached_copies(const Tensors& ts) {
  Tensors r;
  for (const auto& t : ts) r.push_back(t.detach().clone().requires_grad_(true));
  return r;
}

at::Tensor loss_of(const Tensors& out) { return out[0].sum() + out[1].pow(2).sum(); }

void expect_matches_eager(tcap::CompiledFunction& f, const Tensors& in, const std::string& what) {
  Tensors ref_in = detached_copies(in);
  Tensors out = f(in);
  Tensors ref = body(ref_in);
  loss_of(out).backward();
  loss_of(ref).backward();
  for (size_t k = 0; k < out.size(); ++k) EXPECT_TRUE(close(out[k], ref[k], 1e-4, 1e-5)) << what << " output " << k;
  for (size_t k = 0; k < in.size(); ++k) {
    EXPECT_TRUE(close(in[k].grad(), ref_in[k].grad(), 1e-4, 1e-5)) << what << " grad " << k;
  }
}

class PlannedGraphs : public ::testing::TestWithParam<std::string> {
 protected:
  // The parameter's backend, and a name per test.
  static tcap::CompileOptions options(const std::string& name) {
    tcap::CompileOptions o;
    o.backend = GetParam();
    o.name = name + "_" + GetParam();
    return o;
  }
};

TEST_P(PlannedGraphs, DynamicSizesReuseTheArena) {
  NEED_POOL();
  const tcap::CompileOptions o = options("planned_dynamic");
  auto f = tcap::compile(body, o);
  const auto before = tcap::runtime::memory_plan_totals();
  // Each size three times: its first call at a new size is a check (Note [Checking a new
  // size]), its first replay learns the plan, later replays are served from it.
  const int64_t rows[] = {37, 53, 29, 61, 37, 17, 53, 61, 5, 44};
  for (int64_t r : rows) {
    for (int k = 0; k < 3; ++k) expect_matches_eager(*f, leaves(r), "rows " + std::to_string(r));
  }
  const auto after = tcap::runtime::memory_plan_totals();
  EXPECT_GT(after.served - before.served, 0) << "no intermediate came from an arena";
  // One arena per compiled graph (a forward and a backward for each of the 7 sizes), not
  // one per call (30 calls).
  EXPECT_LE(after.arenas_made - before.arenas_made, 14);
}

// Outputs that alias an input or view an intermediate escape the run: a later call must not
// write over what an earlier call returned.
TEST_P(PlannedGraphs, ReturnedViewsAndAliasesKeepTheirValues) {
  NEED_POOL();
  auto fn = [](const Tensors& in) {
    auto t = torch::exp(in[0] * 0.5);
    auto u = t * 3.0 + 1.0;
    return Tensors{in[0].view({-1}), u.slice(1, 2, 9), u.t(), (t + u).mean()};
  };
  const tcap::CompileOptions o = options("planned_views");
  auto f = tcap::compile(fn, o);
  std::vector<Tensors> ins, outs;
  for (int call = 0; call < 6; ++call) {
    ins.push_back({torch::randn({13, 11})});
    outs.push_back((*f)(ins.back()));
  }
  for (size_t c = 0; c < ins.size(); ++c) {
    const Tensors want = fn(ins[c]);
    for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(close(outs[c][k], want[k], 1e-4, 1e-5)) << c << " " << k;
    EXPECT_EQ(outs[c][0].data_ptr(), ins[c][0].data_ptr()) << "the alias is the input";
  }
}

// Tensors saved for the backward outlive the forward's run: three forwards, then their
// backwards in reverse order, against eager.
TEST_P(PlannedGraphs, SavedTensorsOutliveTheCall) {
  NEED_POOL();
  const tcap::CompileOptions o = options("planned_saved");
  auto f = tcap::compile(body, o);
  expect_matches_eager(*f, leaves(21), "warm-up");  // captures
  std::vector<Tensors> ins, refs, outs, ref_outs;
  for (int k = 0; k < 3; ++k) {
    ins.push_back(leaves(21));
    refs.push_back(detached_copies(ins.back()));
    outs.push_back((*f)(ins.back()));
    ref_outs.push_back(body(refs.back()));
  }
  for (int k = 2; k >= 0; --k) {
    loss_of(outs[k]).backward();
    loss_of(ref_outs[k]).backward();
    for (size_t j = 0; j < ins[k].size(); ++j) {
      EXPECT_TRUE(close(ins[k][j].grad(), refs[k][j].grad(), 1e-4, 1e-5)) << "forward " << k << " grad " << j;
    }
  }
  EXPECT_GE(f->stats().replays, 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, PlannedGraphs, ::testing::Values("eager", "auto"));

}  // namespace
