// tcap-rss-probe: what a training loop costs in resident memory, per process. tcap-bench's
// peak_bytes counts tensor bytes through the CPU allocator, so it sees the CPU buffer
// pool's cached blocks but not what glibc malloc keeps after eager frees (bench/RESULTS.md,
// commit dfec3e7). This runs mlp_big's step (Linear(1024,4096) GELU Linear(4096,1024)
// LayerNorm, batch 256, loss mean(out^2), the same as tcap-bench's) in a process of its
// own and prints the process's resident set (VmRSS) and its peak (VmHWM) after the first
// step and at the end. Compare modes in separate runs, interleaved:
//
//   ./build/bench/tcap-rss-probe --mode eager --steps 20
//   ./build/bench/tcap-rss-probe --mode llvm --steps 20         # tcap::compile, llvm backend
//   TCAP_BUFFER_POOL_MB=0 ./build/bench/tcap-rss-probe --mode llvm --steps 20
//
// --mode eager | eager_backend | llvm   (the last two: tcap::compile of the module)
#include <tcap/compile.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// A field of /proc/self/status in KiB, or -1.
long status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  const size_t n = std::strlen(key);
  for (std::string line; std::getline(f, line);) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') return std::atol(line.c_str() + n + 1);
  }
  return -1;
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: tcap-rss-probe [--mode eager|eager_backend|llvm] [--steps N]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "eager";
  int steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mode" && i + 1 < argc) mode = argv[++i];
    else if (arg == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else usage();
  }
  if ((mode != "eager" && mode != "eager_backend" && mode != "llvm") || steps < 2) usage();

  torch::manual_seed(0);
  namespace nn = torch::nn;
  nn::Sequential model{nn::Linear(1024, 4096), nn::GELU(), nn::Linear(4096, 1024),
                       nn::LayerNorm(nn::LayerNormOptions({1024}))};
  const at::Tensor x = torch::randn({256, 1024});
  std::shared_ptr<tcap::CompiledFunction> f;
  if (mode != "eager") {
    tcap::CompileOptions o;
    o.backend = mode == "llvm" ? "llvm" : "eager";
    f = tcap::compile(model.ptr(), [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{model->forward(in[0])}; },
                      o);
  }
  const long start = status_kib("VmRSS");
  long after_first = 0;
  for (int i = 0; i < steps; ++i) {
    for (auto& p : model->parameters()) p.mutable_grad().reset();
    const at::Tensor out = f ? (*f)({x})[0] : model->forward(x);
    out.square().mean().backward();
    if (i == 0) after_first = status_kib("VmHWM");
  }
  if (f && f->stats().replays < steps - 2) {
    std::fprintf(stderr, "tcap-rss-probe: only %d of %d steps replayed compiled code\n", f->stats().replays, steps);
    return 1;
  }
  std::printf("mode %s steps %d: VmRSS at start %ld KiB; VmHWM after step 1 %+ld KiB, after step %d %+ld KiB; "
              "VmRSS at the end %+ld KiB\n",
              mode.c_str(), steps, start, after_first - start, steps, status_kib("VmHWM") - start,
              status_kib("VmRSS") - start);
  return 0;
}
