// The scenarios of the DistributedDataParallel tests (ddp_test.cpp, the parent that starts
// the ranks and checks them; ddp_worker.cpp, what each rank runs): the model, the
// scenario a command line describes, each rank's batches.
#pragma once

#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/distributed.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ddp_test {

namespace nn = torch::nn;
constexpr int64_t kBatch = 3;    // per rank
constexpr int64_t kClasses = 5;

// The MNIST-style CNN, at odd sizes: 1x11x11 -> conv 3x3 -> [BatchNorm] -> ReLU -> max_pool 2
// -> Linear. `extra` adds a Linear the forward never uses; `wider` changes the last layer;
// `branch` adds a Linear the forward applies only while take_branch is set.
struct NetImpl : nn::Module {
  NetImpl(bool bn, bool extra, bool wider, bool with_branch = false) : bn_on(bn) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 4, 3)));
    if (bn) norm = register_module("norm", nn::BatchNorm2d(4));
    fc = register_module("fc", nn::Linear(4 * 4 * 4, wider ? kClasses + 1 : kClasses));
    if (extra) unused = register_module("unused", nn::Linear(3, 3));
    if (with_branch) branch = register_module("branch", nn::Linear(kClasses, kClasses));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = conv->forward(x);
    if (bn_on) h = norm->forward(h);
    h = torch::max_pool2d(torch::relu(h), 2);
    auto out = fc->forward(h.flatten(1));
    return take_branch ? out + branch->forward(out) : out;
  }
  bool bn_on;
  bool take_branch = false;
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d norm{nullptr};
  nn::Linear fc{nullptr};
  nn::Linear unused{nullptr};
  nn::Linear branch{nullptr};
};
TORCH_MODULE(Net);

struct Scenario {
  std::string mode = "eager";  // eager | compile_inner | compile_wrapper | compiled_autograd | compile_step
  std::string backend = "eager";
  int steps = 3;
  int micro = 1;        // micro-batches per step; all but the last run under no_sync()
  bool bn = true;
  bool extra = false;   // an unused parameter
  int wider_rank = -1;  // this rank builds a different model
  int exit_rank = -1;   // this rank exits before the second step's backward
  int stall_rank = -1;  // this rank sleeps there for stall_s seconds, then exits
  int stall_s = 0;
  int64_t bucket = 0;   // bucket cap in bytes (both caps; 0: DDP's defaults)
  bool branch = false;  // the branch Linear, taken on even ranks only
  bool find_unused = false;
  bool outside = false;  // the loss also reads the extra Linear, outside the forward
  bool strict = false;   // error_on_fallback: any eager fallback throws
  int eager_rank = -1;   // this rank runs step eager_step under Stance::ForceEager
  int eager_step = -1;
};

// Whether rank r's forward takes the branch.
inline bool takes_branch(const Scenario& s, int rank) { return s.branch && rank % 2 == 0; }

inline Scenario parse(const std::string& spec) {
  Scenario s;
  std::stringstream in(spec);
  std::string kv;
  while (std::getline(in, kv, ',')) {
    const auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "mode") s.mode = v;
    else if (k == "backend") s.backend = v;
    else if (k == "steps") s.steps = std::stoi(v);
    else if (k == "micro") s.micro = std::stoi(v);
    else if (k == "bn") s.bn = v == "1";
    else if (k == "extra") s.extra = v == "1";
    else if (k == "wider_rank") s.wider_rank = std::stoi(v);
    else if (k == "exit_rank") s.exit_rank = std::stoi(v);
    else if (k == "stall_rank") s.stall_rank = std::stoi(v);
    else if (k == "stall_s") s.stall_s = std::stoi(v);
    else if (k == "bucket") s.bucket = std::stoll(v);
    else if (k == "branch") s.branch = v == "1";
    else if (k == "find_unused") s.find_unused = v == "1";
    else if (k == "outside") s.outside = v == "1";
    else if (k == "strict") s.strict = v == "1";
    else if (k == "eager_rank") s.eager_rank = std::stoi(v);
    else if (k == "eager_step") s.eager_step = std::stoi(v);
  }
  return s;
}

// The global batch of step `step`, micro-batch `m`: world*kBatch samples; rank r takes
// rows [r*kBatch, (r+1)*kBatch).
inline std::pair<at::Tensor, at::Tensor> batch(int step, int m, int world) {
  at::manual_seed(1000 + 10 * step + m);
  auto x = torch::randn({world * kBatch, 1, 11, 11});
  auto y = torch::randint(0, kClasses, {world * kBatch});
  return {x, y};
}

inline Net make_net(const Scenario& s, int rank) {
  at::manual_seed(1 + 100 * rank);  // every rank starts elsewhere: DDP broadcasts rank 0's
  Net net(s.bn, s.extra, rank == s.wider_rank, s.branch);
  net->take_branch = takes_branch(s, rank);
  return net;
}

inline std::vector<at::Tensor> state_of(nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

// A rank's run of scenario `spec` (RANK, WORLD_SIZE and MASTER_PORT in the environment),
// its results written to `out`; the process's exit code.
int run_worker(const std::string& spec, const std::string& out);

}  // namespace ddp_test
