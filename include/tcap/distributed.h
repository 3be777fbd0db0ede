// Data-parallel training across processes on LibTorch's c10d (DESIGN.md D13): the C++
// counterpart of torch.nn.parallel.DistributedDataParallel, plus the torchrun-style
// start-up of a process group.
//
//   auto pg = tcap::distributed::init_from_env();     // RANK, WORLD_SIZE, MASTER_ADDR/PORT
//   auto ddp = tcap::DistributedDataParallel(model, pg);
//   torch::optim::SGD opt(ddp->parameters(), 0.1);
//   for (...) {
//     opt.zero_grad();
//     torch::nll_loss(ddp->forward(x), y).backward();  // gradients averaged over ranks
//     opt.step();
//   }
//
// At construction the model's parameter and buffer shapes are compared across ranks (a
// mismatch is an error on every rank) and rank 0's values are broadcast. Gradients are
// gathered into buckets (25 MiB, the first 1 MiB, as PyTorch's DDP) and each bucket's
// all-reduce starts as soon as its last gradient is accumulated, while the backward goes
// on; the last one waits for all of them and writes the averages back into .grad. This
// works under tcap::compile (of the inner module or of the wrapper) and under
// tcap::CompiledAutogradGuard; tcap::compile_step runs a step with a DDP model eagerly,
// saying why. See docs/distributed.md.
//
// Only present when tcap was built with TCAP_HAVE_DISTRIBUTED (Gloo headers found at
// build time); the header itself needs only LibTorch's c10d headers.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tcap {

namespace distributed {

struct InitOptions {
  // How long a rank waits for the others: at start-up (the TCPStore rendezvous) and in
  // every collective. A rank that dies or never joins makes the others fail with an error
  // after at most this long (a closed connection fails them at once).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Gloo's worker threads per process group.
  int threads = 2;
};

// A Gloo process group over a TCPStore served by rank 0 at addr:port (rank 0 binds the
// port; the others connect to it). Loopback or a real interface: Gloo binds to `addr`'s
// interface for its own connections.
c10::intrusive_ptr<c10d::Backend> init(int rank, int world_size, const std::string& addr, int port,
                                       InitOptions options = {});

// init() from the variables torchrun and tools/launch.sh set: RANK, WORLD_SIZE,
// MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500). TCAP_DIST_TIMEOUT_S, when
// set, overrides options.timeout.
c10::intrusive_ptr<c10d::Backend> init_from_env(InitOptions options = {});

}  // namespace distributed

struct DDPOptions {
  // Gradient bytes per bucket; a bucket's all-reduce starts when all its gradients are
  // in (PyTorch's bucket_cap_mb = 25).
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  // The first bucket (the last parameters, whose gradients come first) is smaller, so
  // communication starts early (PyTorch's _DEFAULT_FIRST_BUCKET_BYTES).
  int64_t first_bucket_cap_bytes = 1024 * 1024;
  // Broadcast rank 0's buffers (BatchNorm's running statistics) before every forward,
  // as PyTorch's broadcast_buffers=True.
  bool broadcast_buffers = true;
  // Parameters that get no gradient in a backward (a branch the forward did not take on
  // this rank, a GAN's other half) are reduced as zeros instead of being an error, as
  // PyTorch's find_unused_parameters=True: forward() walks the autograd graph from its
  // output and marks the parameters it cannot reach ready as soon as the backward starts;
  // under the engine, parameters still missing at the end of the backward are marked then.
  // A parameter no rank used keeps its .grad as it was; one used on some ranks gets the
  // average over all ranks, with zeros for the others. Costs the walk per forward and one
  // small all-reduce per backward.
  bool find_unused_parameters = false;
};

// Counters since construction, for tests and benchmarks.
struct DDPStats {
  int64_t backwards_synced = 0;   // backwards whose gradients were all-reduced
  int64_t allreduces = 0;         // bucket all-reduces started
  int64_t buckets = 0;            // buckets per backward
  std::vector<int64_t> bucket_numel;  // elements per bucket, in launch order
  double exposed_wait_us = 0;     // time the last bucket's hook waited for the all-reduces
  // Time from the first bucket's all-reduce start to the last's, summed over backwards:
  // the backward work the all-reduces can run behind.
  double overlap_window_us = 0;
  double buffer_broadcast_us = 0;
  // With find_unused_parameters: parameters reduced without a gradient of this rank, summed
  // over backwards (found unreachable by forward()'s walk, or missing at the backward's end).
  int64_t unused_marked = 0;
  // Backwards synced through the graph op tcap_dist::ddp_all_reduce: compile_step's
  // captures and replays (Note [Collectives in a compiled step]); also in backwards_synced.
  int64_t graph_syncs = 0;
};

// The wrapper is a module holding the wrapped one as the submodule "module" (so
// parameters() and named_parameters() are the model's, prefixed "module." as in PyTorch).
class DistributedDataParallelImpl : public torch::nn::Module {
 public:
  using Forward = std::function<at::Tensor(const at::Tensor&)>;

  // `forward` runs the model (the wrapped module's, or a compiled one: see set_forward).
  DistributedDataParallelImpl(std::shared_ptr<torch::nn::Module> module, Forward forward,
                              c10::intrusive_ptr<c10d::Backend> process_group, DDPOptions options = {});
  // A module with a Tensor forward(Tensor).
  template <class M>
  DistributedDataParallelImpl(const torch::nn::ModuleHolder<M>& module,
                              c10::intrusive_ptr<c10d::Backend> process_group, DDPOptions options = {})
      : DistributedDataParallelImpl(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                                    forward_of(module.ptr()), std::move(process_group), options) {}
  ~DistributedDataParallelImpl() override;

  // pre_forward(), then the model's forward.
  at::Tensor forward(const at::Tensor& x);
  // What forward() does before the model: checks that the previous synced backward
  // reduced every gradient (an unused parameter is an error) and broadcasts rank 0's
  // buffers. Call it before a forward that does not go through forward().
  void pre_forward();
  // Replaces the model's forward, e.g. by a compiled one:
  //   auto fast = tcap::compile(model);
  //   ddp->set_forward([fast](const at::Tensor& x) { return fast->forward(x); });
  void set_forward(Forward forward);

  // While a NoSync is alive, backwards accumulate gradients locally (no communication);
  // the next backward outside it all-reduces the accumulated sum, as PyTorch's no_sync().
  // The backward, not only the forward, must run inside the scope.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallelImpl& ddp);
    ~NoSync();
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DistributedDataParallelImpl* ddp_;
    bool prev_ = true;
  };
  NoSync no_sync() { return NoSync(*this); }

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const c10::intrusive_ptr<c10d::Backend>& process_group() const { return process_group_; }
  int rank() const;
  int world_size() const;
  DDPStats stats() const;

  struct Reducer;  // csrc/distributed/reducer.h

 private:
  template <class M>
  static Forward forward_of(const std::shared_ptr<M>& m) {
    M* raw = m.get();  // the wrapper keeps the module alive (registered submodule)
    return [raw](const at::Tensor& x) { return raw->forward(x); };
  }

  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
  c10::intrusive_ptr<c10d::Backend> process_group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
  std::vector<at::Tensor> buffers_;
  double buffer_broadcast_us_ = 0;
};
TORCH_MODULE(DistributedDataParallel);

}  // namespace tcap
