// Data-parallel training of an MNIST-style CNN on random data with
// tcap::DistributedDataParallel. Start it on 2 local ranks:
//
//   tools/launch.sh 2 build/examples/ddp_mnist [--steps 20] [--batch 32] [--compile | --compile-step]
//
// Each rank draws its own batch; gradients are averaged across ranks, so every rank ends
// with the same weights (the last line of each rank prints a checksum of them).
// --compile compiles the model's forward and backward with tcap::compile (backend "auto");
// --compile-step compiles the whole step (forward, backward, the gradient all-reduce and
// SGD) with tcap::compile_step.
#include <tcap/compile.h>
#include <tcap/distributed.h>
#include <tcap/train_step.h>

#include "mnist_net.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>


int main(int argc, char** argv) {
  int steps = 20;
  int64_t batch = 32;
  bool compile = false, compile_step = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batch = std::stoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--compile")) compile = true;
    else if (!std::strcmp(argv[i], "--compile-step")) compile_step = true;
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--batch B] [--compile | --compile-step]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto pg = tcap::distributed::init_from_env();
    const int rank = pg->getRank();
    torch::manual_seed(rank);  // different initial weights: DDP broadcasts rank 0's
    MnistNet net;
    auto ddp = tcap::DistributedDataParallel(net, pg);
    std::shared_ptr<tcap::CompiledFunction> compiled;
    if (compile) {
      tcap::CompileOptions o;
      o.backend = "auto";
      compiled = tcap::compile(net, o);
      ddp->set_forward([compiled](const at::Tensor& x) { return compiled->forward(x); });
    }
    torch::optim::SGD opt(ddp->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    // A fixed random "dataset" per rank: the loss goes down as the model fits it.
    torch::manual_seed(100 + rank);
    auto x = torch::randn({batch, 1, 28, 28});
    auto y = torch::randint(0, 10, {batch});
    auto train_step = [&](const std::vector<at::Tensor>& in) {
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(ddp->forward(in[0]), in[1]);
      loss.backward();
      opt.step();
      return std::vector<at::Tensor>{loss};
    };
    std::shared_ptr<tcap::CompiledStep> step_fn;
    if (compile_step) {
      tcap::CompileOptions o;
      o.backend = "auto";
      step_fn = tcap::compile_step(ddp, opt, train_step, o);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = 0; step < steps; ++step) {
      auto loss = step_fn ? (*step_fn)({x, y})[0] : train_step({x, y})[0];
      if (rank == 0 && (step % 5 == 0 || step + 1 == steps)) {
        std::printf("step %d loss %.4f\n", step, loss.item<double>());
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    double checksum = 0;
    for (const auto& p : ddp->parameters()) checksum += p.detach().abs().sum().item<double>();
    std::printf("rank %d of %d: %d steps in %.0f ms, %lld all-reduces, weights checksum %.6f%s\n", rank,
                pg->getSize(), steps, ms, static_cast<long long>(ddp->stats().allreduces), checksum,
                compiled  ? (" (compiled: " + std::to_string(compiled->stats().replays) + " replays)").c_str()
                : step_fn ? (" (compiled step: " + std::to_string(step_fn->stats().replays) + " replays)").c_str()
                          : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_mnist: %s\n", e.what());
    return 1;
  }
  return 0;
}
