// Kernels compiled on several threads at once give what one thread gives (Note [Parallel
// kernel compilation]), and the lowering table agrees with the op facts.
#include "fusion_checks.h"

#include "compiler/pipeline.h"

#include <tcap/graph_json.h>

#include <stdlib.h>

using namespace tcap::testing::fusion;

namespace {

// Note [Parallel kernel compilation]: the groups of a graph compile on several threads at
// once, and the result does not depend on how many.
tcap::ir::Graph many_groups_graph() {
  // Six chains separated by matmuls (which stay ATen): six groups at least.
  auto fn = [](const Tensors& in) {
    at::Tensor x = in[0];
    for (int i = 0; i < 6; ++i) x = torch::mm(torch::tanh(x * (1.0 + i)) + 0.5, in[1]).softmax(-1);
    return Tensors{x};
  };
  return captured_forward(fn, [](tcap::CompiledFunction& f) {
    f({torch::randn({7, 9}), torch::randn({9, 9})});
    f({torch::randn({7, 9}), torch::randn({9, 9})});
  });
}

TEST(ParallelCompile, ResultDoesNotDependOnThreads) {
  const tcap::ir::Graph g = many_groups_graph();
  ASSERT_GT(g.nodes().size(), 0u) << "no graph was compiled";
  std::atomic<int> active{0}, most{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  auto run = [&](int n) {
    tcap::fuse::FusionOptions o;
    o.compile_threads = n;
    std::atomic<int64_t> next{1};
    o.compile = [&](const tcap::fuse::FusedGroup& fg, std::string* why) -> int64_t {
      const int now = active.fetch_add(1) + 1;
      for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      active.fetch_sub(1);
      // Some groups are refused, to check that refusals are decided in group order too.
      const int64_t id = next.fetch_add(1);
      if (fg.kernel.instrs.size() % 3 == 0) {
        *why = "refused by the test";
        return -1;
      }
      return id;
    };
    return tcap::fuse::fuse(g, o);
  };
  const tcap::fuse::FusionResult one = run(1);
  EXPECT_NE(one.explain().find("refused by the test"), std::string::npos) << one.explain();
  EXPECT_EQ(most.load(), 1);
  EXPECT_EQ(threads.size(), 1u);
  ASSERT_GE(one.groups.size(), 4u) << one.explain();
  most = 0;
  threads.clear();
  const tcap::fuse::FusionResult four = run(4);
  EXPECT_GT(most.load(), 1) << "no two kernels compiled at once";
  EXPECT_GT(threads.size(), 1u);
  EXPECT_EQ(four.decisions, one.decisions);
  ASSERT_EQ(four.groups.size(), one.groups.size());
  for (size_t i = 0; i < one.groups.size(); ++i) {
    EXPECT_EQ(four.groups[i].name, one.groups[i].name);
    EXPECT_EQ(tcap::kir::to_string(four.groups[i].kernel), tcap::kir::to_string(one.groups[i].kernel));
  }
  // Kernel ids differ (they are handed out in completion order); the graphs otherwise match.
  auto without_ids = [](const tcap::fuse::FusionResult& r) {
    return std::regex_replace(tcap::ir::to_string(r.graph), std::regex("kernel=[0-9]+"), "kernel=ID");
  };
  EXPECT_EQ(without_ids(four), without_ids(one));
}

// The compile pipeline keeps each kernel at its group's place in the graph's kernel table
// (Note [A compiled graph owns its kernels]), not in the order compiles finish: with four
// threads and a maker that makes the first groups slowest, the fused graph written to
// TCAP_DUMP_DIR names kernels 0, 1, 2, ... in graph order, the same text as with one thread.
TEST(ParallelCompile, KernelPlacesFollowGroupOrder) {
  const tcap::ir::Graph g = many_groups_graph();
  ASSERT_GT(g.nodes().size(), 0u) << "no graph was compiled";
  char templ[] = "/tmp/tcap_places_XXXXXX";
  ASSERT_NE(::mkdtemp(templ), nullptr);
  const std::string dir = templ;
  auto fused_text = [&](const char* threads) {
    ::setenv("TCAP_COMPILE_THREADS", threads, 1);
    tcap::reload_config_for_testing();
    tcap::Executable exe = tcap::fused_backend(
        g, std::string("places_t") + threads, dir, c10::Device(c10::kCPU),
        [](const tcap::fuse::FusedGroup& fg, tcap::runtime::FusedKernel&) {
          // The first groups finish last.
          std::this_thread::sleep_for(std::chrono::milliseconds(5 * std::max<int64_t>(0, 8 - fg.ordinal)));
        });
    ::unsetenv("TCAP_COMPILE_THREADS");
    tcap::reload_config_for_testing();
    return tcap::ir::load_json(dir + "/places_t" + threads + ".fused.json");
  };
  const tcap::ir::Graph four = fused_text("4");
  const tcap::ir::Graph one = fused_text("1");
  std::vector<int64_t> places;
  for (const auto& n : four.nodes()) {
    if (n.op == tcap::fuse::kFusedOp) places.push_back(n.args.at(1).i);
  }
  ASSERT_GE(places.size(), 4u) << tcap::ir::to_string(four);
  for (size_t i = 0; i < places.size(); ++i) EXPECT_EQ(places[i], static_cast<int64_t>(i)) << tcap::ir::to_string(four);
  auto text = [](const tcap::ir::Graph& h) {
    return std::regex_replace(tcap::ir::to_string(h), std::regex("places_t[14]"), "places");
  };
  EXPECT_EQ(text(four), text(one));
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

// An exception other than a refusal, thrown on a worker thread, reaches the caller.
TEST(ParallelCompile, ErrorsReachTheCaller) {
  const tcap::ir::Graph g = many_groups_graph();
  tcap::fuse::FusionOptions o;
  o.compile_threads = 3;
  std::atomic<int> calls{0};
  o.compile = [&](const tcap::fuse::FusedGroup&, std::string*) -> int64_t {
    if (calls.fetch_add(1) == 1) throw std::runtime_error("the backend broke");
    return 7;
  };
  EXPECT_THROW(
      {
        try {
          tcap::fuse::fuse(g, o);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "the backend broke");
          throw;
        }
      },
      std::runtime_error);
}

}  // namespace

// The lowering table (how ops lower to kernel IR) and the op facts every pass reads
// (ir/op_facts.h) agree: an op lowered as pointwise is Pointwise there, one lowered as a
// reduction or row op is a Reduction, a matmul is neither, and none of them is a view.
TEST(OpFactsAgree, LoweringTableMatchesOpFacts) {
  const auto ops = tcap::fuse::lowered_ops();
  ASSERT_GT(ops.size(), 50u);
  for (const auto& [key, cls] : ops) {
    const std::string op = key.substr(0, key.find('.'));
    const bool pointwise = cls == tcap::fuse::OpClass::Pointwise;
    const bool contraction = cls == tcap::fuse::OpClass::Contraction;  // a matmul: neither
    EXPECT_EQ(tcap::ir::op_has(op, tcap::ir::OpFact::Pointwise), pointwise) << key;
    EXPECT_EQ(tcap::ir::op_has(op, tcap::ir::OpFact::Reduction), !pointwise && !contraction) << key;
    EXPECT_FALSE(tcap::ir::op_has(op, tcap::ir::OpFact::View)) << key;
  }
}
