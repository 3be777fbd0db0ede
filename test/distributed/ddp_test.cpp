// tcap::DistributedDataParallel across real processes on Gloo over loopback. Each test
// starts its ranks as child processes of this binary (`--ddp-worker <scenario> <out>`,
// RANK/WORLD_SIZE/MASTER_PORT in the environment), waits for them with a deadline, and
// compares what they wrote with a single-process run computed here.
//
// Tolerances: ranks must end bit-identical (every rank receives the same all-reduced
// sums); against the single process, float32 results after 3 SGD steps agree to
// rtol 1e-4, atol 1e-5 (the sums run in another order).
#include "ddp_scenario.h"

namespace {

using namespace ddp_test;

// --- the parent ----------------------------------------------------------------------------

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct RankResult {
  std::map<std::string, std::string> fields;  // "ok"/"error" and the reported counters
  std::vector<at::Tensor> state;
  bool ok() const { return fields.count("ok") > 0; }
  std::string error() const { return fields.count("error") ? fields.at("error") : ""; }
  int64_t num(const std::string& k) const { return fields.count(k) ? std::stoll(fields.at(k)) : -1; }
  std::string field(const std::string& k) const { return fields.count(k) ? fields.at(k) : ""; }
};

struct Run {
  std::vector<RankResult> ranks;
  double seconds = 0;
  int64_t start_ms = 0;  // system clock, as error_at_ms
};

// Starts `spawn` of `world` ranks (ranks >= spawn never start) and waits at most
// `deadline_s`; a rank still running then is killed and the test fails.
Run launch(const std::string& spec, int world, double timeout_s = 20, int spawn = -1, double deadline_s = 45) {
  if (spawn < 0) spawn = world;
  const auto dir = std::filesystem::temp_directory_path() / ("tcap_ddp_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t start_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::vector<pid_t> pids;
  for (int r = 0; r < spawn; ++r) {
    const std::string out = (dir / ("rank" + std::to_string(r))).string();
    std::filesystem::remove(out + ".txt");
    std::filesystem::remove(out + ".pt");
    pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("TCAP_DIST_TIMEOUT_S", std::to_string(timeout_s).c_str(), 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      execl("/proc/self/exe", "ddp-worker", "--ddp-worker", spec.c_str(), out.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  size_t left = pids.size();
  while (left > 0) {
    for (auto& pid : pids) {
      if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == pid) {
        pid = -1;
        --left;
      }
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > deadline_s) {
      for (auto pid : pids) if (pid > 0) kill(pid, SIGKILL);
      for (auto pid : pids) if (pid > 0) waitpid(pid, nullptr, 0);
      ADD_FAILURE() << "ranks still running after " << deadline_s << " s (a hang): " << spec;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Run run;
  run.start_ms = start_ms;
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < spawn; ++r) {
    const std::string out = (dir / ("rank" + std::to_string(r))).string();
    RankResult rr;
    std::ifstream in(out + ".txt");
    std::string line;
    while (std::getline(in, line)) {
      const auto sp = line.find(' ');
      rr.fields[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
    }
    if (rr.ok()) torch::load(rr.state, out + ".pt");
    run.ranks.push_back(std::move(rr));
    // (Not std::filesystem::remove_all: libtorch.so exports its own copy of it, which
    // crashes when called from here.)
    ::unlink((out + ".txt").c_str());
    ::unlink((out + ".pt").c_str());
  }
  ::rmdir(dir.c_str());
  return run;
}

// One process doing what `world` ranks do together: rank 0's initial weights, each step's
// gradient the average over the ranks' batches. With BatchNorm (batch statistics are per
// rank in DDP) or a branch some ranks take, each rank's rows are forwarded apart; else the
// concatenated batch is forwarded at once. A parameter a rank does not use adds zeros to
// the average, as in DDP with find_unused_parameters.
std::vector<at::Tensor> reference(const Scenario& s, int world) {
  Net net = make_net(s, 0);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < s.steps; ++step) {
    opt.zero_grad();
    for (int m = 0; m < s.micro; ++m) {
      auto [x, y] = batch(step, m, world);
      if (!s.bn && !s.branch) {
        torch::nn::functional::cross_entropy(net->forward(x), y).backward();
        continue;
      }
      // DDP's buffers follow rank 0's rows (they are broadcast before each forward).
      std::vector<at::Tensor> rank0_buffers;
      for (int r = 0; r < world; ++r) {
        auto xr = x.narrow(0, r * kBatch, kBatch), yr = y.narrow(0, r * kBatch, kBatch);
        net->take_branch = takes_branch(s, r);
        (torch::nn::functional::cross_entropy(net->forward(xr), yr) / world).backward();
        if (r == 0) {
          for (const auto& b : net->buffers()) rank0_buffers.push_back(b.detach().clone());
        }
      }
      torch::NoGradGuard no_grad;
      const auto bufs = net->buffers();
      for (size_t k = 0; k < bufs.size(); ++k) bufs[k].copy_(rank0_buffers[k]);
    }
    opt.step();
  }
  return state_of(*net);
}

void expect_matches_reference(const Run& run, const std::string& spec, int world) {
  ASSERT_EQ(run.ranks.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) ASSERT_TRUE(run.ranks[r].ok()) << "rank " << r << ": " << run.ranks[r].error();
  const auto ref = reference(parse(spec), world);
  for (int r = 0; r < world; ++r) {
    const auto& st = run.ranks[r].state;
    ASSERT_EQ(st.size(), ref.size());
    for (size_t k = 0; k < st.size(); ++k) {
      EXPECT_TRUE(torch::equal(st[k], run.ranks[0].state[k])) << "rank " << r << " tensor " << k << " differs from rank 0";
      EXPECT_TRUE(torch::allclose(st[k], ref[k], 1e-4, 1e-5))
          << "rank " << r << " tensor " << k << " vs single process: max diff "
          << (st[k] - ref[k]).abs().max().item<double>();
    }
  }
  // The initial weights differ per rank and the gradients are averaged: a run whose ranks
  // never communicated would not match the reference.
  EXPECT_GT(run.ranks[0].num("allreduces"), 0);
}

TEST(DistributedDataParallel, EagerTwoRanksMatchesOneProcess) {
  const std::string spec = "mode=eager,bn=1";
  expect_matches_reference(launch(spec, 2), spec, 2);
}

TEST(DistributedDataParallel, EagerFourRanksConcatenatedBatch) {
  const std::string spec = "mode=eager,bn=0";
  expect_matches_reference(launch(spec, 4), spec, 4);
}

// Buckets capped at 24 bytes: (fc.bias, fc.weight), (norm.bias, norm.weight), (conv.bias,
// conv.weight), reduced in bucket order whatever order the hooks run in.
TEST(DistributedDataParallel, EagerFourRanksSmallBuckets) {
  const std::string spec = "mode=eager,bn=1,bucket=24";
  auto run = launch(spec, 4);
  expect_matches_reference(run, spec, 4);
  EXPECT_GE(run.ranks[0].num("buckets"), 3);
  EXPECT_EQ(run.ranks[0].num("allreduces"), 3 * run.ranks[0].num("buckets"));
}

TEST(DistributedDataParallel, CompiledAutogradFourRanksSmallBuckets) {
  const std::string spec = "mode=compiled_autograd,bn=1,steps=4,bucket=24";
  auto run = launch(spec, 4);
  expect_matches_reference(run, spec, 4);
  EXPECT_GE(run.ranks[0].num("buckets"), 3);
  for (const auto& r : run.ranks) {
    EXPECT_GE(r.num("replays"), 2);
    // Every parameter (conv, norm, fc: weight and bias) is accumulated inside the graph.
    EXPECT_GE(r.num("ca_accumulate_nodes"), 6);
  }
}

TEST(DistributedDataParallel, NoSyncAccumulatesLocally) {
  const std::string spec = "mode=eager,bn=0,micro=3";
  auto run = launch(spec, 2);
  expect_matches_reference(run, spec, 2);
  // 3 steps x 1 synced backward x the buckets of this model (one: it is small).
  EXPECT_EQ(run.ranks[0].num("allreduces"), 3);
}

// Runs `spec` on `world` ranks and checks it against the single process; then that the tcap
// path replayed at least `min_replays` times on every rank, or (min_replays == 0) that it
// ran eagerly with a reason containing `reason`.
void expect_mode(const std::string& spec, int world, int min_replays, const std::string& reason = "") {
  auto run = launch(spec, world);
  expect_matches_reference(run, spec, world);
  for (const auto& r : run.ranks) {
    const std::string why = r.fields.count("eager_reason") ? r.fields.at("eager_reason") : "";
    if (min_replays > 0) {
      EXPECT_GE(r.num("replays"), min_replays) << why;
    } else {
      EXPECT_EQ(r.num("replays"), 0);
      EXPECT_NE(why.find(reason), std::string::npos) << why;
    }
  }
}

TEST(DistributedDataParallel, CompiledInnerModule) {
  expect_mode("mode=compile_inner,bn=1,steps=4,backend=auto", 2, 2);
}

TEST(DistributedDataParallel, CompiledInnerModuleFourRanksSmallBuckets) {
  expect_mode("mode=compile_inner,bn=1,steps=4,bucket=24", 4, 2);
}

TEST(DistributedDataParallel, CompiledWrapperWithoutBuffers) { expect_mode("mode=compile_wrapper,bn=0,steps=4", 2, 2); }

// The buffer broadcast in the wrapper's forward is a graph op of the compiled forward
// (tcap_dist::ddp_broadcast), so every replay broadcasts rank 0's running statistics.
TEST(DistributedDataParallel, CompiledWrapperWithBufferBroadcast) {
  expect_mode("mode=compile_wrapper,bn=1,steps=4,strict=1", 2, 2);
}

TEST(DistributedDataParallel, CompiledAutograd) { expect_mode("mode=compiled_autograd,bn=1,steps=4", 2, 2); }

// compile_step of a DDP model: the buffer broadcast and the bucket all-reduces are graph
// ops (Note [Collectives in a compiled step]); the first step (it creates the momentum
// buffers) runs once, the next two capture, the rest replay. Under error_on_fallback.
TEST(DistributedDataParallel, CompileStepTwoRanks) {
  const std::string spec = "mode=compile_step,bn=1,steps=6,strict=1,backend=auto";
  auto run = launch(spec, 2);
  expect_matches_reference(run, spec, 2);
  for (const auto& r : run.ranks) {
    EXPECT_GE(r.num("replays"), 3) << r.field("eager_reason") << r.error();
    // Every step synced through the graph op: the captures ran it for real, the replays replayed it.
    EXPECT_EQ(r.num("graph_syncs"), 6);
    EXPECT_EQ(r.num("backwards_synced"), 6);
  }
}

TEST(DistributedDataParallel, CompileStepFourRanksSmallBuckets) {
  const std::string spec = "mode=compile_step,bn=1,steps=5,bucket=24,strict=1";
  auto run = launch(spec, 4);
  expect_matches_reference(run, spec, 4);
  for (const auto& r : run.ranks) {
    EXPECT_GE(r.num("replays"), 2) << r.field("eager_reason") << r.error();
    EXPECT_GE(r.num("buckets"), 3);
    EXPECT_EQ(r.num("allreduces"), 5 * r.num("buckets"));
  }
}

// Micro-batches under no_sync() inside the compiled step: local accumulation, then one
// all-reduce of the sum, replayed.
TEST(DistributedDataParallel, CompileStepWithNoSyncMicroBatches) {
  const std::string spec = "mode=compile_step,bn=0,micro=3,steps=5,strict=1";
  auto run = launch(spec, 2);
  expect_matches_reference(run, spec, 2);
  for (const auto& r : run.ranks) {
    EXPECT_GE(r.num("replays"), 2) << r.field("eager_reason") << r.error();
    EXPECT_EQ(r.num("backwards_synced"), 5);
  }
}

// One rank runs a step eagerly (its hooks all-reduce bucket by bucket) while the other
// replays the graph op: the same collectives, so neither hangs and both stay identical.
TEST(DistributedDataParallel, CompileStepOneRankEagerForAStep) {
  const std::string spec = "mode=compile_step,bn=1,steps=6,eager_rank=1,eager_step=4,bucket=24";
  auto run = launch(spec, 2);
  expect_matches_reference(run, spec, 2);
  EXPECT_GE(run.ranks[0].num("replays"), 3);
  EXPECT_GE(run.ranks[1].num("replays"), 2);
  EXPECT_EQ(run.ranks[0].num("graph_syncs"), 6);
  EXPECT_EQ(run.ranks[1].num("graph_syncs"), 5);
}

TEST(DistributedDataParallel, CompileStepWithFindUnusedParametersRunsEagerlyWithReason) {
  expect_mode("mode=compile_step,bn=1,steps=4,find_unused=1", 2, 0, "find_unused_parameters");
}

TEST(DistributedDataParallel, MismatchedModelsFailAtConstructionOnEveryRank) {
  auto run = launch("mode=eager,wider_rank=1", 2);
  for (const auto& r : run.ranks) {
    EXPECT_NE(r.error().find("the model differs across ranks"), std::string::npos) << r.error();
  }
}

TEST(DistributedDataParallel, UnusedParameterIsAnError) {
  auto run = launch("mode=eager,extra=1", 2);
  for (const auto& r : run.ranks) {
    EXPECT_NE(r.error().find("unused.weight"), std::string::npos) << r.error();
    EXPECT_NE(r.error().find("received no gradient"), std::string::npos) << r.error();
  }
}

// find_unused_parameters: a Linear no rank uses keeps no .grad (SGD leaves it alone); a
// branch only even ranks take is averaged with zeros from the others. Every mode: the
// forward's walk (eager, compiled inner module, compiled autograd) or the engine's final
// callback (the compiled wrapper's replays, which do not run forward()).
void expect_unused_handled(const std::string& spec, int world, int min_replays) {
  auto run = launch(spec, world);
  expect_matches_reference(run, spec, world);
  for (const auto& r : run.ranks) {
    EXPECT_EQ(r.num("unused_grad_defined"), 0);
    EXPECT_GT(r.num("unused_marked"), 0);
    if (min_replays > 0) {
      EXPECT_GE(r.num("replays"), min_replays) << (r.fields.count("eager_reason") ? r.fields.at("eager_reason") : "");
    }
  }
}

TEST(DistributedDataParallel, FindUnusedParametersEager) {
  expect_unused_handled("mode=eager,bn=1,extra=1,branch=1,find_unused=1", 2, 0);
}

TEST(DistributedDataParallel, FindUnusedParametersFourRanksSmallBuckets) {
  expect_unused_handled("mode=eager,bn=0,extra=1,branch=1,find_unused=1,bucket=24,micro=2", 4, 0);
}

TEST(DistributedDataParallel, FindUnusedParametersCompiledInnerModule) {
  expect_unused_handled("mode=compile_inner,bn=1,extra=1,branch=1,find_unused=1,steps=4,backend=auto", 2, 2);
}

TEST(DistributedDataParallel, FindUnusedParametersCompiledAutograd) {
  expect_unused_handled("mode=compiled_autograd,bn=1,extra=1,branch=1,find_unused=1,steps=4,bucket=24", 2, 2);
}

TEST(DistributedDataParallel, FindUnusedParametersCompiledWrapper) {
  expect_unused_handled("mode=compile_wrapper,bn=0,extra=1,branch=1,find_unused=1,steps=4", 2, 2);
}

// find_unused_parameters walks from forward()'s output: a parameter the loss reads outside
// the forward would be reduced twice; it is an error naming it, on every rank.
TEST(DistributedDataParallel, FindUnusedParametersRefusesAParameterUsedOutsideTheForward) {
  auto run = launch("mode=eager,bn=0,extra=1,find_unused=1,outside=1", 2);
  for (const auto& r : run.ranks) {
    EXPECT_NE(r.error().find("unused.weight"), std::string::npos) << r.error();
    EXPECT_NE(r.error().find("used outside the module's forward"), std::string::npos) << r.error();
  }
}

TEST(DistributedDataParallel, RankExitingEarlyFailsTheOthersWithinTheTimeout) {
  const double timeout_s = 4;
  auto run = launch("mode=eager,exit_rank=1", 2, timeout_s);
  EXPECT_NE(run.ranks[0].error().find("all-reduce failed"), std::string::npos) << run.ranks[0].error();
  EXPECT_LT(run.seconds, timeout_s + 15);
}

// A rank that stops answering (stuck, not dead): the others fail once the timeout has
// passed, long before it wakes up.
TEST(DistributedDataParallel, RankStallingFailsTheOthersAfterTheTimeout) {
  const int timeout_s = 3, stall_s = timeout_s + 8;
  auto run = launch("mode=eager,stall_rank=1,stall_s=" + std::to_string(stall_s), 2, timeout_s);
  EXPECT_NE(run.ranks[0].error().find("all-reduce failed"), std::string::npos) << run.ranks[0].error();
  const double failed_after_s = static_cast<double>(run.ranks[0].num("error_at_ms") - run.start_ms) / 1000.0;
  EXPECT_GT(failed_after_s, timeout_s);
  EXPECT_LT(failed_after_s, stall_s);
}

TEST(DistributedDataParallel, RankNeverJoiningFailsWithinTheTimeout) {
  const double timeout_s = 3;
  auto run = launch("mode=eager", 2, timeout_s, /*spawn=*/1);
  EXPECT_NE(run.ranks[0].error().find("tcap::distributed::init"), std::string::npos) << run.ranks[0].error();
  EXPECT_LT(run.seconds, timeout_s + 15);
}

class SeedEachTest : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { at::manual_seed(0); }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--ddp-worker") return run_worker(argv[2], argv[3]);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
  return RUN_ALL_TESTS();
}
