// The IR-only passes on small graphs built by hand: max-flow, the default and min-cut
// partitioners, dead-code elimination, buffer reuse, integer patches of dynamic sizes and
// the host-read helpers. Every output graph must verify; failures print the graphs.
#include <tcap/interpreter.h>
#include <tcap/partition.h>

#include "ir/op_facts.h"
#include "passes/drop_detaches.h"
#include "passes/fold_transposes.h"
#include "passes/host_graph.h"
#include "passes/int_patches.h"
#include "passes/max_flow.h"
#include "passes/reuse_buffers.h"
#include "support/compare.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>

namespace {

using namespace tcap;

ir::TensorMeta meta(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::kFloat) {
  ir::TensorMeta m;
  m.dtype = dtype;
  m.sizes.assign(sizes.begin(), sizes.end());
  m.strides.resize(sizes.size());
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    m.strides[d] = s;
    s *= sizes[d];
  }
  return m;
}

// Builds graphs one node at a time, schemas from this LibTorch.
struct Builder {
  ir::Graph g;
  ir::ValueId input(const std::string& name, std::vector<int64_t> sizes, ir::InputKind kind = ir::InputKind::UserInput) {
    return g.add_input(kind, name, meta(std::move(sizes)));
  }
  // A call with tensor results of the given shapes (one per entry); returns their values.
  std::vector<ir::ValueId> call(const std::string& op, const std::string& overload, std::vector<ir::Arg> args,
                                std::vector<std::vector<int64_t>> results, ir::Phase phase = ir::Phase::Forward) {
    ir::Node n;
    n.kind = ir::NodeKind::Call;
    n.op = op;
    n.overload = overload;
    n.phase = phase;
    n.grad_mode = phase == ir::Phase::Forward;
    auto h = c10::Dispatcher::singleton().findSchema({op, overload});
    EXPECT_TRUE(h.has_value()) << op << "." << overload;
    const auto& sargs = h->schema().arguments();
    for (size_t i = 0; i < args.size() && i < sargs.size(); ++i) args[i].name = sargs[i].name();
    n.args = std::move(args);
    const auto id = static_cast<ir::NodeId>(g.nodes().size());
    std::vector<ir::ValueId> out;
    for (size_t k = 0; k < results.size(); ++k) {
      out.push_back(g.new_value(id, static_cast<int>(k), -1, meta(results[k])));
      n.outputs.push_back(ir::Arg::value(out.back()));
    }
    std::ostringstream schema;
    schema << h->schema();
    g.schemas()[n.qualified_op()] = schema.str();
    g.add_node(std::move(n));
    return out;
  }
  ir::ValueId unary(const std::string& op, ir::ValueId x, ir::Phase phase = ir::Phase::Forward) {
    return call(op, "", {ir::Arg::value(x)}, {sizes(x)}, phase)[0];
  }
  ir::ValueId binary(const std::string& op, ir::ValueId a, ir::ValueId b, ir::Phase phase = ir::Phase::Forward) {
    std::vector<ir::Arg> args{ir::Arg::value(a), ir::Arg::value(b)};
    if (op == "aten::add" || op == "aten::sub") args.push_back(ir::Arg::integer(1));
    return call(op, "Tensor", args, {sizes(a)}, phase)[0];
  }
  std::vector<int64_t> sizes(ir::ValueId v) const {
    const auto& s = g.value(v).meta.sizes;
    return std::vector<int64_t>(s.begin(), s.end());
  }
};

std::string dump(const ir::Graph& g) { return ir::to_string(g); }

// cos(cos(a + b)) and its backward, as tcap::compile records it.
JointGraph coscos_joint() {
  Builder b;
  const std::vector<int64_t> s{64, 32};
  auto a = b.input("a", s, ir::InputKind::Parameter);
  auto c = b.input("b", s, ir::InputKind::Parameter);
  auto t = b.input("tangent", s, ir::InputKind::Tangent);
  auto x = b.binary("aten::add", a, c);
  auto y = b.unary("aten::cos", x);
  auto z = b.unary("aten::cos", y);
  // d/dy cos(y) = -sin(y); d/dx = -sin(x) * that.
  auto sy = b.unary("aten::sin", y, ir::Phase::Backward);
  auto gy = b.binary("aten::mul", t, b.unary("aten::neg", sy, ir::Phase::Backward), ir::Phase::Backward);
  auto sx = b.unary("aten::sin", x, ir::Phase::Backward);
  auto gx = b.binary("aten::mul", gy, b.unary("aten::neg", sx, ir::Phase::Backward), ir::Phase::Backward);
  b.g.set_outputs({z, gx, gx}, {"out", "grad_a", "grad_b"},
                  {ir::OutputKind::User, ir::OutputKind::Grad, ir::OutputKind::Grad});
  JointGraph j;
  j.graph = b.g;
  j.num_primals = 2;
  j.num_tangents = 1;
  j.num_user_outputs = 1;
  j.tangent_of = {0};
  j.grad_of = {0, 1};
  return j;
}

TEST(MaxFlow, FindsTheMinimumCut) {
  // s=0 -> 1 (3), s -> 2 (2), 1 -> 2 (1), 1 -> t=3 (2), 2 -> t (3): max flow 5.
  passes::MaxFlow mf(4);
  mf.add_edge(0, 1, 3);
  mf.add_edge(0, 2, 2);
  mf.add_edge(1, 2, 1);
  mf.add_edge(1, 3, 2);
  mf.add_edge(2, 3, 3);
  EXPECT_EQ(mf.run(0, 3), 5);
  const auto reach = mf.reachable(0);
  EXPECT_TRUE(reach[0]);
  EXPECT_FALSE(reach[3]);
}

TEST(Partition, DefaultSavesWhatTheBackwardReads) {
  const JointGraph j = coscos_joint();
  ir::verify(j.graph);
  auto r = partition(j, Partitioner::Default);
  ir::verify(r.forward);
  ir::verify(r.backward);
  // The backward reads x (a + b) and y (cos x).
  EXPECT_EQ(r.saved.size(), 2u) << r.explain() << dump(j.graph);
  EXPECT_EQ(r.recomputed_nodes, 0u);
}

TEST(Partition, MinCutSavesOneTensorAndRecomputesTheRest) {
  const JointGraph j = coscos_joint();
  auto r = partition(j, Partitioner::MinCut);
  ir::verify(r.forward);
  ir::verify(r.backward);
  ASSERT_EQ(r.saved.size(), 1u) << r.explain() << dump(j.graph);
  EXPECT_EQ(j.graph.node(j.graph.value(r.saved[0]).producer).op, "aten::add") << r.explain();
  EXPECT_EQ(r.recomputed_nodes, 1u) << r.explain();  // y = cos(x)
  EXPECT_NE(r.explain().find("recomputed in the backward: aten::cos"), std::string::npos) << r.explain();
  // The joint graph's replay and the partitioned graphs compute the same gradients.
  auto a = torch::randn({64, 32}), b = torch::randn({64, 32}), t = torch::randn({64, 32});
  auto joint_out = Interpreter(j.graph).run({a, b, t});
  auto fw = Interpreter(r.forward).run({a, b});
  std::vector<at::Tensor> bw_in(fw.begin() + 1, fw.end());
  bw_in.push_back(t);
  auto bw = Interpreter(r.backward).run(bw_in);
  EXPECT_TRUE(tcap::testing::close(fw[0], joint_out[0]));
  EXPECT_TRUE(tcap::testing::close(bw[0], joint_out[1]));
}

TEST(Partition, PreferLaterTensorsIsAnOption) {
  // relu(x) read by the backward: with the tie-break relu's output is saved, without it the
  // cut may take either of the two equal-sized tensors; both partitions must be valid.
  Builder b;
  auto x = b.input("x", {16}, ir::InputKind::Parameter);
  auto t = b.input("t", {16}, ir::InputKind::Tangent);
  auto y = b.binary("aten::mul", x, x);
  auto r = b.unary("aten::relu", y);
  auto g = b.call("aten::threshold_backward", "", {ir::Arg::value(t), ir::Arg::value(r), ir::Arg::real(0)}, {{16}},
                  ir::Phase::Backward)[0];
  b.g.set_outputs({r, g}, {"out", "grad"}, {ir::OutputKind::User, ir::OutputKind::Grad});
  JointGraph j{b.g, 1, 1, 1, {0}, {0}};
  MinCutOptions later, none;
  none.prefer_later_tensors = false;
  auto p1 = partition(j, Partitioner::MinCut, later);
  auto p2 = partition(j, Partitioner::MinCut, none);
  ir::verify(p1.backward);
  ir::verify(p2.backward);
  ASSERT_EQ(p1.saved.size(), 1u) << p1.explain();
  EXPECT_EQ(p1.saved[0], r) << p1.explain();
  EXPECT_EQ(p1.recomputed_nodes, 0u) << p1.explain();
}

TEST(Partition, MalformedJointGraphIsAClearError) {
  JointGraph j = coscos_joint();
  j.num_primals = 3;
  try {
    partition(j, Partitioner::MinCut);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("declares 3 primals"), std::string::npos) << e.what();
  }
}

TEST(DeadCode, DropsUnusedNodesKeepsInputWrites) {
  Builder b;
  auto x = b.input("x", {8});
  auto buf = b.input("running", {8}, ir::InputKind::Buffer);
  auto used = b.unary("aten::exp", x);
  b.unary("aten::sin", x);  // dead
  // running.add_(x): an in-place write into an input, kept though nothing reads it.
  auto w = b.call("aten::add_", "Tensor", {ir::Arg::value(buf), ir::Arg::value(x), ir::Arg::integer(1)}, {{8}})[0];
  b.g.value(w).version_of = buf;
  b.g.set_outputs({used}, {"out"}, {ir::OutputKind::User});
  ir::verify(b.g);
  auto d = eliminate_dead_code(b.g);
  ir::verify(d);
  EXPECT_EQ(d.num_calls(), 2u) << dump(d);
  for (const auto& n : d.nodes()) EXPECT_NE(n.op, "aten::sin") << dump(d);
}

TEST(ReuseBuffers, RewritesIntoTheInPlaceTwinAndKeepsAliasInfo) {
  Builder b;
  auto x = b.input("x", {4, 8});
  auto w = b.input("w", {8, 8});
  auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 8}})[0];
  auto s = b.unary("aten::sin", m);  // m dies here and comes from a matmul: sin_ in place
  auto e = b.unary("aten::exp", x);  // x is an input: never overwritten
  b.g.set_outputs({s, e}, {"s", "e"}, {ir::OutputKind::User, ir::OutputKind::User});
  int rewritten = 0;
  auto h = passes::reuse_buffers(b.g, &rewritten);
  ir::verify(h);
  EXPECT_EQ(rewritten, 1) << dump(h);
  const auto& n = h.node(h.value(s).producer);
  EXPECT_EQ(n.op, "aten::sin_") << dump(h);
  EXPECT_EQ(h.value(s).version_of, m) << dump(h);
  EXPECT_TRUE(h.schemas().count("aten::sin_")) << dump(h);
  // Same results as the original.
  auto xt = torch::randn({4, 8}), wt = torch::randn({8, 8});
  auto before = Interpreter(b.g).run({xt, wt});
  auto after = Interpreter(h).run({xt, wt});
  EXPECT_TRUE(tcap::testing::close(before[0], after[0]));
  EXPECT_TRUE(tcap::testing::close(before[1], after[1]));
}

// t of a value: sizes and strides swapped, a view of it.
// `pass` on g (both verified), which it must change `expected` times.
using ViewPass = std::function<ir::Graph(const ir::Graph&, int*)>;
ir::Graph applied(const ViewPass& pass, const ir::Graph& g, int expected, const char* what = "") {
  ir::verify(g);
  int changed = -1;
  ir::Graph h = pass(g, &changed);
  ir::verify(h);
  EXPECT_EQ(changed, expected) << what << "\n" << dump(h);
  return h;
}

// A graph over inputs x [4, 8] and w [8, 6] made by `make`, which `pass` (a fold of views:
// fold_transposes, drop_detaches) must leave as it is.
void expect_kept(const ViewPass& pass, const std::function<void(Builder&, ir::ValueId, ir::ValueId)>& make,
                 const char* what) {
  Builder b;
  auto x = b.input("x", {4, 8});
  auto w = b.input("w", {8, 6});
  make(b, x, w);
  applied(pass, b.g, 0, what);
}

// g and h (a rewrite of g over inputs [4, 8] and [8, 6]) give the same values and layouts.
void expect_same_results(const ir::Graph& g, const ir::Graph& h) {
  auto xt = torch::randn({4, 8}), wt = torch::randn({8, 6});
  auto before = Interpreter(g).run({xt, wt});
  auto after = Interpreter(h).run({xt, wt});
  ASSERT_EQ(before.size(), after.size());
  for (size_t k = 0; k < before.size(); ++k) {
    EXPECT_TRUE(before[k].equal(after[k])) << k;
    EXPECT_EQ(before[k].strides(), after[k].strides()) << k;
    EXPECT_FALSE(after[k].requires_grad()) << k;
  }
}

ir::ValueId transpose(Builder& b, ir::ValueId v) {
  const auto m = b.g.value(v).meta;
  auto out = b.call("aten::t", "", {ir::Arg::value(v)}, {{m.sizes[1], m.sizes[0]}})[0];
  b.g.value(out).meta.strides = {m.strides[1], m.strides[0]};
  b.g.value(out).view_of = v;
  return out;
}

TEST(FoldTransposes, DropsAPairOverAFreshTensor) {
  Builder b;
  auto x = b.input("x", {4, 8});
  auto w = b.input("w", {8, 6});
  auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
  auto back = transpose(b, transpose(b, m));  // as a Linear's weight gradient comes out
  auto e = b.unary("aten::exp", back);
  b.g.set_outputs({e, back}, {"e", "grad"}, {ir::OutputKind::User, ir::OutputKind::User});
  auto h = applied(passes::fold_transposes, b.g, 1);
  EXPECT_EQ(h.num_calls(), 2u) << dump(h);  // mm, exp
  for (const auto& n : h.nodes()) EXPECT_NE(n.op, "aten::t") << dump(h);
  expect_same_results(b.g, h);
}

TEST(FoldTransposes, KeepsPairsSomeoneCouldTellApart) {
  auto keeps = [](const std::function<void(Builder&, ir::ValueId, ir::ValueId)>& make, const char* what) {
    expect_kept(passes::fold_transposes, make, what);
  };
  keeps([](Builder& b, ir::ValueId x, ir::ValueId) {
    auto back = transpose(b, transpose(b, x));  // over an input: the result would be the input itself
    b.g.set_outputs({b.unary("aten::exp", back)}, {"e"}, {ir::OutputKind::User});
  }, "input");
  keeps([](Builder& b, ir::ValueId x, ir::ValueId w) {
    auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
    auto back = transpose(b, transpose(b, m));
    b.g.set_outputs({b.unary("aten::exp", back), b.unary("aten::sin", m)}, {"e", "s"},
                    {ir::OutputKind::User, ir::OutputKind::User});  // m read elsewhere too
  }, "other reader of the base");
  keeps([](Builder& b, ir::ValueId x, ir::ValueId w) {
    auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
    auto inner = transpose(b, m);
    auto back = transpose(b, inner);
    b.g.set_outputs({b.unary("aten::exp", back), b.unary("aten::cos", inner)}, {"e", "c"},
                    {ir::OutputKind::User, ir::OutputKind::User});  // the inner t read elsewhere
  }, "other reader of the inner transpose");
  keeps([](Builder& b, ir::ValueId x, ir::ValueId w) {
    auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
    auto back = transpose(b, transpose(b, m));
    auto written = b.call("aten::mul_", "Scalar", {ir::Arg::value(back), ir::Arg::real(2.0)}, {{4, 6}})[0];
    b.g.value(written).version_of = back;  // an in-place write through the pair
    b.g.set_outputs({written}, {"w"}, {ir::OutputKind::User});
  }, "written in place");
}

ir::ValueId detach(Builder& b, ir::ValueId v) {
  const auto m = b.g.value(v).meta;
  auto out = b.call("aten::detach", "", {ir::Arg::value(v)}, {std::vector<int64_t>(m.sizes.begin(), m.sizes.end())})[0];
  b.g.value(out).meta = m;
  b.g.value(out).view_of = v;
  return out;
}

// As every AccumulateGrad of a captured backward ends: the gradient a kernel (here mm)
// made, detached, returned and read by the optimizer update.
TEST(DropDetaches, DropsTheDetachOfATensorMadeInTheGraph) {
  Builder b;
  auto x = b.input("x", {4, 8});
  auto w = b.input("w", {8, 6});
  auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
  auto tm = transpose(b, b.unary("aten::exp", x));  // a view of a tensor made here is fine too
  auto g1 = detach(b, m);
  auto g2 = detach(b, tm);
  auto e = b.unary("aten::sin", g1);
  b.g.set_outputs({e, g1, g2}, {"e", "grad1", "grad2"}, {ir::OutputKind::User, ir::OutputKind::User, ir::OutputKind::User});
  auto h = applied(passes::drop_detaches, b.g, 2);
  for (const auto& n : h.nodes()) EXPECT_NE(n.op, "aten::detach") << dump(h);
  expect_same_results(b.g, h);
}

TEST(DropDetaches, KeepsDetachesSomeoneCouldTellApart) {
  auto keeps = [](const std::function<void(Builder&, ir::ValueId, ir::ValueId)>& make, const char* what) {
    expect_kept(passes::drop_detaches, make, what);
  };
  keeps([](Builder& b, ir::ValueId x, ir::ValueId) {
    b.g.set_outputs({detach(b, x)}, {"d"}, {ir::OutputKind::User});  // an input: it may require grad
  }, "input");
  keeps([](Builder& b, ir::ValueId x, ir::ValueId) {
    b.g.set_outputs({detach(b, transpose(b, x))}, {"d"}, {ir::OutputKind::User});
  }, "view of an input");
  keeps([](Builder& b, ir::ValueId x, ir::ValueId w) {
    auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
    b.g.set_outputs({detach(b, m), m}, {"d", "m"}, {ir::OutputKind::User, ir::OutputKind::User});  // m returned too
  }, "other reader");
}

// A write through the dropped detach (as _fused_adam_ declares for its gradients) becomes
// a write of the tensor itself: the same storage, and no one else reads it.
TEST(DropDetaches, AWriteThroughTheDetachGoesToTheTensor) {
  Builder b;
  auto x = b.input("x", {4, 8});
  auto w = b.input("w", {8, 6});
  auto m = b.call("aten::mm", "", {ir::Arg::value(x), ir::Arg::value(w)}, {{4, 6}})[0];
  auto d = detach(b, m);
  auto written = b.call("aten::mul_", "Scalar", {ir::Arg::value(d), ir::Arg::real(2.0)}, {{4, 6}})[0];
  b.g.value(written).version_of = d;
  b.g.value(written).view_of = d;
  b.g.set_outputs({d, written}, {"d", "w"}, {ir::OutputKind::User, ir::OutputKind::User});
  auto h = applied(passes::drop_detaches, b.g, 1);
  expect_same_results(b.g, h);
  auto xt = torch::randn({4, 8}), wt = torch::randn({8, 6});
  auto after = Interpreter(h).run({xt, wt});
  ASSERT_EQ(after.size(), 2u);
  EXPECT_TRUE(after[0].equal(torch::mm(xt, wt) * 2)) << "the write shows through the returned tensor";
}

TEST(IntPatches, FollowOneSizeAndRefuseAmbiguity) {
  auto graph_at = [](int64_t n, int64_t m) {
    Builder b;
    auto x = b.input("x", {n, m});
    auto v = b.call("aten::view", "", {ir::Arg::value(x), ir::Arg()}, {{n * m}})[0];
    b.g.edit_node(static_cast<ir::NodeId>(b.g.nodes().size() - 1), [&](auto& n) { n.args[1].kind = ir::ArgKind::IntList; });
    b.g.edit_node(static_cast<ir::NodeId>(b.g.nodes().size() - 1), [&](auto& node) { node.args[1].ints = {n * m}; });
    b.g.set_outputs({v}, {"v"}, {ir::OutputKind::User});
    return b.g;
  };
  std::vector<passes::IntPatch> patches;
  // n: 4 -> 8 with m = 3 fixed: n*m follows n (mul 3).
  EXPECT_EQ(passes::find_int_patches(graph_at(4, 3), graph_at(8, 3), {{4, 8}}, patches), "");
  ASSERT_FALSE(patches.empty());
  auto g = graph_at(4, 3);
  passes::apply_int_patches(g, patches, {10});
  EXPECT_EQ(g.nodes().back().kind, ir::NodeKind::Output);
  EXPECT_EQ(g.value(1).meta.sizes[0], 30);
  // Two classes 4 -> 8 and 2 -> 4 both explain a difference of 4 with integer factors:
  // an integer that changes by 4 is ambiguous and refused.
  patches.clear();
  auto why = passes::find_int_patches(graph_at(4, 2), graph_at(8, 4), {{4, 8}, {2, 4}}, patches);
  EXPECT_NE(why.find("two of the changed sizes"), std::string::npos) << why;
}

TEST(HostGraph, ReadsBeforeWritesAndObservations) {
  auto build = [](double value, bool write_first) {
    Builder b;
    auto x = b.input("x", {5});
    auto buf = b.input("buf", {5}, ir::InputKind::Buffer);
    ir::ValueId summed = x;
    if (write_first) {
      auto w = b.call("aten::add_", "Tensor", {ir::Arg::value(buf), ir::Arg::value(x), ir::Arg::integer(1)}, {{5}})[0];
      b.g.value(w).version_of = buf;
      summed = w;  // the read depends on the write
    }
    auto s = b.call("aten::sum", "", {ir::Arg::value(summed), ir::Arg()}, {{}})[0];
    b.call("aten::_local_scalar_dense", "", {ir::Arg::value(s)}, {});
    b.g.edit_node(static_cast<ir::NodeId>(b.g.nodes().size() - 1), [&](auto& n) { n.outputs = {ir::Arg::real(value)}; });
    auto y = b.unary("aten::exp", x);
    b.g.set_outputs({y}, {"y"}, {ir::OutputKind::User});
    return b.g;
  };
  EXPECT_TRUE(passes::host_reads_precede_input_writes(build(1.5, false)));
  EXPECT_FALSE(passes::host_reads_precede_input_writes(build(1.5, true)));
  std::vector<ir::NodeId> nodes;
  EXPECT_TRUE(passes::same_but_host_values(build(1.5, false), build(2.5, false), &nodes));
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_TRUE(passes::same_but_host_values(build(1.5, false), build(1.5, false), &nodes));
  EXPECT_TRUE(nodes.empty());
  EXPECT_FALSE(passes::same_but_host_values(build(1.5, false), build(2.5, true), &nodes));
  auto forgotten = passes::forget_host_reads(build(1.5, false), passes::host_read_nodes(build(1.5, false)));
  EXPECT_TRUE(passes::host_read_nodes(forgotten).empty()) << dump(forgotten);
  auto hg = passes::host_read_graph(build(1.5, false));
  EXPECT_EQ(hg.reads.size(), 1u);
  EXPECT_THROW((void)passes::host_read_graph(build(1.5, true)).reads.size(), c10::Error);
}

// A collective (tcap_dist::ddp_all_reduce) cannot be undone or run twice: a host read
// after one is not checked inline, and a pre-check graph cannot run ahead of one.
TEST(HostGraph, CollectivesAreNeitherPassedNorRunAhead) {
  auto build = [](bool read_depends_on_collective) {
    Builder b;
    auto x = b.input("x", {5});
    auto reduced = b.call("tcap_dist::ddp_all_reduce", "", {ir::Arg::value(x), ir::Arg::integer(1)}, {{5}})[0];
    auto s = b.call("aten::sum", "", {ir::Arg::value(read_depends_on_collective ? reduced : x), ir::Arg()}, {{}})[0];
    b.call("aten::_local_scalar_dense", "", {ir::Arg::value(s)}, {});
    b.g.edit_node(static_cast<ir::NodeId>(b.g.nodes().size() - 1), [&](auto& n) { n.outputs = {ir::Arg::real(1.5)}; });
    b.g.set_outputs({reduced}, {"r"}, {ir::OutputKind::User});
    return b.g;
  };
  EXPECT_TRUE(ir::op_has("tcap_dist::ddp_all_reduce", ir::OpFact::Collective));
  // The read comes after the collective in either graph: no inline check.
  EXPECT_FALSE(passes::host_reads_precede_input_writes(build(false)));
  EXPECT_FALSE(passes::host_reads_precede_input_writes(build(true)));
  // A read that does not depend on it can be pre-checked; one that does cannot.
  EXPECT_EQ(passes::host_read_graph(build(false)).reads.size(), 1u);
  try {
    passes::host_read_graph(build(true));
    ADD_FAILURE() << "a pre-check graph would run the collective";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("collective tcap_dist::ddp_all_reduce"), std::string::npos) << e.what();
  }
}

TEST(OpFacts, OneTableForEveryPass) {
  EXPECT_TRUE(ir::op_has("aten::cos", ir::OpFact::Recomputable));
  EXPECT_TRUE(ir::op_has("aten::cos", ir::OpFact::Pointwise));
  EXPECT_FALSE(ir::op_has("aten::mm", ir::OpFact::Recomputable));
  EXPECT_TRUE(ir::op_has("aten::mm", ir::OpFact::FreshResult));
  EXPECT_TRUE(ir::op_has("aten::view", ir::OpFact::View));
  EXPECT_EQ(ir::op_facts("aten::mul").in_place_twin, "aten::mul_");
  EXPECT_EQ(ir::op_facts("aten::not_an_op").flags, 0u);
  // Every twin is a registered operator taking the same arguments.
  for (const auto& op : ir::ops_with_facts()) {
    const auto& twin = ir::op_facts(op).in_place_twin;
    if (twin.empty()) continue;
    EXPECT_FALSE(c10::Dispatcher::singleton().findOp({twin, ""}) == std::nullopt &&
                 c10::Dispatcher::singleton().findOp({twin, "Tensor"}) == std::nullopt)
        << twin;
  }
}

// Note [Pointwise from the schema tags]: the table's own Pointwise rows are exactly the
// ops this LibTorch leaves untagged; every other Pointwise op carries the tag.
bool tagged_pointwise(const std::string& op) {
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != op) continue;
    auto schema = c10::Dispatcher::singleton().findSchema(name);
    if (schema && schema->hasTag(at::Tag::pointwise)) return true;
  }
  return false;
}

TEST(OpFacts, PointwiseFromTheSchemaTags) {
  const auto untagged = ir::pointwise_without_tag();
  EXPECT_FALSE(untagged.empty());
  for (const auto& op : untagged) {
    EXPECT_FALSE(tagged_pointwise(op)) << op << " is tagged pointwise now: drop its own flag in op_facts.cpp";
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::Pointwise)) << op;
  }
  for (const auto& op : ir::ops_with_facts()) {
    const bool own = std::find(untagged.begin(), untagged.end(), op) != untagged.end();
    EXPECT_EQ(ir::op_has(op, ir::OpFact::Pointwise), own || tagged_pointwise(op)) << op;
  }
  // Read from the tags: the table no longer says so itself.
  for (const char* op : {"aten::mul", "aten::exp", "aten::where", "aten::clamp", "aten::relu"}) {
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::Pointwise)) << op;
    EXPECT_TRUE(std::find(untagged.begin(), untagged.end(), op) == untagged.end()) << op;
  }
  EXPECT_FALSE(ir::op_has("aten::mm", ir::OpFact::Pointwise));
  EXPECT_FALSE(ir::op_has("aten::sum", ir::OpFact::Pointwise));
  EXPECT_FALSE(ir::op_has("aten::view", ir::OpFact::Pointwise));
}

// The op knowledge passes used to keep in their own string sets.
TEST(OpFacts, FactsPassesAskFor) {
  for (const char* op : {"aten::t", "aten::transpose", "aten::permute", "aten::view", "aten::unsqueeze",
                         "aten::squeeze", "aten::expand", "aten::alias"}) {
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::KeepsOffset)) << op;
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::View)) << op;
  }
  EXPECT_FALSE(ir::op_has("aten::slice", ir::OpFact::KeepsOffset));
  EXPECT_FALSE(ir::op_has("aten::select", ir::OpFact::KeepsOffset));
  for (const char* op : {"aten::add_", "aten::sub_", "aten::mul_", "aten::addcdiv_", "aten::addcmul_"}) {
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::UpdateStep)) << op;
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::Pointwise)) << op;  // tagged so: in place, yet pointwise
  }
  for (const char* op : {"aten::linalg_vector_norm", "aten::norm", "aten::max"}) {
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::Norm)) << op;
  }
  for (const char* op : {"aten::native_layer_norm_backward", "aten::_fused_adam_", "aten::_fused_adamw_",
                         "aten::_fused_sgd_"}) {
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::TrustsArguments)) << op;
  }
  for (const char* op : {"aten::add", "aten::sub", "aten::mul", "aten::div"}) {
    EXPECT_TRUE(ir::op_has(op, ir::OpFact::Arithmetic)) << op;
  }
  EXPECT_TRUE(ir::op_has("aten::mul", ir::OpFact::Commutative));
  EXPECT_TRUE(ir::op_has("aten::add", ir::OpFact::Commutative));
  EXPECT_FALSE(ir::op_has("aten::sub", ir::OpFact::Commutative));
  EXPECT_FALSE(ir::op_has("aten::div", ir::OpFact::Commutative));
}

}  // namespace
