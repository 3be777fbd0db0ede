// The CPU buffer pool (Note [CPU buffer pool], include/tcap/buffer_pool.h): compiled
// steps reuse their blocks, eager code is left alone, the raw allocation interface and
// frees on other threads work, the cap holds.
//
// Tolerances: rtol 1e-4, atol 1e-5 (float32; the llvm backend's fused kernels round
// differently from ATen's, and the min-cut partition recomputes).
#include <tcap/buffer_pool.h>
#include <tcap/compile.h>

#include "runtime/buffer_pool.h"
#include "support/compare.h"
#include "support/logging.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <cstdlib>
#include <thread>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

// Large enough that every intermediate is pooled (>= 64 KiB): 300 x 301 f32 = 353 KiB.
Tensors mlp_like(const Tensors& in) {
  auto h = torch::relu(torch::mm(in[0], in[1]) + in[2]);
  return {torch::tanh(h * in[0] - 0.5)};
}

Tensors fresh_inputs() {
  return {torch::randn({300, 301}, torch::requires_grad()), torch::randn({301, 301}, torch::requires_grad()),
          torch::randn({301}, torch::requires_grad())};
}

Tensors grads(const Tensors& ts) {
  Tensors g;
  for (const auto& t : ts) g.push_back(t.grad().clone());
  return g;
}

void steady_state_allocates_nothing(const std::string& backend) {
  tcap::CompileOptions o;
  o.backend = backend;
  o.name = "pool_" + backend;
  auto f = tcap::compile(mlp_like, o);
  int64_t misses_after_warmup = -1;
  for (int step = 0; step < 6; ++step) {
    Tensors in = fresh_inputs();
    Tensors out = (*f)(in);
    out[0].sum().backward();
    const Tensors g = grads(in);
    Tensors ref_in;
    for (const auto& t : in) ref_in.push_back(t.detach().clone().requires_grad_(true));
    const Tensors ref = mlp_like(ref_in);
    ref[0].sum().backward();
    // The llvm backend may run the product through oneDNN (Note [GEMMs through oneDNN]):
    // sums of 301 products in another order, so atol follows their size (entries of h
    // reach about 50, gradients a few hundred).
    EXPECT_TRUE(close(out[0], ref[0], 1e-4, 1e-4)) << backend << " step " << step;
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_TRUE(close(g[i], ref_in[i].grad(), 1e-4, 1e-3)) << backend << " step " << step << " grad " << i;
    }
    // Step 0 captures and compiles; steps 1-2 replay and fill the pool.
    if (step == 2) misses_after_warmup = tcap::buffer_pool_stats().misses;
  }
  EXPECT_EQ(f->stats().replays, 5) << backend;
  const auto st = tcap::buffer_pool_stats();
  ASSERT_TRUE(st.enabled);
  EXPECT_GT(st.hits, 0);
  EXPECT_EQ(st.misses, misses_after_warmup) << backend << ": a steady-state step took new blocks";
}

TEST(BufferPool, CompiledStepsReuseTheirBlocksEagerBackend) { steady_state_allocates_nothing("eager"); }

TEST(BufferPool, CompiledStepsReuseTheirBlocksFusedKernels) { steady_state_allocates_nothing("auto"); }

TEST(BufferPool, EagerCodeOutsideCompiledGraphsIsNotPooled) {
  { tcap::runtime::PoolScope install; }
  const auto before = tcap::buffer_pool_stats();
  ASSERT_TRUE(before.enabled);
  {
    at::Tensor big = at::empty({1 << 20});
    big.fill_(1);
    EXPECT_EQ(tcap::buffer_pool_stats().live_bytes, before.live_bytes);
  }
  const auto after = tcap::buffer_pool_stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes);
}

TEST(BufferPool, BlocksComeBackWhereverTheTensorDies) {
  at::Tensor t;
  {
    tcap::runtime::PoolScope scope;
    t = at::empty({3, 1 << 18});  // 3 MiB
  }
  const auto held = tcap::buffer_pool_stats();
  EXPECT_GE(held.live_bytes, 3 << 20);
  std::thread([t = std::move(t)]() mutable { t.reset(); }).join();
  const auto freed = tcap::buffer_pool_stats();
  EXPECT_EQ(freed.live_bytes, held.live_bytes - (3 << 20));
  EXPECT_EQ(freed.cached_bytes, held.cached_bytes + (3 << 20));
  // The same size again is a hit on that block.
  tcap::runtime::PoolScope scope;
  at::Tensor again = at::ones({3, 1 << 18});
  EXPECT_EQ(tcap::buffer_pool_stats().hits, freed.hits + 1);
  EXPECT_EQ(again.sum().item<float>(), 3 << 18);
}

TEST(BufferPool, RawAllocationAndResizeWork) {
  tcap::runtime::PoolScope scope;
  c10::Allocator* a = c10::GetCPUAllocator();
  ASSERT_NE(a->raw_deleter(), nullptr);
  const auto before = tcap::buffer_pool_stats();
  void* p = a->raw_allocate(1 << 20);  // pooled: raw_allocate needs data == context
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, 1 << 20);
  EXPECT_EQ(tcap::buffer_pool_stats().live_bytes, before.live_bytes + (1 << 20));
  a->raw_deallocate(p);
  EXPECT_EQ(tcap::buffer_pool_stats().live_bytes, before.live_bytes);
  const auto small_before = tcap::buffer_pool_stats();
  void* small = a->raw_allocate(100);  // a small block, same deleter
  std::memset(small, 7, 100);
  EXPECT_EQ(tcap::buffer_pool_stats().small_live_blocks, small_before.small_live_blocks + 1);
  a->raw_deallocate(small);
  EXPECT_EQ(tcap::buffer_pool_stats().small_live_blocks, small_before.small_live_blocks);
  // A pooled tensor grows through the storage's allocator and keeps its values.
  at::Tensor t = at::arange(1 << 17, at::kFloat);
  t.resize_({1 << 19});
  EXPECT_EQ(t.slice(0, 0, 1 << 17).equal(at::arange(1 << 17, at::kFloat)), true);
}

TEST(BufferPool, CachedBytesStayUnderTheCap) {
  { tcap::runtime::PoolScope install; }
  tcap::empty_buffer_pool();
  const int64_t old_cap = tcap::runtime::set_buffer_pool_cap_for_testing(int64_t{2} << 20);
  {
    Tensors ts;
    tcap::runtime::PoolScope scope;
    for (int i = 0; i < 4; ++i) ts.push_back(at::empty({1 << 18}));  // 1 MiB each
  }
  const auto st = tcap::buffer_pool_stats();
  EXPECT_EQ(st.cap_bytes, int64_t{2} << 20);
  EXPECT_EQ(st.cached_bytes, int64_t{2} << 20);
  EXPECT_EQ(st.cached_blocks, 2);
  tcap::empty_buffer_pool();
  EXPECT_EQ(tcap::buffer_pool_stats().cached_bytes, 0);
  EXPECT_EQ(tcap::buffer_pool_stats().cached_blocks, 0);
  tcap::runtime::set_buffer_pool_cap_for_testing(old_cap);
}

// A cached block serves smaller requests by splitting (the rest stays cached, if at least
// 64 KiB), and freed pieces merge back into their block, which then serves a request of
// its full size again and is the unit empty_buffer_pool() frees.
TEST(BufferPool, BlocksSplitAndMergeBack) {
  constexpr int64_t MiB = int64_t{1} << 20;
  { tcap::runtime::PoolScope install; }
  tcap::empty_buffer_pool();
  tcap::runtime::PoolScope scope;
  void* segment = nullptr;
  {
    at::Tensor big = at::empty({1 << 20});  // 4 MiB
    segment = big.data_ptr();
  }
  const auto start = tcap::buffer_pool_stats();
  ASSERT_EQ(start.cached_bytes, 4 * MiB);
  {
    at::Tensor a = at::empty({1 << 18});  // 1 MiB: split from the 4 MiB block
    at::Tensor b = at::empty({1 << 18});
    const auto split = tcap::buffer_pool_stats();
    EXPECT_EQ(split.misses, start.misses);
    EXPECT_EQ(split.hits, start.hits + 2);
    EXPECT_EQ(split.cached_bytes, 2 * MiB);
    EXPECT_EQ(split.cached_blocks, 1);
    EXPECT_EQ(a.data_ptr(), segment);
    EXPECT_EQ(static_cast<char*>(b.data_ptr()), static_cast<char*>(segment) + MiB);
    // The pieces do not overlap.
    a.fill_(1.0f);
    b.fill_(2.0f);
    EXPECT_EQ(a.sum().item<float>(), float(1 << 18));
    EXPECT_EQ(b.sum().item<float>(), float(2 << 18));
    // A piece of a segment still partly in use is not freed by empty_buffer_pool().
    tcap::empty_buffer_pool();
    EXPECT_EQ(tcap::buffer_pool_stats().cached_bytes, 2 * MiB);
  }
  // Both pieces freed: one 4 MiB block again, which serves 4 MiB at the same address.
  const auto merged = tcap::buffer_pool_stats();
  EXPECT_EQ(merged.cached_bytes, 4 * MiB);
  EXPECT_EQ(merged.cached_blocks, 1);
  {
    at::Tensor again = at::empty({1 << 20});
    EXPECT_EQ(again.data_ptr(), segment);
    EXPECT_EQ(tcap::buffer_pool_stats().misses, start.misses);
  }
  {
    // A rest under 64 KiB is not split off: the whole block is handed out.
    at::Tensor close_size = at::empty({(1 << 20) - 4096});
    EXPECT_EQ(tcap::buffer_pool_stats().cached_bytes, 0);
  }
  tcap::empty_buffer_pool();
  EXPECT_EQ(tcap::buffer_pool_stats().cached_bytes, 0);
  EXPECT_EQ(tcap::buffer_pool_stats().cached_blocks, 0);
}

// Note [Small blocks]: inside a scope, requests under 64 KiB come from size classes; a
// freed block serves the next request of its class, wherever the tensor died; blocks of
// different sizes alive together never share bytes; outside a scope nothing changes.
TEST(BufferPool, SmallBlocksAreReusedByClass) {
  { tcap::runtime::PoolScope install; }
  const auto start = tcap::buffer_pool_stats();
  {
    at::Tensor outside = at::empty({10});
    EXPECT_EQ(tcap::buffer_pool_stats().small_served, start.small_served);
  }
  tcap::runtime::PoolScope scope;
  // Sizes across the classes, odd ones included: 4 B .. 60 KiB.
  const std::vector<int64_t> numels = {1, 16, 17, 100, 1000, 1023, 4097, 15000};
  Tensors ts;
  for (size_t i = 0; i < numels.size(); ++i) ts.push_back(at::full({numels[i]}, float(i + 1)));
  const auto live = tcap::buffer_pool_stats();
  EXPECT_EQ(live.small_served, start.small_served + int64_t(numels.size()));
  EXPECT_EQ(live.small_live_blocks, start.small_live_blocks + int64_t(numels.size()));
  for (size_t i = 0; i < numels.size(); ++i) {
    EXPECT_TRUE(ts[i].eq(float(i + 1)).all().item<bool>()) << "block " << i << " was overwritten";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ts[i].data_ptr()) % 64, 0u) << "c10's alignment";
  }
  // A block freed on another thread serves the next request of its class, here.
  void* first = ts[3].data_ptr();
  std::thread([t = std::move(ts[3])]() mutable { t.reset(); }).join();
  EXPECT_EQ(tcap::buffer_pool_stats().small_live_blocks, live.small_live_blocks - 1);
  at::Tensor again = at::zeros({97});  // 388 bytes: the 512-byte class, as 400 bytes was
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(again.sum().item<float>(), 0.0f);
  ts.clear();
  again.reset();
  const auto done = tcap::buffer_pool_stats();
  EXPECT_EQ(done.small_live_blocks, start.small_live_blocks);
  // Steady state: the same allocations again carve nothing new.
  for (int round = 0; round < 3; ++round) {
    Tensors more;
    for (auto n : numels) more.push_back(at::ones({n}));
  }
  EXPECT_EQ(tcap::buffer_pool_stats().small_carved_bytes, done.small_carved_bytes);
}

// empty_buffer_pool() hands back the pages of small-block spans with no block in use; their
// blocks are served again afterwards (fresh pages) and blocks still in use keep their values.
TEST(BufferPool, SmallBlocksSurviveEmptyingThePool) {
  tcap::runtime::PoolScope scope;
  const auto start = tcap::buffer_pool_stats();
  at::Tensor kept = at::full({300}, 3.0f);
  const volatile float* gone_bytes = nullptr;
  {
    at::Tensor gone = at::full({5000}, 2.0f);  // a class of its own: its span is wholly free
    gone_bytes = gone.data_ptr<float>();
  }
  tcap::empty_buffer_pool();
  // White box: the span stays reserved, its pages were handed back (they read as zero).
  EXPECT_EQ(gone_bytes[0], 0.0f);
  EXPECT_EQ(kept.sum().item<float>(), 900.0f);
  at::Tensor reused = at::full({5000}, 5.0f);
  EXPECT_EQ(static_cast<const void*>(reused.data_ptr<float>()), const_cast<const float*>(gone_bytes));
  EXPECT_EQ(reused.sum().item<float>(), 25000.0f);
  EXPECT_EQ(tcap::buffer_pool_stats().small_live_blocks, start.small_live_blocks + 2);
}

// When the range is used up, small requests go to the replaced allocator; those blocks free
// through the same deleter. The range is min(64 MiB, the cap), one class per 256 KiB span:
// 40 KiB requests (the 64 KiB class) use it up after 1024 blocks.
TEST(BufferPool, SmallBlocksBeyondTheRangeComeFromMalloc) {
  tcap::runtime::PoolScope scope;
  const auto start = tcap::buffer_pool_stats();
  if (start.small_carved_bytes != 0) GTEST_SKIP() << "small blocks were carved by an earlier test in this process";
  Tensors ts;
  for (int i = 0; i < 1100; ++i) ts.push_back(at::full({10240}, float(i)));
  const auto full = tcap::buffer_pool_stats();
  EXPECT_EQ(full.small_carved_bytes, int64_t{64} << 20);
  EXPECT_EQ(full.small_live_blocks, start.small_live_blocks + 1024);
  for (int i = 0; i < 1100; i += 99) EXPECT_EQ(ts[i][10239].item<float>(), float(i));
  ts.clear();
  EXPECT_EQ(tcap::buffer_pool_stats().small_live_blocks, start.small_live_blocks);
  at::Tensor after = at::ones({10240});  // served by the range again
  EXPECT_EQ(tcap::buffer_pool_stats().small_served, full.small_served + 1);
}

// TCAP_BUFFER_POOL_MB=0 leaves LibTorch's allocator alone. The pool installs once per
// process, so this holds only if nothing installed it before (CTest runs each test alone).
TEST(BufferPool, ZeroMegabytesTurnsThePoolOff) {
  const c10::Allocator* stock = c10::GetCPUAllocator();
  setenv("TCAP_BUFFER_POOL_MB", "0", 1);
  tcap::reload_config_for_testing();
  { tcap::runtime::PoolScope scope; }
  unsetenv("TCAP_BUFFER_POOL_MB");
  tcap::reload_config_for_testing();
  if (tcap::buffer_pool_stats().enabled) GTEST_SKIP() << "the pool was installed by an earlier test in this process";
  EXPECT_EQ(c10::GetCPUAllocator(), stock);
}

}  // namespace
