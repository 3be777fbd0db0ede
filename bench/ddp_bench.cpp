// tcap::DistributedDataParallel step times, started on 1 or 2 local ranks:
//
//   OMP_NUM_THREADS=1 tools/launch.sh 2 build/bench/tcap-ddp-bench [--rounds 7] [--steps 10]
//
// On every rank, one intra-op thread, interleaved in each round (so every variant sees the
// same machine load): a training step of the ddp_mnist CNN (batch 64 per rank) with
//   eager     DistributedDataParallel around the eager model,
//   compiled  the same with the model compiled by tcap::compile (backend "auto"),
//   step      the whole step (forward, backward, all-reduce, SGD) by tcap::compile_step
//             (backend "auto"; the all-reduce is a graph op, after the whole backward),
//   ca        eager forward, the backward under compiled autograd (backend "auto"), the
//             parameters accumulated inside the compiled graph so buckets start early;
//             ca_window / ca_wait are its overlap window and last hook's wait per step,
// and, for the overlap of communication with backward, in eager:
//   bwd_sync    backward with the bucket all-reduces,
//   bwd_nosync  backward under no_sync() (no communication),
//   comm        the same all-reduces (same bucket sizes) alone, started and waited at once.
// hidden = 1 - (bwd_sync - bwd_nosync) / comm: the share of the all-reduce time that ran
// behind the backward; window = the time from the first bucket's all-reduce start to the
// last's (the backward work they can hide behind); wait = the time the last hook waited
// for the all-reduces, per step.
// Rank 0 prints medians over rounds (per-step times, µs) and the p10-p90 spread.
#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/distributed.h>
#include <tcap/train_step.h>

#include "mnist_net.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {


using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, steps = 10;
  int64_t batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::stoll(argv[i + 1]);
  }
  at::set_num_threads(1);
  auto pg = tcap::distributed::init_from_env();
  const int rank = pg->getRank(), world = pg->getSize();
  torch::manual_seed(0);
  MnistNet eager_net(512), compiled_net(512), step_net(512), ca_net(512);
  auto eager = tcap::DistributedDataParallel(eager_net, pg);
  auto compiled = tcap::DistributedDataParallel(compiled_net, pg);
  auto stepped = tcap::DistributedDataParallel(step_net, pg);
  auto ca_ddp = tcap::DistributedDataParallel(ca_net, pg);
  tcap::CompileOptions co;
  co.backend = "auto";
  auto fast = tcap::compile(compiled_net, co);
  compiled->set_forward([fast](const at::Tensor& x) { return fast->forward(x); });
  torch::optim::SGD opt_e(eager->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD opt_c(compiled->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD opt_s(stepped->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD opt_ca(ca_ddp->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::manual_seed(100 + rank);
  auto x = torch::randn({batch, 1, 28, 28});
  auto y = torch::randint(0, 10, {batch});

  auto ca_step = [&] {
    opt_ca.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(ca_ddp->forward(x), y);
    {
      tcap::CompiledAutogradGuard guard(co);
      loss.backward();
    }
    opt_ca.step();
  };
  auto step = [&](tcap::DistributedDataParallel& m, torch::optim::SGD& opt) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(m->forward(x), y).backward();
    opt.step();
  };
  auto whole_step = tcap::compile_step(stepped, opt_s, [&](const std::vector<at::Tensor>& in) {
    opt_s.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(stepped->forward(in[0]), in[1]);
    loss.backward();
    opt_s.step();
    return std::vector<at::Tensor>{loss};
  }, co);
  // Backward only (forward outside the timing), with or without communication.
  auto backward = [&](bool sync) {
    eager_net->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(eager->forward(x), y);
    const auto t0 = Clock::now();
    if (sync) {
      loss.backward();
    } else {
      auto ns = eager->no_sync();
      loss.backward();
    }
    return us_since(t0);
  };
  std::vector<at::Tensor> comm_buffers;
  for (int64_t n : eager->stats().bucket_numel) comm_buffers.push_back(torch::randn({n}));
  auto comm = [&] {
    const auto t0 = Clock::now();
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& b : comm_buffers) {
      std::vector<at::Tensor> one{b};
      works.push_back(pg->allreduce(one));
    }
    for (auto& w : works) w->wait();
    return us_since(t0);
  };

  for (int w = 0; w < 3; ++w) {  // warm-up: the compiled model captures and compiles here
    step(eager, opt_e);
    step(compiled, opt_c);
    (*whole_step)({x, y});
    ca_step();
  }
  std::map<std::string, std::vector<double>> t;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) step(eager, opt_e);
    t["eager"].push_back(us_since(t0) / steps);
    t0 = Clock::now();
    for (int s = 0; s < steps; ++s) step(compiled, opt_c);
    t["compiled"].push_back(us_since(t0) / steps);
    t0 = Clock::now();
    for (int s = 0; s < steps; ++s) (*whole_step)({x, y});
    t["step"].push_back(us_since(t0) / steps);
    const double ca_wait0 = ca_ddp->stats().exposed_wait_us, ca_window0 = ca_ddp->stats().overlap_window_us;
    t0 = Clock::now();
    for (int s = 0; s < steps; ++s) ca_step();
    t["ca"].push_back(us_since(t0) / steps);
    t["ca_window"].push_back((ca_ddp->stats().overlap_window_us - ca_window0) / steps);
    t["ca_wait"].push_back((ca_ddp->stats().exposed_wait_us - ca_wait0) / steps);
    double sync = 0, nosync = 0, c = 0;
    const double wait0 = eager->stats().exposed_wait_us, window0 = eager->stats().overlap_window_us;
    for (int s = 0; s < steps; ++s) sync += backward(true);
    t["wait"].push_back((eager->stats().exposed_wait_us - wait0) / steps);
    t["window"].push_back((eager->stats().overlap_window_us - window0) / steps);
    for (int s = 0; s < steps; ++s) nosync += backward(false);
    for (int s = 0; s < steps; ++s) c += comm();
    t["bwd_sync"].push_back(sync / steps);
    t["bwd_nosync"].push_back(nosync / steps);
    t["comm"].push_back(c / steps);
    t["hidden"].push_back(std::clamp(1.0 - (sync - nosync) / c, 0.0, 1.0));
  }
  if (rank == 0) {
    const auto st = eager->stats();
    std::printf("ranks %d, batch %lld per rank, %lld buckets (", world, static_cast<long long>(batch),
                static_cast<long long>(st.buckets));
    for (size_t k = 0; k < st.bucket_numel.size(); ++k) {
      std::printf("%s%.2f MiB", k ? ", " : "", static_cast<double>(st.bucket_numel[k]) * 4 / 1048576.0);
    }
    std::printf("), compiled replays %d, step replays %d (%s), %d rounds x %d steps\n", fast->stats().replays,
                whole_step->stats().replays,
                whole_step->eager_reason().empty() ? "no fallback" : whole_step->eager_reason().c_str(), rounds, steps);
    for (const char* k : {"eager", "compiled", "step", "ca", "ca_window", "ca_wait", "bwd_sync", "bwd_nosync", "comm", "window", "wait", "hidden"}) {
      if (world == 1 && !std::strcmp(k, "hidden")) {
        std::printf("hidden      n/a (one rank: nothing to hide)\n");
        continue;
      }
      const auto& v = t[k];
      std::printf("%-11s median %10.3f  p10 %10.3f  p90 %10.3f\n", k, quantile(v, 0.5), quantile(v, 0.1),
                  quantile(v, 0.9));
    }
    std::printf("compiled/eager step: %.3f\n", quantile(t["compiled"], 0.5) / quantile(t["eager"], 0.5));
    std::printf("step/eager step: %.3f\n", quantile(t["step"], 0.5) / quantile(t["eager"], 0.5));
    std::printf("ca/eager step: %.3f\n", quantile(t["ca"], 0.5) / quantile(t["eager"], 0.5));
  }
  return 0;
}
