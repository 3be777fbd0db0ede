// The fusion pass and the llvm backend end to end: which ops share a kernel, and every
// fused pattern compared with eager (values and gradients) on odd sizes, broadcast and
// non-contiguous inputs, NaN/Inf, bfloat16, and with 1 and 2 threads. Inputs are random
// but seeded (test/support/seeded_main.cpp seeds before every test).
//
// Tolerances (vs eager on the same inputs): float32 rtol 1e-4 atol 1e-5 (libmvec's
// transcendentals are within 4 ulp; fused chains round once instead of per op; sums are
// reassociated); float64 rtol 1e-9 atol 1e-11; bfloat16 against float64 instead (fused
// kernels compute in float32 and round once, eager rounds after every op; see
// no_worse_than_eager).

#include "fusion_checks.h"
#include "runtime/graph_executable.h"

using namespace tcap::testing::fusion;

namespace {

struct Case {
  std::string name;
  Fn fn;
  // n = the odd size under test
  std::function<Tensors(int64_t n, at::ScalarType dtype)> inputs;
};

std::vector<Case> cases() {
  auto opts = [](at::ScalarType t) { return torch::TensorOptions().dtype(t); };
  return {
      {"pointwise_broadcast",
       [](const Tensors& in) { return Tensors{torch::gelu(in[0] + in[1]) * torch::sigmoid(in[0]) - 0.5 * in[1]}; },
       [=](int64_t n, at::ScalarType t) {
         return Tensors{leaf(torch::randn({n, 33}, opts(t))), leaf(torch::randn({33}, opts(t)))};
       }},
      {"pointwise_noncontiguous",
       [](const Tensors& in) { return Tensors{torch::tanh(in[0].t()) * torch::exp(-in[1]) + torch::cos(in[1])}; },
       [=](int64_t n, at::ScalarType t) {
         return Tensors{leaf(torch::randn({33, n}, opts(t))), leaf(torch::randn({n, 66}, opts(t)).slice(1, 0, 66, 2))};
       }},
      {"softmax_last",
       [](const Tensors& in) { return Tensors{torch::softmax(in[0] * 2.0, -1)}; },
       [=](int64_t n, at::ScalarType t) { return Tensors{leaf(torch::randn({n, 33}, opts(t)))}; }},
      {"log_softmax_dim0",
       [](const Tensors& in) { return Tensors{torch::log_softmax(in[0], 0)}; },
       [=](int64_t n, at::ScalarType t) { return Tensors{leaf(torch::randn({n, 5}, opts(t)))}; }},
      {"layer_norm",
       [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {33}, in[1], in[2], 1e-5)}; },
       [=](int64_t n, at::ScalarType t) {
         return Tensors{leaf(torch::randn({n, 33}, opts(t)) * 3 + 1), leaf(torch::randn({33}, opts(t))),
                        leaf(torch::randn({33}, opts(t)))};
       }},
      {"layer_norm_3d_no_affine_noncontiguous",
       [](const Tensors& in) { return Tensors{torch::layer_norm(in[0].transpose(0, 1) * 2.0, {3, 5})}; },
       [=](int64_t n, at::ScalarType t) { return Tensors{leaf(torch::randn({3, n, 5}, opts(t)))}; }},
      {"layer_norm_weight_only_then_gelu",
       [](const Tensors& in) {
         return Tensors{torch::gelu(torch::layer_norm(in[0] + in[2], {17}, in[1], {}, 1e-6))};
       },
       [=](int64_t n, at::ScalarType t) {
         return Tensors{leaf(torch::randn({n, 17}, opts(t))), leaf(torch::randn({17}, opts(t))),
                        leaf(torch::randn({17}, opts(t)))};
       }},
      {"reductions",
       [](const Tensors& in) {
         auto x = in[0] * in[0];
         return Tensors{x.sum(std::vector<int64_t>{0, 2}), x.mean(-1, /*keepdim=*/true) - x.amax(-1, true), in[0].sum()};
       },
       [=](int64_t n, at::ScalarType t) { return Tensors{leaf(torch::randn({n, 3, 5}, opts(t)))}; }},
      // A small matmul is a kernel at n = 1 and 3, a BLAS call at 1023 and 4097 (Note
      // [Small matmuls as kernels]); the backward's matmuls cross the limit at other sizes.
      {"linear_relu",
       [](const Tensors& in) { return Tensors{torch::relu(torch::nn::functional::linear(in[0], in[1], in[2]))}; },
       [=](int64_t n, at::ScalarType t) {
         return Tensors{leaf(torch::randn({n, 10}, opts(t))), leaf(torch::randn({7, 10}, opts(t))),
                        leaf(torch::randn({7}, opts(t)))};
       }},
      {"mse_loss",
       [](const Tensors& in) { return Tensors{torch::mse_loss(torch::relu(in[0]), in[1])}; },
       [=](int64_t n, at::ScalarType t) {
         return Tensors{leaf(torch::randn({n, 7}, opts(t))), torch::randn({n, 7}, opts(t))};
       }},
  };
}

using Param = std::tuple<size_t, int64_t, int>;

class FusedPatterns : public ::testing::TestWithParam<Param> {};

TEST_P(FusedPatterns, MatchEagerFloat32) {
  std::string why;
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  const auto all = cases();
  const auto& c = all.at(std::get<0>(GetParam()));
  const int64_t n = std::get<1>(GetParam());
  const int threads = std::get<2>(GetParam());
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(threads);
  torch::manual_seed(static_cast<uint64_t>(n * 31 + threads));
  check_against_eager(c.name, c.fn, [&] { return c.inputs(n, at::kFloat); }, at::kFloat);
  at::set_num_threads(saved_threads);
}

TEST_P(FusedPatterns, MatchEagerFloat64) {
  std::string why;
  if (!tcap::codegen::cpu_llvm::cpu_llvm_available(&why)) GTEST_SKIP() << why;
  if (std::get<2>(GetParam()) != 2) GTEST_SKIP() << "float64 runs with 2 threads only";
  const auto all = cases();
  const auto& c = all.at(std::get<0>(GetParam()));
  const int64_t n = std::get<1>(GetParam());
  torch::manual_seed(static_cast<uint64_t>(n * 17));
  check_against_eager(c.name, c.fn, [&] { return c.inputs(n, at::kDouble); }, at::kDouble);
}

INSTANTIATE_TEST_SUITE_P(Fusion, FusedPatterns,
                         ::testing::Combine(::testing::Range<size_t>(0, cases().size()),
                                            ::testing::Values<int64_t>(1, 3, 1023, 4097), ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return cases().at(std::get<0>(info.param)).name + "_n" +
                                  std::to_string(std::get<1>(info.param)) + "_t" +
                                  std::to_string(std::get<2>(info.param));
                         });


// A kernel with work for several chunks runs on every intra-op thread: the launcher's
// at::parallel_for really splits (Note [at::parallel_for needs OpenMP in the caller];
// without OpenMP it silently ran everything on the calling thread).
TEST_F(Fusion, KernelsUseTheIntraOpThreads) {
  tcap::CompileOptions options;
  options.name = "threads";
  options.backend = "llvm";
  auto f = tcap::compile([](const Tensors& in) { return Tensors{(in[0] * 2 + 1).tanh()}; }, options);
  const int saved_threads = at::get_num_threads();
  for (int threads : {2, 1}) {
    at::set_num_threads(threads);
    const at::Tensor x = torch::randn({1 << 20});
    for (int call = 0; call < 2; ++call) {  // the first call captures
      const auto before = tcap::runtime::runtime_stats();
      const Tensors out = (*f)({x});
      const auto after = tcap::runtime::runtime_stats();
      ASSERT_TRUE(torch::allclose(out[0], (x * 2 + 1).tanh(), 1e-5, 1e-6));
      if (call == 0) continue;
      EXPECT_EQ(after.launches - before.launches, 1) << threads << " threads";
      EXPECT_EQ(after.split_launches - before.split_launches, threads > 1 ? 1 : 0) << threads << " threads";
    }
  }
  at::set_num_threads(saved_threads);
}

TEST_F(Fusion, CosCosForwardAndBackwardAreOneKernelEach) {
  Seen seen;
  tcap::CompileOptions options = spied(&seen, "coscos");
  auto fn = [](const Tensors& in) { return Tensors{torch::cos(torch::cos(in[0] + in[1] + in[2] + in[3]))}; };
  auto f = tcap::compile(fn, options);
  auto make = [] {
    Tensors in;
    for (int i = 0; i < 4; ++i) in.push_back(leaf(torch::randn({67, 129})));
    return in;
  };
  Tensors in = make();
  (*f)(in)[0].sum().backward();
  ASSERT_EQ(seen.results.size(), 2u);
  const auto& fw = seen.results[0];
  ASSERT_EQ(fw.groups.size(), 1u) << fw.explain();
  EXPECT_EQ(fw.groups[0].nodes.size(), 5u) << fw.explain();  // add, add, add, cos, cos
  EXPECT_EQ(fw.groups[0].inputs.size(), 4u);
  EXPECT_EQ(fw.groups[0].kernel.sizes, std::vector<int64_t>{67 * 129}) << "contiguous dims were not coalesced";
  EXPECT_EQ(fw.graph.num_calls(), 1u) << tcap::ir::to_string(fw.graph);
  const auto& bw = seen.results[1];
  ASSERT_EQ(bw.groups.size(), 1u) << bw.explain();
  // Note [Repeated gradient outputs]: the one gradient is written once per input.
  EXPECT_EQ(bw.groups[0].outputs.size(), 4u) << bw.explain();
  EXPECT_EQ(bw.graph.num_calls(), 1u) << tcap::ir::to_string(bw.graph);
  check_against_eager("coscos", fn, make, at::kFloat);
}

TEST_F(Fusion, SoftmaxIsOneRowKernelAndMatmulStaysATen) {
  Seen seen;
  tcap::CompileOptions options = spied(&seen);
  auto fn = [](const Tensors& in) { return Tensors{torch::softmax(torch::mm(in[0], in[1]) + in[2], -1)}; };
  auto f = tcap::compile(fn, options);
  // 9 * 70 * 61 multiply-adds: above the small-matmul limit (Note [Small matmuls as kernels]).
  Tensors in{leaf(torch::randn({9, 70})), leaf(torch::randn({70, 61})), leaf(torch::randn({61}))};
  (*f)(in)[0].sum().backward();
  ASSERT_EQ(seen.results.size(), 2u);
  const auto& fw = seen.results[0];
  ASSERT_EQ(fw.groups.size(), 1u) << fw.explain();
  EXPECT_EQ(fw.groups[0].kernel.num_reduce_dims, 1) << fw.explain();
  EXPECT_NE(fw.explain().find("aten::mm: 38430 multiply-adds, above the small-matmul limit"), std::string::npos)
      << fw.explain();
}

// Note [Small matmuls as kernels]: a matmul of a few multiply-adds is a kernel over its
// own space, with the pointwise ops on its result (a Linear's bias, the ReLU after it) in
// the same kernel; the ops after a row op or a second matmul start their own.
TEST_F(Fusion, SmallMatmulsAreKernelsWithTheirEpilogue) {
  Seen seen;
  tcap::CompileOptions options = spied(&seen);
  // in: x [3, 10], w1 [5, 10], b1 [5], w2 [2, 5], b2 [2] (a 10-5-2 MLP).
  auto fn = [](const Tensors& in) {
    auto h = torch::relu(torch::nn::functional::linear(in[0], in[1], in[2]));
    return Tensors{torch::softmax(torch::nn::functional::linear(h, in[3], in[4]), 1)};
  };
  auto f = tcap::compile(fn, options);
  Tensors in{leaf(torch::randn({3, 10})), leaf(torch::randn({5, 10})), leaf(torch::randn({5})),
             leaf(torch::randn({2, 5})), leaf(torch::randn({2}))};
  (*f)(in)[0].sum().backward();
  ASSERT_EQ(seen.results.size(), 2u);
  const auto& fw = seen.results[0];
  std::vector<std::string> names;
  for (const auto& gr : fw.groups) names.push_back(gr.name);
  EXPECT_EQ(names, (std::vector<std::string>{"fused_0_addmm_relu", "fused_1_addmm", "fused_2__softmax"})) << fw.explain();
  EXPECT_EQ(fw.groups[0].kernel.sizes, (std::vector<int64_t>{3, 5, 10})) << fw.explain();
  for (const auto& n : fw.graph.nodes()) {
    EXPECT_TRUE(n.kind != tcap::ir::NodeKind::Call || n.op != "aten::addmm") << tcap::ir::to_string(fw.graph);
  }
  // The backward's matmuls (the gradients of x, h and both weights) are kernels too.
  const auto& bw = seen.results[1];
  int matmul_kernels = 0;
  for (const auto& gr : bw.groups) matmul_kernels += gr.name.find("_mm") != std::string::npos;
  EXPECT_EQ(matmul_kernels, 4) << bw.explain();
  // Note [Views read through their base]: no transposes or views between the kernels.
  for (const auto& n : bw.graph.nodes()) {
    EXPECT_TRUE(n.kind != tcap::ir::NodeKind::Call || n.op == tcap::fuse::kFusedOp) << tcap::ir::to_string(bw.graph);
  }
  check_against_eager("mlp", fn, [] {
    return Tensors{leaf(torch::randn({3, 10})), leaf(torch::randn({5, 10})), leaf(torch::randn({5})),
                   leaf(torch::randn({2, 5})), leaf(torch::randn({2}))};
  }, at::kFloat);
}

// Every matmul form against eager: transposed and sliced operands, bmm and baddbmm,
// addmm's beta and alpha, a bias broadcast along either dim, beta = 0 over a NaN bias (eager
// ignores it), a contracted size of 1, float64 and bfloat16.
TEST_F(Fusion, SmallMatmulFormsMatchEager) {
  struct MatmulCase {
    std::string name;
    Fn fn;
    std::function<Tensors(at::ScalarType)> inputs;
  };
  auto o = [](at::ScalarType t) { return torch::TensorOptions().dtype(t); };
  const std::vector<MatmulCase> all = {
      {"mm_transposed_sliced", [](const Tensors& in) { return Tensors{torch::mm(in[0].t(), in[1].slice(1, 0, 14, 2))}; },
       [=](at::ScalarType t) { return Tensors{leaf(torch::randn({6, 3}, o(t))), leaf(torch::randn({6, 14}, o(t)))}; }},
      {"mm_k1", [](const Tensors& in) { return Tensors{torch::mm(in[0], in[1]) * 2.0}; },
       [=](at::ScalarType t) { return Tensors{leaf(torch::randn({5, 1}, o(t))), leaf(torch::randn({1, 7}, o(t)))}; }},
      {"addmm_beta_alpha_column_bias",
       [](const Tensors& in) { return Tensors{torch::addmm(in[0], in[1], in[2], 0.5, -2.0).tanh()}; },
       [=](at::ScalarType t) {
         return Tensors{leaf(torch::randn({7, 1}, o(t))), leaf(torch::randn({7, 9}, o(t))), leaf(torch::randn({9, 3}, o(t)))};
       }},
      {"addmm_beta0_ignores_nan",
       [](const Tensors& in) { return Tensors{torch::addmm(in[0], in[1], in[2], 0.0, 1.5)}; },
       [=](at::ScalarType t) {
         return Tensors{torch::full({4}, std::numeric_limits<double>::quiet_NaN(), o(t)), leaf(torch::randn({3, 5}, o(t))),
                        leaf(torch::randn({5, 4}, o(t)))};
       }},
      {"bmm", [](const Tensors& in) { return Tensors{torch::bmm(in[0], in[1].transpose(1, 2))}; },
       [=](at::ScalarType t) { return Tensors{leaf(torch::randn({3, 4, 6}, o(t))), leaf(torch::randn({3, 5, 6}, o(t)))}; }},
      {"baddbmm_row_bias",
       [](const Tensors& in) { return Tensors{torch::baddbmm(in[0], in[1], in[2], 1.0, 0.25).relu()}; },
       [=](at::ScalarType t) {
         return Tensors{leaf(torch::randn({1, 5}, o(t))), leaf(torch::randn({2, 3, 4}, o(t))),
                        leaf(torch::randn({2, 4, 5}, o(t)))};
       }},
  };
  for (const auto& c : all) {
    for (at::ScalarType t : {at::kFloat, at::kDouble, at::kBFloat16}) {
      check_against_eager(c.name + "_" + std::string(c10::toString(t)), c.fn, [&] { return c.inputs(t); }, t);
    }
  }
}

// Note [Views read through their base]: a view of an input that only a kernel reads (the
// transpose here) and a view of a kernel's result that nothing else reads (the flattened
// sum) are no calls of their own: the kernel reads the input's buffer and writes the view's
// tensor. Its guard checks the base: an input with other strides runs the fallback graph,
// view node included, with the same results.
TEST_F(Fusion, ViewsAreReadAndWrittenThroughTheirBase) {
  tcap::fuse::FusionResult fused;
  auto kernels = std::make_shared<tcap::runtime::KernelTable>();
  tcap::CompileOptions options;
  options.fw_compiler = [&](const tcap::ir::Graph& g) {
    tcap::fuse::FusionOptions o;
    o.compile = [&](const tcap::fuse::FusedGroup& fg, std::string*) { return add_llvm_kernel(fg, kernels.get()); };
    fused = tcap::fuse::fuse(g, o);
    return tcap::runtime::interpreter_executable(fused.graph, "views", false, kernels);
  };
  auto fn = [](const Tensors& in) {
    return Tensors{(in[0].t() * 2.0 + in[1]).relu().sum(0, /*keepdim=*/true).view({-1})};
  };
  auto f = tcap::compile(fn, options);
  const Tensors in{torch::randn({6, 4}), torch::randn({4, 6})};
  const Tensors out = (*f)(in);
  EXPECT_TRUE(close(out[0], fn(in)[0], 1e-5, 1e-6));
  ASSERT_EQ(fused.groups.size(), 1u) << fused.explain();
  for (const auto& n : fused.graph.nodes()) {
    EXPECT_TRUE(n.kind != tcap::ir::NodeKind::Call || n.op == tcap::fuse::kFusedOp) << tcap::ir::to_string(fused.graph);
  }
  EXPECT_EQ(c10::IntArrayRef(fused.groups[0].input_metas[0].sizes), (c10::IntArrayRef{6, 4})) << "the kernel reads the base";
  EXPECT_EQ(c10::IntArrayRef(fused.groups[0].output_metas[0].sizes), (c10::IntArrayRef{6})) << "the kernel writes the view";
  // The fused graph on the recorded layout, then on inputs with other strides (same sizes).
  tcap::Interpreter run(fused.graph, /*differentiable=*/false, kernels);
  auto before = tcap::runtime::runtime_stats();
  Tensors got = run.run({in[0], in[1]});
  auto after = tcap::runtime::runtime_stats();
  EXPECT_EQ(after.launches - before.launches, 1);
  EXPECT_EQ(after.fallbacks, before.fallbacks);
  EXPECT_TRUE(close(got[0], fn(in)[0], 1e-5, 1e-6));
  const Tensors strided{torch::randn({4, 6}).t(), torch::randn({6, 4}).t()};
  before = tcap::runtime::runtime_stats();
  got = run.run({strided[0], strided[1]});
  after = tcap::runtime::runtime_stats();
  EXPECT_EQ(after.fallbacks - before.fallbacks, 1) << "the kernel's guard checks the base's strides";
  EXPECT_TRUE(close(got[0], fn(strided)[0], 1e-5, 1e-6));
  EXPECT_EQ(got[0].sizes(), (c10::IntArrayRef{6}));
}

// Note [A backend's kernel object]: a kernel whose backend made no code (a maker that
// broke its contract) runs the group's ATen ops, counted as a fallback: the values are
// eager's, never a crash.
TEST_F(Fusion, AKernelWithoutCodeRunsItsOps) {
  auto kernels = std::make_shared<tcap::runtime::KernelTable>();
  tcap::fuse::FusionResult fused;
  tcap::CompileOptions options;
  options.fw_compiler = [&](const tcap::ir::Graph& g) {
    tcap::fuse::FusionOptions o;
    o.compile = [&](const tcap::fuse::FusedGroup& fg, std::string*) {
      auto k = std::make_shared<tcap::runtime::FusedKernel>();
      k->name = fg.name;
      k->kernel = fg.kernel;
      k->inputs = fg.input_metas;
      k->outputs = fg.output_metas;
      k->fallback = fg.fallback;
      return kernels->add(std::move(k));  // no code
    };
    fused = tcap::fuse::fuse(g, o);
    return tcap::runtime::interpreter_executable(fused.graph, "no_code", false, kernels);
  };
  auto fn = [](const Tensors& in) { return Tensors{(in[0] * 2.0 + in[1]).sin()}; };
  auto f = tcap::compile(fn, options);
  for (int call = 0; call < 3; ++call) {
    const Tensors in{torch::randn({5, 3}), torch::randn({5, 3})};
    const auto before = tcap::runtime::runtime_stats();
    const Tensors out = (*f)(in);
    const auto after = tcap::runtime::runtime_stats();
    EXPECT_TRUE(close(out[0], fn(in)[0], 1e-6, 1e-7)) << "call " << call;
    if (call > 0) {
      EXPECT_EQ(after.launches, before.launches);
      EXPECT_GE(after.fallbacks - before.fallbacks, 1);
    }
  }
  EXPECT_GE(kernels->size(), 1u) << fused.explain();
}

// TCAP_SMALL_MATMUL_MACS sets the limit; 0 keeps every matmul a BLAS call.
TEST_F(Fusion, SmallMatmulLimitFromTheEnvironment) {
  ::setenv("TCAP_SMALL_MATMUL_MACS", "0", 1);
  tcap::reload_config_for_testing();
  EXPECT_EQ(tcap::fuse::default_max_matmul_macs(), 0);
  Seen seen;
  tcap::CompileOptions options;
  options.fw_compiler = spy(&seen);
  auto f = tcap::compile([](const Tensors& in) { return Tensors{torch::mm(in[0], in[1]).relu()}; }, options);
  const Tensors in{torch::randn({2, 3}), torch::randn({3, 4})};
  const Tensors out = (*f)(in);
  ::unsetenv("TCAP_SMALL_MATMUL_MACS");
  tcap::reload_config_for_testing();
  EXPECT_GT(tcap::fuse::default_max_matmul_macs(), 0);
  ASSERT_EQ(seen.results.size(), 1u);
  EXPECT_NE(seen.results[0].explain().find("aten::mm: 24 multiply-adds, above the small-matmul limit of 0"),
            std::string::npos)
      << seen.results[0].explain();
  EXPECT_TRUE(torch::allclose(out[0], torch::mm(in[0], in[1]).relu()));
}

// Note [Decompositions for fusion]: the layer norm backward is one row kernel (grad_input)
// and one column kernel writing both the weight and the bias gradient.
TEST_F(Fusion, LayerNormBackwardIsARowKernelAndOneColumnKernel) {
  Seen seen;
  tcap::CompileOptions options = spied(&seen);
  auto fn = [](const Tensors& in) {
    return Tensors{torch::layer_norm(in[0], {33}, in[1], in[2], 1e-5) * 0.5};
  };
  auto f = tcap::compile(fn, options);
  Tensors in{leaf(torch::randn({19, 33})), leaf(torch::randn({33})), leaf(torch::randn({33}))};
  (*f)(in)[0].sum().backward();
  ASSERT_EQ(seen.results.size(), 2u);
  const auto& bw = seen.results[1];
  ASSERT_EQ(bw.groups.size(), 2u) << bw.explain();
  const auto row = std::find_if(bw.groups.begin(), bw.groups.end(), [](const auto& g) {
    return g.name.find("native_layer_norm_backward") != std::string::npos;
  });
  ASSERT_NE(row, bw.groups.end()) << bw.explain();
  EXPECT_EQ(row->kernel.sizes, (std::vector<int64_t>{19, 33})) << bw.explain();
  const auto& col = row == bw.groups.begin() ? bw.groups[1] : bw.groups[0];
  EXPECT_EQ(col.kernel.sizes, (std::vector<int64_t>{33, 19})) << "the batch dim is reduced: " << bw.explain();
  EXPECT_EQ(col.outputs.size(), 2u) << "weight and bias gradients in one kernel: " << bw.explain();
  EXPECT_EQ(bw.graph.num_calls(), 2u) << tcap::ir::to_string(bw.graph);
  EXPECT_NE(bw.explain().find("weight/bias gradients as column sums"), std::string::npos) << bw.explain();
  check_against_eager("layer_norm_bw", fn, [] {
    return Tensors{leaf(torch::randn({19, 33})), leaf(torch::randn({33})), leaf(torch::randn({33}))};
  }, at::kFloat);
}

// bfloat16: grad_input is still a row kernel (computing in float); the weight and bias
// gradients stay one ATen call, which accumulates in float as eager does.
TEST_F(Fusion, LayerNormBackwardInBFloat16KeepsWeightGradientsNative) {
  Seen seen;
  tcap::CompileOptions options = spied(&seen);
  auto fn = [](const Tensors& in) { return Tensors{torch::layer_norm(in[0], {40}, in[1], in[2], 1e-5)}; };
  auto make = [] {
    auto o = torch::TensorOptions().dtype(at::kBFloat16);
    return Tensors{leaf(torch::randn({23, 40}, o)), leaf(torch::randn({40}, o)), leaf(torch::randn({40}, o))};
  };
  auto f = tcap::compile(fn, options);
  (*f)(make())[0].sum().backward();
  ASSERT_EQ(seen.results.size(), 2u);
  const auto& bw = seen.results[1];
  ASSERT_EQ(bw.groups.size(), 1u) << bw.explain();
  EXPECT_NE(bw.explain().find("weight/bias gradients stay an ATen call"), std::string::npos) << bw.explain();
  check_against_eager("layer_norm_bf16", fn, make, at::kBFloat16);
}

}  // namespace
