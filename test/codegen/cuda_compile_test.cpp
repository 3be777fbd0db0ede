// The cuda backend through tcap::compile: generated kernels against eager on odd sizes,
// broadcast and non-contiguous inputs, float32/float16/bfloat16, on a device (skipped
// without one, saying why) and in the host emulator; CUDA-graph replay and its refusals.
// (Whole training programs on the device: cuda_training_test.cpp.)
#include "codegen/cuda/cuda.h"
#include "runtime/cuda_graphs.h"
#include "cuda_test_util.h"
#include "support/compare.h"
#include "support/cuda_emu.h"
#include "support/log_capture.h"
#include "support/logging.h"
#include "support/modules.h"

#include <tcap/compile.h>
#include <tcap/compiled_autograd.h>
#include <tcap/stance.h>
#include <tcap/train_step.h>

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace {

using namespace tcap::test::cuda_kernels;

// --- generated kernels against eager: on a device, and in the host emulator ------------
//
// The same checks run twice: CudaDevice.* through the `cuda` backend on a GPU (skipped
// without one), CudaEmulated.* on CPU tensors with every kernel the fusion pass forms
// rendered for CUDA and run by the host emulator (Note [CUDA host emulation]).

using Tensors = std::vector<at::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;

enum class Where { Device, Emulator };

torch::TensorOptions on(Where w) {
  return torch::TensorOptions().device(w == Where::Device ? torch::kCUDA : torch::kCPU);
}

int64_t launches(Where w) { return w == Where::Device ? cuda::cuda_stats().launches : cuda_emu::stats().launches; }

// tcap::compile with CUDA kernels against eager: outputs and input gradients, three calls
// on fresh inputs, generated kernels ran.
void check_cuda(Where w, const std::string& name, const Fn& fn, const std::function<Tensors()>& make, double rtol,
                double atol, bool cuda_graphs = false) {
  SCOPED_TRACE(name);
  tcap::CompileOptions o;
  o.name = name;
  o.cuda_graphs = cuda_graphs;
  if (w == Where::Device) {
    o.backend = "cuda";
  } else {
    o.fw_compiler = [](const tcap::ir::Graph& g) { return cuda_emu::compiler(g); };
    o.bw_compiler = o.fw_compiler;
  }
  auto f = tcap::compile(fn, o);
  // With CUDA graphs: call 2 warms the executables up, call 3 captures, call 4 replays.
  for (int call = 0; call < (cuda_graphs ? 4 : 3); ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    Tensors in = make();
    const auto before = launches(w);
    const auto replays_before = tcap::cuda_graph_stats().replays;
    Tensors out = (*f)(in);
    Tensors wts;
    for (const auto& t : out) wts.push_back(torch::randn_like(t));
    if (at::Tensor loss = tcap::testing::weighted_loss(out, wts); loss.defined()) loss.backward();
    const Tensors got_grads = tcap::testing::take_grads(in);
    ASSERT_EQ(f->eager_reason(), "");
    if (call > 0) {
      // A replayed CUDA graph runs the generated kernels without launching them one by one.
      const bool replayed = cuda_graphs && tcap::cuda_graph_stats().replays > replays_before;
      EXPECT_TRUE(launches(w) > before || replayed) << "no generated CUDA kernel ran";
    }
    Tensors ref = fn(in);
    if (at::Tensor loss = tcap::testing::weighted_loss(ref, wts); loss.defined()) loss.backward();
    const Tensors want_grads = tcap::testing::take_grads(in);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_TRUE(tcap::testing::close(out[k].detach().cpu(), ref[k].detach().cpu(), rtol, atol)) << "output " << k;
    }
    auto cpu = [](const at::Tensor& t) { return t.defined() ? t.cpu() : t; };
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TRUE(tcap::testing::close(cpu(got_grads[k]), cpu(want_grads[k]), rtol, atol)) << "grad of input " << k;
    }
  }
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().requires_grad_(true); }

void fused_patterns(Where w) {
  const auto dev = on(w);
  for (int64_t n : {1, 3, 1023, 4097}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    check_cuda(w, "pointwise_broadcast",
               [](const Tensors& in) { return Tensors{torch::gelu(in[0] + in[1]) * torch::sigmoid(in[0]) - 0.5 * in[1]}; },
               [&] { return Tensors{leaf(torch::randn({n, 33}, dev)), leaf(torch::randn({33}, dev))}; }, 1e-4, 1e-5);
    check_cuda(w, "pointwise_rows", [](const Tensors& in) { return Tensors{torch::tanh(in[0]) * in[1] + in[1].exp()}; },
               [&] { return Tensors{leaf(torch::randn({n, 64}, dev)), leaf(torch::randn({64}, dev))}; }, 1e-4, 1e-5);
    check_cuda(w, "noncontiguous",
               [](const Tensors& in) { return Tensors{torch::tanh(in[0].t()) * torch::exp(-in[1]) + torch::cos(in[1])}; },
               [&] {
                 return Tensors{leaf(torch::randn({33, n}, dev)), leaf(torch::randn({n, 66}, dev).slice(1, 0, 66, 2))};
               },
               1e-4, 1e-5);
    check_cuda(w, "softmax", [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; },
               [&] { return Tensors{leaf(torch::randn({n, 1000}, dev))}; }, 1e-4, 1e-6);
    check_cuda(w, "layer_norm",
               [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {33}, in[1], in[2], 1e-5)}; },
               [&] {
                 return Tensors{leaf(torch::randn({n, 33}, dev) * 3 + 1), leaf(torch::randn({33}, dev)),
                                leaf(torch::randn({33}, dev))};
               },
               1e-4, 1e-4);
    check_cuda(w, "reductions",
               [](const Tensors& in) {
                 auto x = in[0] * in[0];
                 return Tensors{x.sum(std::vector<int64_t>{0, 2}), x.mean(-1, true) - x.amax(-1, true), in[0].sum()};
               },
               [&] { return Tensors{leaf(torch::randn({n, 3, 5}, dev))}; }, 1e-4, 1e-4);
    check_cuda(w, "short_softmax", [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; },
               [&] { return Tensors{leaf(torch::randn({n, 24}, dev))}; }, 1e-4, 1e-6);
    check_cuda(w, "column_sum", [](const Tensors& in) { return Tensors{(in[0] * in[0]).sum(0)}; },
               [&] { return Tensors{leaf(torch::randn({n, 1031}, dev))}; }, 1e-4, 1e-4);
    // A linear layer's bias gradient through a ReLU: a column sum with a per-element store.
    check_cuda(w, "bias_relu", [](const Tensors& in) { return Tensors{torch::relu(in[0] + in[1]) * 3.0}; },
               [&] { return Tensors{leaf(torch::randn({n, 96}, dev)), leaf(torch::randn({96}, dev))}; }, 1e-4, 1e-4);
  }
}

void half_and_bfloat16(Where w) {
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto o = on(w).dtype(dtype);
    // One rounding (fused) against eager's per-op rounding: bounded by a few ulps of the dtype.
    const double tol = dtype == at::kHalf ? 4e-3 : 3e-2;
    check_cuda(w, "half_pointwise",
               [](const Tensors& in) { return Tensors{torch::silu(in[0] * in[1] + 1.0), torch::softmax(in[0], -1)}; },
               [&] { return Tensors{leaf(torch::randn({37, 45}, o)), leaf(torch::randn({45}, o))}; }, tol, tol);
  }
}

// A view starting one element in: the vector path's alignment check must refuse it.
void misaligned(Where w) {
  check_cuda(w, "misaligned", [](const Tensors& in) { return Tensors{torch::exp(in[0]) * 2.0}; },
             [&] {
               auto base = torch::randn({4098}, on(w));
               return Tensors{leaf(base.slice(0, 1, 4098))};
             },
             1e-5, 1e-6);
}

// Compiled autograd (docs/compiled-autograd.md) with the backward's kernels on CUDA: an MLP
// block's parameter gradients against the eager engine's, three steps on fresh inputs.
void compiled_autograd_backward(Where w) {
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(33, 64), torch::nn::GELU(), torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})),
                            torch::nn::Linear(64, 10));
  net->to(on(w).device());
  tcap::CompileOptions o;
  o.name = w == Where::Device ? "ca_cuda" : "ca_cuda_emulated";
  if (w == Where::Device) {
    o.backend = "cuda";
  } else {
    o.bw_compiler = [](const tcap::ir::Graph& g) { return cuda_emu::compiler(g); };
  }
  int64_t hits = 0;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    const at::Tensor x = torch::randn({45, 33}, on(w));
    const at::Tensor target = torch::randn({45, 10}, on(w));
    auto loss_of = [&] { return (torch::log_softmax(net->forward(x), -1) * target).sum(); };
    net->zero_grad();
    loss_of().backward();
    std::vector<at::Tensor> want;
    for (const auto& p : net->parameters()) want.push_back(p.grad().clone());
    net->zero_grad();
    const auto before = launches(w);
    {
      tcap::CompiledAutogradGuard ca(o);
      loss_of().backward();
      hits = ca.stats().replays;
    }
    if (step > 0) {
      EXPECT_GT(launches(w), before) << "no generated CUDA kernel ran in the compiled backward";
    }
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(tcap::testing::close(params[i].grad().cpu(), want[i].cpu(), 1e-4, 1e-5)) << "grad of parameter " << i;
    }
  }
  EXPECT_GE(hits, 2) << "the compiled backward did not serve steps 2 and 3";
}

// --- CUDA graphs (Note [CUDA graphs of compiled regions]) ----------------------------

// The forward graph tcap::compile makes of fn (inputs without grad), with every tensor's
// device set to cuda:0 in the metadata: the refusal rules read only the graph.
tcap::ir::Graph forward_graph_on_cuda(const Fn& fn, const Tensors& in) {
  auto captured = std::make_shared<tcap::ir::Graph>();
  tcap::CompileOptions o;
  o.name = "graph_for_cuda_graphs";
  o.fw_compiler = [captured](const tcap::ir::Graph& g) {
    *captured = g;
    return tcap::eager_backend(g);
  };
  auto f = tcap::compile(fn, o);
  (*f)(in);
  (*f)(in);
  EXPECT_GT(captured->values().size(), 0u) << "no forward graph was compiled";
  for (size_t v = 0; v < captured->values().size(); ++v) {
    captured->value(static_cast<tcap::ir::ValueId>(v)).meta.device = c10::Device(c10::kCUDA, 0);
  }
  return *captured;
}

// Note [CUDA sizes at launch] through a dynamic entry: a Linear, GELU, layer norm and
// softmax, and a mean over the batch (its 1/n read at launch), at batch sizes that vary and
// come back. Every call is compared with eager (outputs and the gradients of every input);
// the code built after the first call (a static entry: its kernels' numbers built in) is
// one more code per kernel structure, however many batch sizes follow, plus the codes of
// plans that the small batches change (a short column's lanes), never one per size.
void dynamic_batch(Where w) {
  const auto dev = on(w);
  tcap::CompileOptions o;
  o.name = w == Where::Device ? "dynamic_batch_cuda" : "dynamic_batch_emulated";
  if (w == Where::Device) {
    o.backend = "cuda";
  } else {
    o.fw_compiler = [](const tcap::ir::Graph& g) { return cuda_emu::compiler(g); };
    o.bw_compiler = o.fw_compiler;
  }
  const Fn fn = [](const Tensors& in) {
    const at::Tensor h = torch::layer_norm(torch::gelu(torch::linear(in[0], in[1], in[2])), {64});
    const at::Tensor p = torch::softmax(h * 1.5, -1);
    return Tensors{p, (h * in[0].narrow(1, 0, 1)).mean(0)};
  };
  auto f = tcap::compile(fn, o);
  auto code = [w] {
    if (w == Where::Device) {
      const auto s = cuda::cuda_stats();
      return static_cast<int64_t>(s.compiled + s.disk_hits);
    }
    return cuda_emu::stats().sources;
  };
  const int64_t before = code();
  int64_t after_first = 0;
  const at::Tensor weight = torch::randn({64, 48}, dev) * 0.2, bias = torch::randn({64}, dev);
  const std::vector<int64_t> batches = {8, 16, 5, 33, 16, 64, 7, 5, 40, 8};
  for (size_t call = 0; call < batches.size(); ++call) {
    const int64_t b = batches[call];
    SCOPED_TRACE("batch " + std::to_string(b));
    Tensors in = {leaf(torch::randn({b, 48}, dev)), leaf(weight), leaf(bias)};
    Tensors out = (*f)(in);
    Tensors wts;
    for (const auto& t : out) wts.push_back(torch::randn_like(t));
    tcap::testing::weighted_loss(out, wts).backward();
    const Tensors got_grads = tcap::testing::take_grads(in);
    Tensors ref = fn(in);
    tcap::testing::weighted_loss(ref, wts).backward();
    const Tensors want_grads = tcap::testing::take_grads(in);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_TRUE(tcap::testing::close(out[k].detach().cpu(), ref[k].detach().cpu(), 1e-4, 1e-5)) << "output " << k;
    }
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TRUE(tcap::testing::close(got_grads[k].cpu(), want_grads[k].cpu(), 1e-4, 1e-5)) << "grad of input " << k;
    }
    if (call == 0) after_first = code();
  }
  ASSERT_EQ(f->eager_reason(), "");
  const int64_t first = after_first - before, later = code() - after_first;
  EXPECT_GT(first, 0) << "no kernel was compiled";
  EXPECT_LE(later, first + 2) << first << " codes for the first batch size, " << later << " for the next "
                              << batches.size() - 1 << " calls (" << 6 << " other sizes)";
  std::printf("[ dynamic  ] %s: %lld codes for the first batch size, %lld for the 6 other sizes\n", o.name.c_str(),
              static_cast<long long>(first), static_cast<long long>(later));
}

TEST(CudaGraphs, RefusalsNameTheReason) {
  const Tensors xy{torch::randn({4, 5}), torch::randn({4, 5})};
  EXPECT_EQ(tcap::cuda_graph_refusal(
                forward_graph_on_cuda([](const Tensors& in) { return Tensors{in[0].sin() * in[1] + 1.0}; }, xy)),
            "");
  auto refusal = [&](const Fn& fn) { return tcap::cuda_graph_refusal(forward_graph_on_cuda(fn, xy)); };
  // Random numbers from the default generator replay right (Note [CUDA graphs of compiled
  // regions]); an explicit generator is refused.
  EXPECT_EQ(refusal([](const Tensors& in) { return Tensors{torch::dropout(in[0], 0.5, true)}; }), "");
  // (tcap::compile runs functions with explicit generators eagerly, so the graph is made
  // by hand: the dropout's random op given a generator argument.)
  tcap::ir::Graph with_generator =
      forward_graph_on_cuda([](const Tensors& in) { return Tensors{torch::dropout(in[0], 0.5, true)}; }, xy);
  bool found = false;
  for (const auto& n : with_generator.nodes()) {
    if (!n.draws_random_numbers()) continue;
    tcap::ir::Arg gen;
    gen.kind = tcap::ir::ArgKind::Opaque;
    gen.name = "generator";
    gen.s = "Generator";
    with_generator.edit_node(n.id, [&](tcap::ir::Node& m) { m.args.push_back(gen); });
    found = true;
  }
  ASSERT_TRUE(found) << "no random op in the dropout graph";
  EXPECT_NE(tcap::cuda_graph_refusal(with_generator).find("draws from an explicit generator"), std::string::npos);
  EXPECT_NE(refusal([](const Tensors& in) {
              in[0].add_(1.0);
              return Tensors{in[0] * 2.0};
            }).find("writes into an input"),
            std::string::npos);
  EXPECT_NE(refusal([](const Tensors& in) { return Tensors{in[0].t(), in[1] * 2.0}; }).find("a view of an input"),
            std::string::npos);
  EXPECT_NE(refusal([](const Tensors& in) { return Tensors{in[0] * in[1].sum().item<double>()}; }).find("on the host"),
            std::string::npos);
}

// On the CPU, cuda_graphs changes nothing but a log line saying why.
TEST(CudaGraphs, CpuGraphsRunAsUsualAndSayWhy) {
  tcap::testing::LogCapture logs("graph_breaks");
  tcap::CompileOptions o;
  o.name = "cpu_cuda_graphs";
  o.cuda_graphs = true;
  const Fn fn = [](const Tensors& in) { return Tensors{torch::tanh(in[0]) * 3.0}; };
  auto f = tcap::compile(fn, o);
  for (int call = 0; call < 4; ++call) {
    Tensors in{leaf(torch::randn({6, 7}))};
    Tensors out = (*f)(in);
    out[0].sum().backward();
    EXPECT_TRUE(tcap::testing::close(out[0], fn({in[0].detach()})[0]));
    EXPECT_TRUE(tcap::testing::close(in[0].grad(), 3.0 * (1 - in[0].detach().tanh().pow(2))));
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GE(logs.count("runs without a CUDA graph: value %"), 2) << logs.text();  // forward and backward
  EXPECT_NE(logs.text().find("is on cpu"), std::string::npos) << logs.text();
}

TEST(CudaDevice, CudaGraphsReplayMatchesEager) {
  SKIP_WITHOUT_CUDA_DEVICE();
  ASSERT_TRUE(tcap::cuda_graphs_built()) << "this build has no CUDA graph support";
  tcap::testing::LogCapture logs("graph_breaks,perf");
  const auto s0 = tcap::cuda_graph_stats();
  const auto dev = on(Where::Device);
  check_cuda(Where::Device, "cuda_graphs_mlp",
             [](const Tensors& in) {
               auto h = torch::gelu(torch::mm(in[0], in[1]) + in[2]);
               return Tensors{torch::layer_norm(h, {64}, {}, {}, 1e-5).softmax(-1)};
             },
             [&] {
               return Tensors{leaf(torch::randn({37, 33}, dev)), leaf(torch::randn({33, 64}, dev)),
                              leaf(torch::randn({64}, dev))};
             },
             1e-4, 1e-5, /*cuda_graphs=*/true);
  const auto s1 = tcap::cuda_graph_stats();
  EXPECT_EQ(s1.captures - s0.captures, 2) << "the forward and the backward graph\n" << logs.text();
  EXPECT_GE(s1.replays - s0.replays, 4) << "calls 3 and 4, forward and backward\n" << logs.text();

  // Dropout under replay: from the same generator state, the same mask as eager; from the
  // next state, a new one (a graph that froze its random numbers would repeat the mask).
  tcap::CompileOptions o;
  o.name = "cuda_graphs_dropout";
  o.backend = "cuda";
  o.cuda_graphs = true;
  const Fn fn = [](const Tensors& in) { return Tensors{torch::dropout(torch::tanh(in[0]) * 2.0, 0.5, true)}; };
  auto f = tcap::compile(fn, o);
  const at::Tensor x = torch::randn({61, 67}, dev);
  at::Tensor previous;
  for (int call = 0; call < 8; ++call) {  // eager, forward-only confirmation, warm-up, capture, replays
    SCOPED_TRACE("call " + std::to_string(call + 1));
    torch::manual_seed(1000 + call);
    const at::Tensor got = (*f)({x})[0];
    torch::manual_seed(1000 + call);
    const at::Tensor want = fn({x})[0];
    EXPECT_TRUE(at::equal(got.cpu(), want.cpu()));
    if (previous.defined()) {
      EXPECT_FALSE(at::equal(got.cpu(), previous.cpu())) << "the mask repeats";
    }
    previous = got;
  }
  EXPECT_EQ(f->eager_reason(), "");
  EXPECT_GT(tcap::cuda_graph_stats().replays, s1.replays) << logs.text();

  // Broadcast tensors into a graph: a sum's backward passes an expanded gradient (stride
  // 0), and an input may be expanded; their static copies hold only the distinct elements.
  tcap::CompileOptions o2;
  o2.name = "cuda_graphs_expanded";
  o2.backend = "cuda";
  o2.cuda_graphs = true;
  const Fn g = [](const Tensors& in) { return Tensors{torch::tanh(in[0]) * in[1] + 1.0}; };
  auto f2 = tcap::compile(g, o2);
  const auto s2 = tcap::cuda_graph_stats();
  for (int call = 0; call < 5; ++call) {
    SCOPED_TRACE("expanded, call " + std::to_string(call + 1));
    Tensors x{leaf(torch::randn({29, 31}, dev))};
    const at::Tensor row = torch::randn({31}, dev).expand({29, 31});
    const at::Tensor got = (*f2)({x[0], row})[0];
    got.sum().backward();
    const Tensors got_grad = tcap::testing::take_grads(x);
    const at::Tensor want = g({x[0], row})[0];
    want.sum().backward();
    const Tensors want_grad = tcap::testing::take_grads(x);
    EXPECT_TRUE(tcap::testing::close(got.detach().cpu(), want.detach().cpu(), 1e-5, 1e-6));
    EXPECT_TRUE(tcap::testing::close(got_grad[0].cpu(), want_grad[0].cpu(), 1e-5, 1e-6));
  }
  EXPECT_EQ(f2->eager_reason(), "");
  EXPECT_GE(tcap::cuda_graph_stats().replays - s2.replays, 4) << logs.text();
}

TEST(CudaDevice, FusedPatternsMatchEager) {
  SKIP_WITHOUT_CUDA_DEVICE();
  fused_patterns(Where::Device);
}

TEST(CudaDevice, HalfAndBFloat16ComputeInFloat) {
  SKIP_WITHOUT_CUDA_DEVICE();
  half_and_bfloat16(Where::Device);
}

TEST(CudaDevice, MisalignedInputsTakeTheScalarPath) {
  SKIP_WITHOUT_CUDA_DEVICE();
  misaligned(Where::Device);
}

TEST(CudaDevice, CompiledAutogradBackward) {
  SKIP_WITHOUT_CUDA_DEVICE();
  compiled_autograd_backward(Where::Device);
}

TEST(CudaDevice, DynamicBatchSharesKernelCode) {
  SKIP_WITHOUT_CUDA_DEVICE();
  dynamic_batch(Where::Device);
}

TEST(CudaEmulated, DynamicBatchSharesKernelCode) {
  SKIP_WITHOUT_EMULATOR();
  dynamic_batch(Where::Emulator);
}

TEST(CudaEmulated, CompiledAutogradBackward) {
  SKIP_WITHOUT_EMULATOR();
  compiled_autograd_backward(Where::Emulator);
}

TEST(CudaEmulated, FusedPatternsMatchEager) {
  SKIP_WITHOUT_EMULATOR();
  const auto before = cuda_emu::stats();
  fused_patterns(Where::Emulator);
  // Layer norm's weight and bias gradients and the bias gradient are split column sums.
  EXPECT_GT(cuda_emu::stats().split_launches, before.split_launches);
}

TEST(CudaEmulated, HalfAndBFloat16ComputeInFloat) {
  SKIP_WITHOUT_EMULATOR();
  half_and_bfloat16(Where::Emulator);
}

// Inference (no backward, whose kernels read only aligned tensors): a view one element in
// takes the scalar loop, an aligned tensor the vector path.
TEST(CudaEmulated, VectorPathOnlyWhenAligned) {
  SKIP_WITHOUT_EMULATOR();
  const Fn fn = [](const Tensors& in) { return Tensors{torch::exp(in[0]) * 2.0}; };
  const auto v0 = cuda_emu::stats();
  check_cuda(Where::Emulator, "misaligned_inference", fn, [] { return Tensors{torch::randn({4098}).slice(0, 1)}; },
             1e-5, 1e-6);
  const auto v1 = cuda_emu::stats();
  EXPECT_GT(v1.launches, v0.launches);
  EXPECT_EQ(v1.vector_launches, v0.vector_launches) << "a misaligned view took the vector path";
  check_cuda(Where::Emulator, "aligned_inference", fn, [] { return Tensors{torch::randn({4097})}; }, 1e-5, 1e-6);
  const auto v2 = cuda_emu::stats();
  EXPECT_GT(v2.vector_launches, v1.vector_launches) << "an aligned tensor took the scalar path";
  // Rows (BlockRow's vector path): contiguous rows that start one element in.
  const Fn rows = [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; };
  check_cuda(Where::Emulator, "misaligned_rows", rows,
             [] { return Tensors{torch::randn({7 * 1000 + 1}).slice(0, 1).view({7, 1000})}; }, 1e-5, 1e-6);
  const auto v3 = cuda_emu::stats();
  EXPECT_GT(v3.launches, v2.launches);
  EXPECT_EQ(v3.vector_launches, v2.vector_launches) << "misaligned rows took the vector path";
  check_cuda(Where::Emulator, "aligned_rows", rows, [] { return Tensors{torch::randn({7, 1000})}; }, 1e-5, 1e-6);
  EXPECT_GT(cuda_emu::stats().vector_launches, v3.vector_launches) << "aligned rows took the scalar path";
  misaligned(Where::Emulator);  // and with gradients
}

TEST(CudaBackend, CpuGraphsAreRefusedWithAReason) {
  tcap::CompileOptions o;
  o.backend = "cuda";
  auto f = tcap::compile([](const Tensors& in) { return Tensors{in[0].cos()}; }, o);
  for (int call = 0; call < 2; ++call) {
    Tensors in{leaf(torch::randn({4}))};
    Tensors out = (*f)(in);
    out[0].sum().backward();
    EXPECT_TRUE(tcap::testing::close(in[0].grad(), -in[0].detach().sin()));
  }
  EXPECT_NE(f->eager_reason().find("backend 'cuda' cannot compile"), std::string::npos) << f->eager_reason();
  EXPECT_NE(f->eager_reason().find("has no CUDA tensors"), std::string::npos) << f->eager_reason();
}

}  // namespace
