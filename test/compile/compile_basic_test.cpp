// tcap::compile end to end: first call captures (eager results), the backward of that call
// completes the capture, later calls replay; values and gradients compared with eager.
//
// Tolerances (float32): rtol 1e-5, atol 1e-6 where replay runs the very same kernels as
// eager (the eager backend); 1e-4 / 1e-5 where a partition recomputes ops in another order.
#include <tcap/compile.h>

#include "support/compare.h"
#include "support/log_capture.h"

#include <torch/torch.h>

#include <algorithm>

using tcap::testing::close;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors coscos(const Tensors& in) { return {torch::cos(torch::cos(in[0] + in[1] + in[2] + in[3]))}; }

Tensors leaves(int n, std::vector<int64_t> shape) {
  Tensors ts;
  for (int i = 0; i < n; ++i) ts.push_back(torch::randn(shape, torch::requires_grad()));
  return ts;
}

Tensors grads_of(const Tensors& ts) {
  Tensors g;
  for (const auto& t : ts) g.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return g;
}

void zero(const Tensors& ts) {
  for (const auto& t : ts) {
    if (t.grad().defined()) t.mutable_grad().reset();
  }
}

// Runs f three times on fresh inputs and compares outputs and input grads with eager fn.
void check_against_eager(tcap::CompiledFunction& f, const std::function<Tensors(const Tensors&)>& fn,
                         int n, std::vector<int64_t> shape, double rtol, double atol) {
  for (int call = 0; call < 4; ++call) {
    auto in = leaves(n, shape);
    auto out = f(in);
    out[0].sum().backward();
    auto g = grads_of(in);
    zero(in);
    auto ref = fn(in);
    ref[0].sum().backward();
    auto rg = grads_of(in);
    EXPECT_TRUE(close(out[0], ref[0], rtol, atol)) << "call " << call;
    for (int i = 0; i < n; ++i) EXPECT_TRUE(close(g[i], rg[i], rtol, atol)) << "call " << call << " grad " << i;
  }
}

// Backend auto on tensors no backend compiles for (the meta device): the joint graph's
// target is chosen once, so the fallback to the eager backend is logged once per entry,
// not again for its forward and its backward.
TEST(Compile, AutoFallbackIsLoggedOncePerEntry) {
  tcap::testing::LogCapture log("graph_breaks");
  tcap::CompileOptions o;
  o.backend = tcap::Backend::Auto;
  o.name = "meta_fn";
  auto f = tcap::compile([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * 2).sin()}; }, o);
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({4, 3}, torch::TensorOptions().device(torch::kMeta)).requires_grad_();
    auto y = f(x)[0];
    y.sum().backward();
    EXPECT_EQ(x.grad().sizes(), x.sizes());
  }
  EXPECT_GE(f->stats().replays, 1);
  EXPECT_EQ(log.count("backend 'auto' runs the eager backend"), 1) << log.text();
}

TEST(Compile, CosCosMinCutSavesOneTensor) {
  tcap::CompileOptions o;
  o.name = "coscos";
  o.partitioner = tcap::Partitioner::MinCut;
  auto f = tcap::compile(coscos, o);
  check_against_eager(*f, coscos, 4, {33, 17}, 1e-5, 1e-6);
  const auto& st = f->stats();
  EXPECT_EQ(st.captures, 1);
  EXPECT_EQ(st.compiles, 1);
  EXPECT_EQ(st.replays, 3);
  auto es = f->entries();
  ASSERT_EQ(es.size(), 1u);
  const auto& p = es[0].partition;
  EXPECT_EQ(p.saved.size(), 1u) << p.explain() << tcap::ir::to_string(es[0].joint.graph);
  EXPECT_EQ(p.saved_bytes, 33 * 17 * 4);
  // The one saved tensor is a + b + c + d: the output of the last add.
  const auto& v = es[0].joint.graph.value(p.saved.at(0));
  EXPECT_EQ(es[0].joint.graph.node(v.producer).op, "aten::add");
  EXPECT_EQ(p.recomputed_nodes, 1u) << p.explain();
}

// Compiles fn with `partitioner`, checks it against eager on n inputs of `shape`, and
// returns its one compiled entry.
tcap::CompiledEntryInfo checked_entry(const std::function<Tensors(const Tensors&)>& fn, tcap::Partitioner partitioner,
                                      int n, std::vector<int64_t> shape) {
  tcap::CompileOptions o;
  o.partitioner = partitioner;
  auto f = tcap::compile(fn, o);
  check_against_eager(*f, fn, n, std::move(shape), 1e-5, 1e-6);
  auto es = f->entries();
  EXPECT_EQ(es.size(), 1u);
  return es.at(0);
}

TEST(Compile, CosCosDefaultSavesTwoTensors) {
  const auto e = checked_entry(coscos, tcap::Partitioner::Default, 4, {33, 17});
  EXPECT_EQ(e.partition.saved.size(), 2u) << e.partition.explain();
  EXPECT_EQ(e.partition.saved_bytes, 2 * 33 * 17 * 4);
  EXPECT_EQ(e.partition.recomputed_nodes, 0u);
}

// relu's backward reads relu's output. Saving a + b and recomputing the relu costs as many
// bytes as saving the relu: of cuts with equal bytes, min-cut takes the later tensor and
// recomputes nothing (Note [Min-cut recomputation]).
Tensors relu_of_sum(const Tensors& in) { return {torch::relu(in[0] + in[1]) * 3}; }

TEST(Compile, MinCutTieSavesTheLaterTensor) {
  const auto e = checked_entry(relu_of_sum, tcap::Partitioner::MinCut, 2, {31, 9});
  const auto& p = e.partition;
  ASSERT_EQ(p.saved.size(), 1u) << p.explain();
  EXPECT_EQ(p.saved_bytes, 31 * 9 * 4);
  EXPECT_EQ(e.joint.graph.node(e.joint.graph.value(p.saved.at(0)).producer).op, "aten::relu") << p.explain();
  EXPECT_EQ(p.recomputed_nodes, 0u) << p.explain();
}

TEST(Compile, ExplainSaysWhy) {
  auto f = tcap::compile(coscos);
  auto in = leaves(4, {8, 8});
  (*f)(in)[0].sum().backward();
  auto es = f->entries();
  ASSERT_EQ(es.size(), 1u);
  const std::string text = es[0].partition.explain();
  EXPECT_NE(text.find("recomputed in the backward: aten::cos"), std::string::npos) << text;
  EXPECT_NE(text.find("saved"), std::string::npos) << text;
}

TEST(Compile, MatmulIsSavedNotRecomputed) {
  auto fn = [](const Tensors& in) { return Tensors{torch::tanh(torch::mm(in[0], in[1])).sin()}; };
  auto f = tcap::compile(fn);
  check_against_eager(*f, fn, 2, {7, 7}, 1e-5, 1e-6);
  auto es = f->entries();
  ASSERT_EQ(es.size(), 1u);
  for (const auto& d : es[0].partition.decisions) {
    if (d.kind != tcap::ValueDecision::Kind::Recomputed) continue;
    const auto& g = es[0].joint.graph;
    EXPECT_NE(g.node(g.value(d.value).producer).op, "aten::mm") << es[0].partition.explain();
  }
}

// Note [Views are saved as their base]: what the backward reads through views (a
// Linear's t(weight) alike) is saved as the viewed tensor under both partitioners; the
// backward makes the views again, and the gradients stay eager's.
TEST(Compile, ViewsAreSavedAsTheirBase) {
  // mm(h, view(view(w))) saves w; mm(view(sin(x)), v) saves sin(x), which the backward
  // does not read otherwise (sin's backward reads x).
  auto fn = [](const Tensors& in) {
    auto h = torch::relu(torch::addmm(in[2], in[0], in[1].t()));
    return Tensors{torch::mm(h, in[1].view({3, 14}).view({6, 7})) +
                   torch::mm(torch::sin(in[0]).view({7, 5}), in[3]).sum()};
  };
  for (auto which : {tcap::Partitioner::Default, tcap::Partitioner::MinCut}) {
    SCOPED_TRACE(tcap::to_string(which));
    tcap::CompileOptions options;
    options.partitioner = which;
    auto f = tcap::compile(fn, options);
    for (int call = 0; call < 3; ++call) {
      Tensors in{torch::randn({5, 7}).requires_grad_(true), torch::randn({6, 7}).requires_grad_(true),
                 torch::randn({6}).requires_grad_(true), torch::randn({5, 4}).requires_grad_(true)};
      Tensors ref;
      for (const auto& t : in) ref.push_back(t.detach().clone().requires_grad_(true));
      auto out = (*f)(in);
      out[0].sum().backward();
      auto want = fn(ref);
      want[0].sum().backward();
      ASSERT_EQ(f->eager_reason(), "");
      EXPECT_TRUE(close(out[0], want[0], 1e-5, 1e-6));
      for (size_t k = 0; k < in.size(); ++k) EXPECT_TRUE(close(in[k].grad(), ref[k].grad(), 1e-5, 1e-6)) << "grad " << k;
    }
    auto es = f->entries();
    ASSERT_EQ(es.size(), 1u);
    const auto& p = es[0].partition;
    const auto& g = es[0].joint.graph;
    // No saved value is a view: the weight is saved, t(weight) and the chain of views are
    // made again in the backward.
    for (auto v : p.saved) EXPECT_EQ(g.value(v).view_of, tcap::ir::kNoValue) << p.explain();
    EXPECT_NE(p.explain().find("a view, saved as its base (aten::view"), std::string::npos) << p.explain();
  }
}

}  // namespace

// Note [Where a compile spends its time]: under TCAP_LOGS=perf each compiled graph says how
// long each pipeline stage took, fusion's steps apart, and each joint graph how long its
// partition took; a dynamic entry's specialization at new sizes says it again.
TEST(Compile, PerfLogSaysWhereEachCompileSpendsItsTime) {
  if (!tcap::Backend("llvm").available()) GTEST_SKIP() << "no LLVM backend here";
  tcap::testing::LogCapture log("perf");
  tcap::CompileOptions o;
  o.name = "stage_times";
  o.backend = "llvm";
  auto fn = [](const Tensors& in) { return Tensors{torch::gelu(in[0] * in[1]).sum(1)}; };
  auto f = tcap::compile(fn, o);
  for (int64_t n : {8, 12, 12, 20, 20}) {
    auto in = leaves(2, {n, 5});
    auto out = f(in);
    out[0].sum().backward();
    EXPECT_TRUE(close(out[0], fn(in)[0], 1e-4, 1e-5)) << n;
  }
  const std::string text = log.text();
  EXPECT_GE(log.count("stage_times.0 joint graph partitioned in "), 1) << text;
  EXPECT_GE(log.count("stage_times.0.forward compiled in "), 1) << text;
  EXPECT_GE(log.count("stage_times.0.backward compiled in "), 1) << text;
  for (const char* step : {"simplify ", "fuse ", "(decompose ", "group ", "lower ", "kernels ", "rewrite ",
                           "reuse_buffers ", "executable "}) {
    EXPECT_GE(log.count(step), 2) << step << "\n" << text;
  }
  // The entry at 12 generalizes the one at 8; the size 20 is a specialization: its graphs
  // go through the same stages again.
  EXPECT_GE(f->stats().replays, 1) << text;
  EXPECT_GE(log.count("joint graph partitioned in "), 3) << text;
}
