// The fusion pass's rules, end to end with the llvm backend (the tests of fusion_test.cpp
// go on here; tolerances as there): unread groups dropped, no merge across an ATen op that
// reads a group, batch norm both ways, NaN and Inf, bfloat16, an MLP that trains, groups
// that stay ATen ops and say why, and TCAP_DUMP_DIR's files.
#include "fusion_checks.h"

#include <ATen/core/dispatch/Dispatcher.h>

using namespace tcap::testing::fusion;

namespace {

// A group whose results nobody reads (like an attention's averaged weights that the caller
// drops) is not run at all.
TEST_F(Fusion, GroupsWhoseResultsAreUnreadAreDropped) {
  Seen seen;
  tcap::CompileOptions options;
  options.fw_compiler = spy(&seen);
  auto fn = [](const Tensors& in) {
    auto unused = (in[0] * in[0]).sum(-1) / 3.0;  // computed, never returned
    (void)unused;
    return Tensors{torch::exp(torch::mm(in[0], in[0]))};
  };
  auto f = tcap::compile(fn, options);
  auto x = torch::randn({6, 6});
  auto out = (*f)({x});
  ASSERT_EQ(seen.results.size(), 1u);
  const auto& fw = seen.results[0];
  EXPECT_NE(fw.explain().find("computes nothing that is read"), std::string::npos) << fw.explain();
  ASSERT_EQ(fw.groups.size(), 1u) << fw.explain();  // only exp
  for (const auto& n : fw.graph.nodes()) EXPECT_NE(n.op, "aten::sum") << tcap::ir::to_string(fw.graph);
  EXPECT_TRUE(close(out[0], fn({x})[0], 1e-5, 1e-6));
}

// A pointwise op that reads a group's result and an ATen op's result computed from that
// group cannot join or merge with it: the ATen op would have to run both before and after
// the merged kernel (the relu and threshold_backward around a max_pool in a compiled
// training step). Once the fusion merged them anyway and its safety net ran the whole
// graph unfused.
TEST_F(Fusion, NoMergeAcrossAnATenOpThatReadsTheGroup) {
  Seen seen;
  tcap::CompileOptions options = spied(&seen, "merge_cycle");
  auto fn = [](const Tensors& in) {
    auto a = torch::relu(in[0] * in[1]);
    auto b = torch::cumsum(a, 1);  // no kernel lowering: an ATen call between the groups
    auto c = a * b + 1.0;
    return Tensors{c + 2.0, (c * a).sum(-1)};
  };
  auto make = [] { return Tensors{leaf(torch::randn({13, 37})), leaf(torch::randn({13, 37}))}; };
  auto f = tcap::compile(fn, options);
  Tensors in = make();
  auto out = (*f)(in);
  (out[0].sum() + out[1].sum()).backward();
  ASSERT_EQ(f->eager_reason(), "");
  ASSERT_EQ(seen.results.size(), 2u);
  for (const auto& r : seen.results) {
    EXPECT_EQ(r.explain().find("would have a cycle"), std::string::npos) << r.explain();
    // The unfused safety net keeps no groups: the kernels on both sides of the cumsum
    // (or of its backward) must be there.
    EXPECT_GE(r.groups.size(), 2u) << r.explain();
  }
  check_against_eager("merge_cycle", fn, make, at::kFloat);
}

// Note [Batch norm as kernels] (decompose.cpp): a training batch norm and its backward are
// one per-channel reduction kernel each, with the ReLU / threshold_backward around them,
// and the running statistics end as eager's. Checked against an eager copy of the module
// over three steps: outputs, input and parameter gradients, running mean and variance,
// for 2-D, 3-D and 4-D inputs of odd sizes, without affine parameters, in float64, with
// the running mean read after the update, with the module applied twice in one function
// (the second update reads the first's), and without running statistics.
TEST_F(Fusion, BatchNormIsOneKernelEachWayAndKeepsRunningStatistics) {
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    bool affine;
    bool twice;
    at::ScalarType dtype;
    bool track = true;  // track_running_stats
  };
  const std::vector<Case> cases = {{"nchw", {3, 5, 7, 9}, true, false, at::kFloat},
                                   {"ncl_no_affine", {4, 6, 11}, false, false, at::kFloat},
                                   {"nc", {9, 7}, true, false, at::kFloat},
                                   {"nchw_f64", {2, 3, 5, 4}, true, false, at::kDouble},
                                   {"applied_twice", {4, 5, 6, 3}, true, true, at::kFloat},
                                   {"no_running_stats", {3, 4, 5}, true, false, at::kFloat, false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const Tol tol = tol_for(c.dtype);
    const int64_t C = c.shape[1];
    auto make_bn = [&] {
      auto o = torch::nn::BatchNormOptions(C).momentum(0.3).affine(c.affine).track_running_stats(c.track);
      std::shared_ptr<torch::nn::Module> m;
      if (c.shape.size() == 4) m = torch::nn::BatchNorm2d(o).ptr();
      else m = torch::nn::BatchNorm1d(o).ptr();
      m->to(c.dtype);
      return m;
    };
    auto run = [&](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
      auto fwd = [&](const at::Tensor& t) {
        if (c.shape.size() == 4) return std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(m)->forward(t);
        return std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(m)->forward(t);
      };
      auto y = torch::relu(fwd(x));
      if (c.twice) y = torch::relu(fwd(y * 2.0 - 0.5));
      // Read after the update: the compiled write must have happened by then.
      if (c.shape.size() == 4 && !c.twice) {
        y = y + m->named_buffers()["running_mean"].view({1, c.shape[1], 1, 1});
      }
      return y;
    };
    auto ref = make_bn();
    auto mod = make_bn();
    {
      torch::NoGradGuard ng;
      for (auto& p : ref->parameters()) p.uniform_(0.5, 1.5);
      auto rp = ref->parameters();
      auto mp = mod->parameters();
      for (size_t i = 0; i < rp.size(); ++i) mp[i].copy_(rp[i]);
    }
    Seen seen;
    tcap::CompileOptions options = spied(&seen, "bn_" + c.name);
    auto f = tcap::compile(mod, [&](const Tensors& in) { return Tensors{run(mod, in[0])}; }, options);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      auto x = (torch::randn(c.shape, torch::TensorOptions().dtype(c.dtype)) * 1.5 + 0.7);
      auto xr = x.clone().requires_grad_(true);
      auto xc = x.clone().requires_grad_(true);
      auto w = torch::randn(c.shape, torch::TensorOptions().dtype(c.dtype));
      for (auto& p : ref->parameters()) p.mutable_grad().reset();
      for (auto& p : mod->parameters()) p.mutable_grad().reset();
      auto want = run(ref, xr);
      (want * w).sum().backward();
      auto got = (*f)({xc})[0];
      (got * w).sum().backward();
      ASSERT_EQ(f->eager_reason(), "");
      EXPECT_TRUE(close(got, want, tol.rtol, tol.atol)) << "output";
      EXPECT_TRUE(close(xc.grad(), xr.grad(), tol.rtol, tol.atol)) << "input gradient";
      auto rp = ref->named_parameters();
      auto mp = mod->named_parameters();
      for (const auto& item : rp) {
        EXPECT_TRUE(close(mp[item.key()].grad(), item.value().grad(), tol.rtol, tol.atol)) << item.key() << " gradient";
      }
      auto rb = ref->named_buffers();
      auto mb = mod->named_buffers();
      for (const auto& item : rb) {
        EXPECT_TRUE(close(mb[item.key()], item.value(), tol.rtol, tol.atol)) << item.key();
      }
    }
    ASSERT_GE(seen.results.size(), 2u);
    // The forward and the backward: no batch norm call left, one kernel reads the input
    // (ReLU included: no separate kernel for it), and no group was refused.
    for (size_t k = 0; k < 2; ++k) {
      const auto& r = seen.results[k];
      for (const auto& n : r.graph.nodes()) {
        EXPECT_EQ(n.op.find("batch_norm"), std::string::npos) << tcap::ir::to_string(r.graph);
      }
      EXPECT_EQ(r.explain().find("would have a cycle"), std::string::npos) << r.explain();
      // Applied twice: both backwards share one kernel; the two uses' weight and bias
      // gradients are added by kernels of their own. The read of the running mean is a
      // kernel after the write.
      // The float num_batches_tracked's add_ is a 0-dim kernel of its own, written in
      // place (Note [In-place updates as kernels]); it is not counted.
      const bool reads_running = c.shape.size() == 4 && !c.twice && k == 0;
      size_t groups = 0;
      for (const auto& fg : r.groups) groups += fg.kernel.sizes.empty() ? 0 : 1;
      EXPECT_LE(groups, c.twice ? 3u : reads_running ? 2u : 1u) << r.explain();
      EXPECT_GE(groups, 1u) << r.explain();
    }
  }
}

// Eval mode: the forward is pointwise (Note [Batch norm as kernels]): in inference it joins
// the ReLU after it; with a backward to come, its (empty) statistics results are saved, and
// it stays one ATen call.
TEST_F(Fusion, BatchNormInEvalModeIsPointwise) {
  auto bn = torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4));
  {
    torch::NoGradGuard ng;
    bn->running_mean.uniform_(-1, 1);
    bn->running_var.uniform_(0.5, 2);
    bn->weight.uniform_(0.5, 1.5);
    bn->bias.uniform_(-0.5, 0.5);
  }
  bn->eval();
  auto fn = [&](const Tensors& in) { return Tensors{torch::relu(bn->forward(in[0]))}; };
  {
    Seen seen;
    tcap::CompileOptions options;
    options.fw_compiler = spy(&seen);
    auto f = tcap::compile(bn.ptr(), fn, options);
    torch::NoGradGuard inference;  // (with grad, the entry would wait for its backward)
    for (int call = 0; call < 3; ++call) {
      auto x = torch::randn({2, 4, 5, 3});
      auto got = (*f)({x})[0];
      ASSERT_EQ(f->eager_reason(), "");
      EXPECT_TRUE(close(got, fn({x})[0], 1e-5, 1e-6));
    }
    EXPECT_GE(f->stats().replays, 1);
    ASSERT_EQ(seen.results.size(), 1u);
    const auto& r = seen.results[0];
    EXPECT_NE(r.explain().find("decomposed (eval mode)"), std::string::npos) << r.explain();
    for (const auto& n : r.graph.nodes()) EXPECT_EQ(n.op.find("batch_norm"), std::string::npos) << r.explain();
    // The per-channel factor, then one kernel for the rest and the ReLU.
    EXPECT_LE(r.groups.size(), 2u) << r.explain();
  }
  {
    Seen seen;
    tcap::CompileOptions options = spied(&seen);
    auto f = tcap::compile(bn.ptr(), fn, options);
    for (int call = 0; call < 3; ++call) {
      auto x = torch::randn({2, 4, 5, 3});
      auto xc = x.clone().requires_grad_(true);
      auto xr = x.clone().requires_grad_(true);
      auto got = (*f)({xc})[0];
      got.sum().backward();
      auto want = fn({xr})[0];
      want.sum().backward();
      ASSERT_EQ(f->eager_reason(), "");
      EXPECT_TRUE(close(got, want, 1e-5, 1e-6));
      EXPECT_TRUE(close(xc.grad(), xr.grad(), 1e-5, 1e-6));
    }
    ASSERT_GE(seen.results.size(), 1u);
    EXPECT_NE(seen.results[0].explain().find("native_batch_norm: kept as one ATen call: eval mode"), std::string::npos)
        << seen.results[0].explain();
  }
}

TEST_F(Fusion, NanAndInfPropagateLikeEager) {
  auto fn = [](const Tensors& in) {
    auto x = in[0];
    return Tensors{torch::relu(x), torch::maximum(x, in[1]), torch::softmax(x, -1), x.amax(-1), torch::exp(x),
                   torch::log(x), torch::where(x > 0, x, in[1])};
  };
  auto make = [] {
    auto x = torch::randn({6, 9});
    x.index_put_({0, 1}, std::numeric_limits<float>::quiet_NaN());
    x.index_put_({1, 2}, std::numeric_limits<float>::infinity());
    x.index_put_({2, 3}, -std::numeric_limits<float>::infinity());
    x.index_put_({3}, -std::numeric_limits<float>::infinity());  // an all -inf row
    auto y = torch::randn({6, 9});
    y.index_put_({4, 4}, std::numeric_limits<float>::quiet_NaN());
    return Tensors{x, y};
  };
  check_against_eager("nan_inf", fn, make, at::kFloat);
}

TEST_F(Fusion, BFloat16ComputesInFloatAndRoundsOnce) {
  auto fn = [](const Tensors& in) { return Tensors{torch::silu(in[0] * in[1] + 1.0), torch::softmax(in[0], -1)}; };
  auto make = [] {
    auto o = torch::TensorOptions().dtype(at::kBFloat16);
    return Tensors{leaf(torch::randn({37, 45}, o)), leaf(torch::randn({45}, o))};
  };
  check_against_eager("bf16", fn, make, at::kBFloat16, /*expect_kernels=*/true, /*bf16_fused_output=*/0);
}

TEST_F(Fusion, MlpWithGeluAndLayerNormTrains) {
  torch::manual_seed(3);
  auto l1 = torch::nn::Linear(64, 128);
  auto l2 = torch::nn::Linear(128, 64);
  auto ln = torch::nn::LayerNorm(torch::nn::LayerNormOptions({64}));
  Tensors params;
  for (auto& p : l1->parameters()) params.push_back(p);
  for (auto& p : l2->parameters()) params.push_back(p);
  for (auto& p : ln->parameters()) params.push_back(p);
  auto fn = [&](const Tensors& in) {
    auto h = torch::gelu(l1->forward(in[0]));
    auto y = ln->forward(l2->forward(h));
    return Tensors{(y * y).mean()};
  };
  tcap::CompileOptions options;
  options.backend = "llvm";
  auto f = tcap::compile(fn, options);
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({31, 64});
    for (auto& p : params) p.mutable_grad().reset();
    auto loss = (*f)({x})[0];
    loss.backward();
    Tensors got;
    for (auto& p : params) got.push_back(p.grad().clone());
    for (auto& p : params) p.mutable_grad().reset();
    auto ref = fn({x})[0];
    ref.backward();
    EXPECT_TRUE(close(loss.detach(), ref.detach(), 1e-4, 1e-6));
    for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(close(got[k], params[k].grad(), 1e-4, 1e-5)) << k;
  }
  EXPECT_GE(f->stats().replays, 2);
}

TEST_F(Fusion, UnsupportedGroupsStayATenAndSayWhy) {
  // Integer tensors: exp of int64 is fused as float, but a complex tensor is not.
  Seen seen;
  tcap::CompileOptions options;
  options.fw_compiler = spy(&seen);
  auto fn = [](const Tensors& in) { return Tensors{torch::view_as_real(in[0] * 2).sum(-1)}; };
  auto f = tcap::compile(fn, options);
  auto z = torch::randn({4, 3}, torch::TensorOptions().dtype(at::kComplexFloat));
  auto out = (*f)({z});
  ASSERT_EQ(seen.results.size(), 1u);
  EXPECT_NE(seen.results[0].explain().find("has no kernels"), std::string::npos) << seen.results[0].explain();
  EXPECT_TRUE(close(out[0], fn({z})[0]));
}

}  // namespace

namespace {

TEST_F(Fusion, DumpDirGetsFusedGraphAndEachKernelsIr) {
  // Not std::filesystem::remove_all: libtorch.so exports a copy of it that crashes when
  // called from here (null function pointer, LibTorch 2.11 wheel).
  char templ[] = "/tmp/tcap_fusion_dump_XXXXXX";
  ASSERT_NE(::mkdtemp(templ), nullptr);
  const std::filesystem::path dir = templ;
  tcap::CompileOptions options;
  options.name = "dumped";
  options.backend = "llvm";
  options.dump_dir = dir.string();
  auto f = tcap::compile([](const Tensors& in) { return Tensors{torch::softmax(torch::sin(in[0]), -1)}; }, options);
  // The first call captures; the second replays, and the graphs' first run compiles their
  // kernels and writes their .ll (Note [Kernels compiled at their first run]).
  for (int call = 0; call < 2; ++call) {
    auto x = leaf(torch::randn({5, 6}));
    (*f)({x})[0].sum().backward();
  }
  int ll = 0, kir = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "kernels")) {
    ll += e.path().extension() == ".ll";
    kir += e.path().extension() == ".kir";
  }
  EXPECT_GE(ll, 2) << "one .ll per kernel (forward and backward)";
  EXPECT_EQ(ll, kir);
  EXPECT_TRUE(std::filesystem::exists(dir / "dumped.0.forward.fused.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "dumped.0.backward.fused.json"));
  EXPECT_EQ(std::system(("rm -rf '" + dir.string() + "'").c_str()), 0);
}

// Note [A row per overload] (fuse/lowering.cpp): a lowering serves the overloads its rows
// name; another overload of the op (one that names its dims, one that writes its `out`)
// has none, and runs as an ATen call.
TEST(LoweringRows, ARowServesOnlyTheOverloadItNames) {
  auto node = [](const std::string& op, const std::string& overload) {
    tcap::ir::Node n;
    n.kind = tcap::ir::NodeKind::Call;
    n.op = op;
    n.overload = overload;
    return n;
  };
  EXPECT_NE(tcap::fuse::find_lowering(node("aten::sum", "")), nullptr);
  EXPECT_NE(tcap::fuse::find_lowering(node("aten::sum", "dim_IntList")), nullptr);
  EXPECT_EQ(tcap::fuse::find_lowering(node("aten::sum", "dim_DimnameList")), nullptr);
  EXPECT_EQ(tcap::fuse::find_lowering(node("aten::mean", "names_dim")), nullptr);
  EXPECT_EQ(tcap::fuse::find_lowering(node("aten::maximum", "out")), nullptr);
  EXPECT_NE(tcap::fuse::find_lowering(node("aten::clamp_min", "Tensor")), nullptr);
  EXPECT_NE(tcap::fuse::find_lowering(node("aten::clamp_max", "Tensor")), nullptr);
}

// Note [Writes are not lowered] (fuse/lowering.cpp): every row names an overload the
// dispatcher knows, and none whose schema writes an argument (an in-place or out=
// overload), which a kernel computing the functional value would silently not write.
TEST(LoweringRows, NoRowNamesAnOverloadThatWrites) {
  auto& d = c10::Dispatcher::singleton();
  for (const auto& [op, cls] : tcap::fuse::lowered_ops()) {
    const size_t dot = op.find('.', op.find("::") + 2);
    const std::string name = op.substr(0, dot), overload = dot == std::string::npos ? "" : op.substr(dot + 1);
    auto h = d.findSchema({name, overload});
    ASSERT_TRUE(h.has_value()) << op << " is not an operator overload LibTorch knows";
    for (const auto& a : h->schema().arguments()) {
      EXPECT_FALSE(a.alias_info() && a.alias_info()->isWrite()) << op << " writes its argument " << a.name();
    }
  }
}

}  // namespace
