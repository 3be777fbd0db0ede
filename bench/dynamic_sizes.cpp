// tcap-bench-dynamic: workloads whose sizes vary from call to call, timed whole (compiles,
// check captures and replays included), as a program that feeds them would see them.
//
//   encoder   nn::TransformerEncoderLayer(64, 4 heads, ff 128), batch 4, sequence lengths
//             drawn from 8..128 in buckets of 8 (lengths repeat, as bucketed batches do);
//             tcap::compile of the layer, forward and backward
//   tagger    Embedding(1000, 64), Linear, LayerNorm, GELU, Linear(->17), cross_entropy over
//             flatten(0, 1); batch 8, the same lengths; compile_step with Adam
//   mlp       Linear(64, 256) GELU Linear(256, 64), inference; batch sizes 1..64
//   generate  greedy generation from a GPT-style decoder (token and position embeddings, a
//             causal mask built from the length, TransformerEncoderLayer(64, 4 heads, ff
//             128), LayerNorm, a head over 512 tokens), batch 4: each call runs the prefix
//             one token longer, from 8 to 126 tokens, then a new prompt (so lengths repeat
//             from the second sequence on, as a server's do); tcap::compile, inference
//   cnn       an image classifier (Conv2d 3->16 stride 2, ReLU, max pool 2, Conv2d 16->32
//             stride 2, ReLU, adaptive average pool, Linear 32->10), batch 8, square images
//             of sides drawn from 32..96 (every side: strided convolutions and pools round
//             their divisions, Note [Sizes the ops derive]); tcap::compile, inference
//
// For each: eager, and tcap with the eager and llvm backends, with the size check on
// (default) and off (check_new_sizes = false), llvm with dynamic = false for cnn (a static
// entry per size, up to the bench's cache_size_limit of 64), and llvm with its kernels compiled in the
// background (compile_in_background; unfused_kernel_calls counts the kernel calls that ran
// their ATen ops meanwhile); then, per variant, the steady state: the
// mean of 40 calls at one fixed size (length 64, batch 32; generate: 61 tokens) after the varying calls, and
// tcap_llvm_static, which makes only those calls (a static entry and its kernels: what a
// replay of a dynamic entry is compared with). Printed per row: the calls' total time and
// its ratio to eager's, the slowest call, compiles (entries built: captures compiled and
// specializations to new sizes), LLVM kernel compiles, size checks, captures, replays,
// eager calls. The calls are the same sequence for every variant (one seed). Usage:
// tcap-bench-dynamic [calls] (Note [Each variant in a process of its own]).
#include <tcap/compile.h>
#include <tcap/train_step.h>

#include "codegen/cpu_llvm/cpu_llvm.h"
#include "runtime/background_compiles.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

namespace {

namespace nn = torch::nn;
using Tensors = std::vector<at::Tensor>;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string variant;
  double ms = 0;
  tcap::CompileStats stats;
  int kernels = 0;  // kernel code compiled by LLVM in the variant's process (Note [Sizes at launch])
  double steady_ms = 0;  // one call at the workload's fixed size, after the calls (kSteadyCalls, mean)
  double worst_ms = 0;   // the slowest of the varying calls
  int64_t unfused = 0;   // kernel calls of the varying calls that ran ATen ops, their kernel compiling
  bool has_stats = false;
};

std::vector<int64_t> lengths(int calls, int64_t lo, int64_t hi, int64_t bucket, uint64_t seed) {
  std::vector<int64_t> out;
  uint64_t s = seed;
  for (int i = 0; i < calls; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t n = lo + static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(hi - lo + 1));
    out.push_back(bucket > 1 ? std::max(lo, (n + bucket - 1) / bucket * bucket) : n);
  }
  return out;
}

struct Variant {
  std::string name;
  std::string backend;  // "" = eager LibTorch
  bool check = true;
  bool static_only = false;  // no varying calls: only the fixed size (a static entry's kernels)
  bool background = false;   // CompileOptions::compile_in_background
  bool dynamic = true;       // CompileOptions::dynamic
};

const std::vector<Variant> kVariants = {
    {"eager", "", true},         {"tcap_eager", "eager", true}, {"tcap_eager_nocheck", "eager", false},
    {"tcap_llvm", "llvm", true}, {"tcap_llvm_nocheck", "llvm", false}, {"tcap_llvm_static", "llvm", true, true},
    {"tcap_llvm_background", "llvm", true, false, true}, {"tcap_llvm_nodynamic", "llvm", true, false, false, false},
};

tcap::CompileOptions options_of(const Variant& v, const std::string& name) {
  tcap::CompileOptions o;
  o.name = name + "_" + v.name;
  o.backend = v.backend;
  o.check_new_sizes = v.check;
  o.compile_in_background = v.background;
  o.dynamic = v.dynamic;
  o.cache_size_limit = 64;
  return o;
}

template <class F>
double time_ms(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

constexpr int kSteadyCalls = 40;

// The varying calls, timed whole.
template <class F>
void varying_calls(Row& r, const Variant& v, const std::vector<int64_t>& seq, F&& one) {
  if (v.static_only) return;
  for (int64_t n : seq) {
    const double ms = time_ms([&] { one(n); });
    r.ms += ms;
    r.worst_ms = std::max(r.worst_ms, ms);
  }
}

// The steady state at one fixed size: a few calls to warm up (a static variant captures and
// compiles there), then kSteadyCalls timed.
template <class F>
void steady_calls(Row& r, int64_t fixed, F&& one) {
  r.unfused = tcap::runtime::background_compile_stats().unfused_runs;
  tcap::wait_for_background_compiles();  // the steady state runs the kernels
  for (int i = 0; i < 4; ++i) one(fixed);
  r.steady_ms = time_ms([&] {
    for (int i = 0; i < kSteadyCalls; ++i) one(fixed);
  }) / kSteadyCalls;
}

std::vector<Row> encoder(int calls, const std::string& only) {
  const auto seq = lengths(calls, 8, 128, 8, 1);
  std::vector<Row> rows;
  for (const auto& v : kVariants) {
    if (v.name != only || (!v.backend.empty() && !tcap::Backend(v.backend).available())) continue;
    torch::manual_seed(0);
    nn::TransformerEncoderLayer layer(nn::TransformerEncoderLayerOptions(64, 4).dim_feedforward(128).dropout(0.0));
    std::function<at::Tensor(const at::Tensor&)> fwd = [&](const at::Tensor& x) { return layer->forward(x); };
    tcap::CompiledFn f;
    if (!v.backend.empty()) {
      f = tcap::compile(layer.ptr(), [&](const Tensors& in) { return Tensors{layer->forward(in[0])}; },
                        options_of(v, "encoder"));
      fwd = [&](const at::Tensor& x) { return f(x)[0]; };
    }
    Row r;
    r.variant = v.name;
    auto one = [&](int64_t t) {
      fwd(torch::randn({t, 4, 64})).pow(2).mean().backward();
      layer->zero_grad();
    };
    varying_calls(r, v, seq, one);
    if (!v.backend.empty()) r.stats = f->stats(), r.has_stats = true;
    steady_calls(r, 64, one);
    rows.push_back(r);
  }
  return rows;
}

struct Tagger : nn::Module {
  Tagger()
      : emb(register_module("emb", nn::Embedding(1000, 64))),
        fc1(register_module("fc1", nn::Linear(64, 128))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({128})))),
        fc2(register_module("fc2", nn::Linear(128, 17))) {}
  at::Tensor forward(const at::Tensor& t) { return fc2->forward(torch::gelu(norm->forward(fc1->forward(emb->forward(t))))); }
  nn::Embedding emb;
  nn::Linear fc1;
  nn::LayerNorm norm;
  nn::Linear fc2;
};

std::vector<Row> tagger(int calls, const std::string& only) {
  const auto seq = lengths(calls, 8, 128, 8, 2);
  std::vector<Row> rows;
  for (const auto& v : kVariants) {
    if (v.name != only || (!v.backend.empty() && !tcap::Backend(v.backend).available())) continue;
    torch::manual_seed(0);
    auto m = std::make_shared<Tagger>();
    torch::optim::Adam opt(m->parameters(), 1e-3);
    auto body = [&](const Tensors& in) {
      opt.zero_grad();
      auto loss = torch::cross_entropy_loss(m->forward(in[0]).flatten(0, 1), in[1].flatten(0, 1));
      loss.backward();
      opt.step();
      return Tensors{loss};
    };
    std::shared_ptr<tcap::CompiledStep> step;
    if (!v.backend.empty()) step = tcap::compile_step(m, opt, body, options_of(v, "tagger"));
    Row r;
    r.variant = v.name;
    auto one = [&](int64_t t) {
      const Tensors in{torch::randint(0, 1000, {8, t}), torch::randint(0, 17, {8, t})};
      if (step) (*step)(in);
      else body(in);
    };
    varying_calls(r, v, seq, one);
    if (step) r.stats = step->stats(), r.has_stats = true;
    steady_calls(r, 64, one);
    rows.push_back(r);
  }
  return rows;
}

struct Decoder : nn::Module {
  Decoder()
      : tok(register_module("tok", nn::Embedding(512, 64))),
        pos(register_module("pos", nn::Embedding(128, 64))),
        block(register_module("block", nn::TransformerEncoderLayer(
                                           nn::TransformerEncoderLayerOptions(64, 4).dim_feedforward(128).dropout(0.0)))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({64})))),
        head(register_module("head", nn::Linear(64, 512))) {}
  at::Tensor forward(const at::Tensor& tokens) {  // [batch, length] -> [batch, length, 512]
    const int64_t t = tokens.size(1);
    auto x = tok->forward(tokens) + pos->forward(torch::arange(t, tokens.options()));
    auto mask = torch::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
    return head->forward(norm->forward(block->forward(x.transpose(0, 1), mask).transpose(0, 1)));
  }
  nn::Embedding tok, pos;
  nn::TransformerEncoderLayer block;
  nn::LayerNorm norm;
  nn::Linear head;
};

std::vector<Row> generate(int calls, const std::string& only) {
  constexpr int64_t kPrompt = 8, kLongest = 127;
  std::vector<Row> rows;
  for (const auto& v : kVariants) {
    if (v.name != only || (!v.backend.empty() && !tcap::Backend(v.backend).available())) continue;
    torch::manual_seed(0);
    auto model = std::make_shared<Decoder>();
    model->eval();
    torch::NoGradGuard no_grad;
    std::function<at::Tensor(const at::Tensor&)> fwd = [&](const at::Tensor& x) { return model->forward(x); };
    tcap::CompiledFn f;
    if (!v.backend.empty()) {
      f = tcap::compile(model, [&](const Tensors& in) { return Tensors{model->forward(in[0])}; }, options_of(v, "generate"));
      fwd = [&](const at::Tensor& x) { return f(x)[0]; };
    }
    Row r;
    r.variant = v.name;
    at::Tensor tokens;
    auto next = [&](int64_t) {  // one token more (a new prompt after the longest)
      if (!tokens.defined() || tokens.size(1) == kLongest) tokens = torch::randint(0, 512, {4, kPrompt});
      auto logits = fwd(tokens);
      tokens = torch::cat({tokens, logits.select(1, -1).argmax(-1, /*keepdim=*/true)}, 1);
    };
    varying_calls(r, v, std::vector<int64_t>(static_cast<size_t>(calls), 0), next);
    if (!v.backend.empty()) r.stats = f->stats(), r.has_stats = true;
    // 61 tokens: most lengths are not a multiple of the vector width (64 hid a kernel whose
    // row tails ran element by element: Note [Masked tails]).
    auto fixed = [&](int64_t) { fwd(torch::randint(0, 512, {4, 61})); };
    steady_calls(r, 61, fixed);
    rows.push_back(r);
  }
  return rows;
}

std::vector<Row> mlp(int calls, const std::string& only) {
  const auto seq = lengths(calls, 1, 64, 1, 3);
  std::vector<Row> rows;
  for (const auto& v : kVariants) {
    if (v.name != only || (!v.backend.empty() && !tcap::Backend(v.backend).available())) continue;
    torch::manual_seed(0);
    nn::Sequential net(nn::Linear(64, 256), nn::GELU(), nn::Linear(256, 64));
    torch::NoGradGuard no_grad;
    std::function<at::Tensor(const at::Tensor&)> fwd = [&](const at::Tensor& x) { return net->forward(x); };
    tcap::CompiledFn f;
    if (!v.backend.empty()) {
      f = tcap::compile(net.ptr(), [&](const Tensors& in) { return Tensors{net->forward(in[0])}; }, options_of(v, "mlp"));
      fwd = [&](const at::Tensor& x) { return f(x)[0]; };
    }
    Row r;
    r.variant = v.name;
    auto one = [&](int64_t b) { fwd(torch::randn({b, 64})); };
    varying_calls(r, v, seq, one);
    if (!v.backend.empty()) r.stats = f->stats(), r.has_stats = true;
    steady_calls(r, 32, one);
    rows.push_back(r);
  }
  return rows;
}

std::vector<Row> cnn(int calls, const std::string& only) {
  const auto seq = lengths(calls, 32, 96, 1, 4);
  std::vector<Row> rows;
  for (const auto& v : kVariants) {
    if (v.name != only || (!v.backend.empty() && !tcap::Backend(v.backend).available())) continue;
    torch::manual_seed(0);
    nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(2).padding(1)), nn::ReLU(),
                       nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Conv2d(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)),
                       nn::ReLU(), nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)), nn::Flatten(), nn::Linear(32, 10));
    torch::NoGradGuard no_grad;
    std::function<at::Tensor(const at::Tensor&)> fwd = [&](const at::Tensor& x) { return net->forward(x); };
    tcap::CompiledFn f;
    if (!v.backend.empty()) {
      f = tcap::compile(net.ptr(), [&](const Tensors& in) { return Tensors{net->forward(in[0])}; }, options_of(v, "cnn"));
      fwd = [&](const at::Tensor& x) { return f(x)[0]; };
    }
    Row r;
    r.variant = v.name;
    auto one = [&](int64_t side) { fwd(torch::randn({8, 3, side, side})); };
    varying_calls(r, v, seq, one);
    if (!v.backend.empty()) r.stats = f->stats(), r.has_stats = true;
    steady_calls(r, 64, one);
    rows.push_back(r);
  }
  return rows;
}

void print(const char* workload, const std::vector<Row>& rows) {
  const double eager = rows.empty() ? 1 : rows[0].ms;
  const double steady_eager = rows.empty() ? 1 : rows[0].steady_ms;
  for (const auto& r : rows) {
    if (r.ms > 0) std::printf("%-8s %-20s %10.1f ms %7.2fx", workload, r.variant.c_str(), r.ms, r.ms / eager);
    else std::printf("%-8s %-20s %13s %8s", workload, r.variant.c_str(), "-", "-");
    std::printf("  steady %7.3f ms %5.2fx", r.steady_ms, r.steady_ms / steady_eager);
    if (r.ms > 0) std::printf("  worst call %7.1f ms", r.worst_ms);
    if (r.has_stats && r.ms > 0) {
      const auto& s = r.stats;
      std::printf("  compiles %3d  kernels %4d  size_checks %3d  captures %3d  replays %4d  eager %3d", s.compiles,
                  r.kernels, s.size_checks, s.captures, s.replays, s.eager_calls);
      if (r.unfused > 0) std::printf("  unfused_kernel_calls %lld", static_cast<long long>(r.unfused));
    } else if (r.has_stats) {
      std::printf("  kernels %4d", r.kernels);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace

// Note [Each variant in a process of its own]: compiled kernels are cached in memory and on
// disk by their kernel IR, so a variant run after another would find the kernels of the
// same sizes compiled already. Without arguments past `calls`, the program runs itself
// once per workload and variant, each with an empty kernel cache folder of its own.
int run_one(int calls, const std::string& workload, const std::string& variant) {
  std::vector<Row> rows;
  if (workload == "encoder") rows = encoder(calls, variant);
  else if (workload == "tagger") rows = tagger(calls, variant);
  else if (workload == "mlp") rows = mlp(calls, variant);
  else if (workload == "generate") rows = generate(calls, variant);
  else if (workload == "cnn") rows = cnn(calls, variant);
  else return 2;
  const int kernels = tcap::codegen::cpu_llvm::cpu_llvm_stats().compiled;
  for (const auto& r : rows) {
    std::printf("%s %s %.3f %d %d %d %d %d %d %.4f %lld %.3f\n", workload.c_str(), r.variant.c_str(), r.ms,
                r.stats.compiles, r.stats.size_checks, r.stats.captures, r.stats.replays, r.stats.eager_calls, kernels,
                r.steady_ms, static_cast<long long>(r.unfused), r.worst_ms);
  }
  return 0;
}

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 200;
  if (argc > 3) return run_one(calls, argv[2], argv[3]);
  std::printf("tcap-bench-dynamic: %d calls per workload, %d threads; time = all calls, compiles and checks included; "
              "each variant in a process of its own with an empty kernel cache\n",
              calls, at::get_num_threads());
  for (const char* workload : {"encoder", "tagger", "mlp", "generate", "cnn"}) {
    std::vector<Row> rows;
    for (const auto& v : kVariants) {
      // Static entries per size only where the sizes the ops derive are the point.
      if (v.name == "tcap_llvm_nodynamic" && std::string(workload) != "cnn") continue;
      char dir[] = "/tmp/tcap-bench-dynamic-XXXXXX";
      if (!mkdtemp(dir)) return 1;
      const std::string cmd = "TCAP_CACHE_DIR=" + std::string(dir) + " /proc/" + std::to_string(getpid()) + "/exe " +
                              std::to_string(calls) + " " + workload + " " + v.name + "; rm -rf " + dir;
      FILE* p = popen(cmd.c_str(), "r");
      if (!p) return 1;
      char line[512];
      while (std::fgets(line, sizeof line, p)) {
        char w[64], name[64];
        Row r;
        long long unfused = 0;
        if (std::sscanf(line, "%63s %63s %lf %d %d %d %d %d %d %lf %lld %lf", w, name, &r.ms, &r.stats.compiles,
                        &r.stats.size_checks, &r.stats.captures, &r.stats.replays, &r.stats.eager_calls,
                        &r.kernels, &r.steady_ms, &unfused, &r.worst_ms) == 12) {
          r.unfused = unfused;
          r.variant = name;
          r.has_stats = !v.backend.empty();
          rows.push_back(r);
        }
      }
      pclose(p);
    }
    print(workload, rows);
  }
  return 0;
}
