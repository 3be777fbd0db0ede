// Capture of real torch::nn code: forward + loss + backward (+ an optimizer step), replayed
// by the interpreter on fresh random inputs and compared with an eager twin of the module.
//
// Compared: every user output, every parameter's .grad (the graph's grad outputs), every
// parameter and buffer after the program (BatchNorm running stats, optimizer updates).
//
// Tolerances (float32): rtol 1e-4, atol 1e-5. Replay runs the same kernels as eager, so the
// results are normally bitwise equal; the slack covers kernels whose reduction order may
// depend on memory layout or threading (mkldnn convolution / RNN, parallel reductions).
#include <tcap/capture.h>
#include <tcap/interpreter.h>

#include "support/compare.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

using tcap::testing::close;
using tcap::testing::dump;
namespace ir = tcap::ir;
namespace nn = torch::nn;

namespace {

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

// tcap bugs these tests found; each skipped test names the ones it hits. Remove the skip
// once the bug is fixed (the tests pass with all four fixed).
// A: ValueTable snapshots _version() below ADInplaceOrView, before the in-place bump and
//    before a view is given its base's version counter: the result of add_/mul_/... and
//    views of already-written tensors (weight.t()) are not found again and become inputs.
constexpr const char* kBugVersionBelowAutograd =
    "tcap bug A: in-place results and views of written tensors become new inputs (version snapshot below ADInplaceOrView)";
// B: the interpreter replays every op with GradMode off; mkldnn_rnn_layer then returns no
//    workspace and mkldnn_rnn_layer_backward reads an undefined tensor.
constexpr const char* kBugReplayGradMode =
    "tcap bug B: the interpreter ignores Node::grad_mode (mkldnn_rnn_layer returns no workspace)";
// C: Tensor::data() (fresh version counter), used by torch::optim::SGD on params and grads,
//    fails the version check: the update writes a constant input, not the parameter.
constexpr const char* kBugDataAlias =
    "tcap bug C: p.data() aliases (fresh version counter) become constant inputs, so SGD updates miss the parameters";
// D: Tensor(a)[] returns (split, unbind, chunk) carry their alias set on the element type;
//    OpInfo misses it, so the pieces get no view_of and are not found again.
constexpr const char* kBugListViews =
    "tcap bug D: Tensor(a)[] returns (split/unbind) lose their alias info and become new inputs";

using Tensors = std::vector<at::Tensor>;

// One test program, run once under capture and once eagerly on the twin module.
template <class M>
struct Program {
  std::vector<std::string> input_names;
  // Fresh random user inputs, same sizes, dtypes and strides on every call.
  std::function<Tensors()> make_inputs;
  // Forward + loss + backward (+ optimizer step) on `model`; returns the user outputs.
  std::function<Tensors(M&, const Tensors&)> run;
  // Programs with random ops (dropout): the generator is seeded with this before the
  // capture, before the replay and before the eager run, so that the masks match.
  std::optional<uint64_t> rng_seed;
  double rtol = kRtol;
  double atol = kAtol;
};

template <class M>
M clone_module(const M& m) {
  auto impl = std::dynamic_pointer_cast<typename M::ContainedType>(m->clone());
  TORCH_INTERNAL_ASSERT(impl, "clone() returned another module type");
  return M(impl);
}

std::string names_of(const ir::Graph& g, ir::InputKind kind) {
  std::string s;
  for (ir::NodeId id : g.input_nodes()) {
    if (g.node(id).input_kind == kind) s += (s.empty() ? "" : ", ") + g.node(id).name;
  }
  return s;
}

int count_op(const ir::Graph& g, const std::string& op_prefix) {
  int n = 0;
  for (const auto& node : g.nodes()) {
    if (node.kind == ir::NodeKind::Call && node.qualified_op().rfind(op_prefix, 0) == 0) ++n;
  }
  return n;
}

// Captures `prog` on `model`, replays the graph on fresh inputs (parameters and buffers:
// clones of an eager twin's, taken before the program runs), runs the twin eagerly on the
// same fresh inputs and compares outputs, gradients, parameters and buffers. Returns the
// graph through `graph_out` for test-specific checks.
template <class M>
void check_against_eager(M model, const Program<M>& prog, ir::Graph* graph_out = nullptr) {
  M twin = clone_module(model);

  // --- capture -----------------------------------------------------------------------
  const Tensors cap_in = prog.make_inputs();
  ASSERT_EQ(cap_in.size(), prog.input_names.size());
  if (prog.rng_seed) torch::manual_seed(*prog.rng_seed);
  tcap::CaptureGuard cap;
  cap.register_module(*model);
  for (size_t i = 0; i < cap_in.size(); ++i) cap.input(cap_in[i], prog.input_names[i]);
  const Tensors cap_out = prog.run(model, cap_in);
  for (size_t i = 0; i < cap_out.size(); ++i) cap.output(cap_out[i], "out" + std::to_string(i));
  cap.stop();
  const ir::Graph g = cap.graph();
  try {
    ir::verify(g);
  } catch (const c10::Error& e) {
    FAIL() << "verify failed: " << e.what_without_backtrace();  // the message ends with the graph
  }
  if (graph_out) *graph_out = g;

  // --- replay inputs: Input nodes mapped by kind and name ------------------------------
  const Tensors fresh = prog.make_inputs();
  const auto twin_params = twin->named_parameters();
  const auto twin_buffers = twin->named_buffers();
  const Tensors captured = cap.input_tensors();
  const auto input_nodes = g.input_nodes();
  ASSERT_EQ(captured.size(), input_nodes.size()) << dump(g);
  Tensors replay_in;
  std::map<std::string, at::Tensor> replay_state;  // parameter / buffer name -> replayed tensor
  for (size_t k = 0; k < input_nodes.size(); ++k) {
    const ir::Node& n = g.node(input_nodes[k]);
    switch (n.input_kind) {
      case ir::InputKind::UserInput: {
        auto it = std::find(prog.input_names.begin(), prog.input_names.end(), n.name);
        ASSERT_NE(it, prog.input_names.end()) << "unknown user input " << n.name << "\n" << dump(g);
        const at::Tensor& x = fresh[static_cast<size_t>(it - prog.input_names.begin())];
        // The fresh input has the captured layout (non-contiguous cases stay non-contiguous).
        ASSERT_EQ(x.strides(), c10::IntArrayRef(g.value(n.outputs.at(0).values.at(0)).meta.strides)) << n.name;
        replay_in.push_back(x);
        break;
      }
      case ir::InputKind::Parameter:
      case ir::InputKind::Buffer: {
        const bool param = n.input_kind == ir::InputKind::Parameter;
        const at::Tensor* t = param ? twin_params.find(n.name) : twin_buffers.find(n.name);
        ASSERT_NE(t, nullptr) << ir::to_string(n.input_kind) << " input '" << n.name
                              << "' is not a registered " << (param ? "parameter" : "buffer")
                              << " of the module\n"
                              << dump(g);
        replay_state[n.name] = t->detach().clone();
        replay_in.push_back(replay_state[n.name]);
        break;
      }
      case ir::InputKind::Constant:
      case ir::InputKind::Tangent: replay_in.push_back(captured[k]); break;
      case ir::InputKind::Saved: FAIL() << "a capture has no saved inputs: " << n.name; break;
      case ir::InputKind::HostScalar: FAIL() << "a capture has no host scalar inputs: " << n.name; break;
    }
  }
  std::map<std::string, at::Tensor> before;  // the twin's state before the eager run
  for (const auto& p : twin_params) before[p.key()] = p.value().detach().clone();
  for (const auto& b : twin_buffers) before[b.key()] = b.value().detach().clone();

  // --- replay and eager -------------------------------------------------------------------
  if (prog.rng_seed) torch::manual_seed(*prog.rng_seed);
  Tensors res;
  try {
    res = tcap::interpret(g, replay_in);
  } catch (const c10::Error& e) {
    FAIL() << "replay failed: " << e.what_without_backtrace() << "\n" << dump(g);
  }
  if (prog.rng_seed) torch::manual_seed(*prog.rng_seed);
  const Tensors expect = prog.run(twin, fresh);

  // --- compare ------------------------------------------------------------------------------
  const ir::Node* out = g.output_node();
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(res.size(), out->output_names.size()) << dump(g);
  ASSERT_GE(res.size(), expect.size()) << dump(g);
  for (size_t i = 0; i < expect.size(); ++i) {
    ASSERT_EQ(out->output_kinds[i], ir::OutputKind::User) << dump(g);
    EXPECT_TRUE(close(res[i], expect[i].detach(), prog.rtol, prog.atol))
        << "output " << out->output_names[i] << "\n" << dump(g);
  }
  std::set<std::string> grads;
  for (size_t i = expect.size(); i < res.size(); ++i) {
    // A Grad output is named after its parameter (printed as grad(<name>)).
    const std::string& pname = out->output_names[i];
    ASSERT_EQ(out->output_kinds[i], ir::OutputKind::Grad) << pname << "\n" << dump(g);
    const at::Tensor* p = twin_params.find(pname);
    ASSERT_NE(p, nullptr) << "grad output of unknown parameter " << pname << "\n" << dump(g);
    grads.insert(pname);
    EXPECT_TRUE(close(res[i], p->grad(), prog.rtol, prog.atol)) << "grad(" << pname << ")\n" << dump(g);
  }
  for (const auto& p : twin_params) {
    if (p.value().grad().defined()) {
      EXPECT_TRUE(grads.count(p.key())) << "no grad output for " << p.key() << " (parameter inputs: "
                                        << names_of(g, ir::InputKind::Parameter) << ")\n"
                                        << dump(g);
    }
  }
  // Parameters and buffers: the replayed clones were mutated like eager's; state the graph
  // never read must be unchanged by eager too.
  auto check_state = [&](const std::string& name, const at::Tensor& eager) {
    auto it = replay_state.find(name);
    if (it != replay_state.end()) {
      EXPECT_TRUE(close(it->second, eager.detach(), prog.rtol, prog.atol)) << "state " << name << "\n" << dump(g);
    } else {
      EXPECT_TRUE(close(eager.detach(), before.at(name), 0, 0))
          << "eager changed " << name << ", which is no input of the graph\n" << dump(g);
    }
  };
  for (const auto& p : twin_params) check_state(p.key(), p.value());
  for (const auto& b : twin_buffers) check_state(b.key(), b.value());
}

// Loss used by most programs: a weighted sum, so that every output element gets a
// different (non-constant) gradient.
at::Tensor weighted_loss(const at::Tensor& y, const at::Tensor& w) { return (y * w).sum() + y.pow(2).mean(); }

// Fills a module's parameters with fresh random values (LayerNorm/BatchNorm start at
// ones and zeros, which hides mistakes).
void randomize(nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.uniform_(-1.5, 1.5);
}

}  // namespace

TEST(NnModules, LinearOnSlicedInput) {
  torch::manual_seed(10);
  nn::Linear model(7, 5);
  Program<nn::Linear> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] {
    // x: 3x4x7 with stride 2 in the last dimension (a slice); w: transposed.
    return Tensors{torch::randn({3, 4, 14}).slice(2, 0, 14, 2), torch::randn({5, 4, 3}).permute({2, 1, 0})};
  };
  prog.run = [](nn::Linear& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(torch::tanh(y), in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  ASSERT_FALSE(prog.make_inputs()[0].is_contiguous());
  check_against_eager(model, prog);
}

TEST(NnModules, Conv2dChannelsLastInput) {
  torch::manual_seed(11);
  nn::Conv2d model(nn::Conv2dOptions(3, 4, 3).stride(2).padding(1));
  Program<nn::Conv2d> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] {
    return Tensors{torch::randn({3, 9, 11, 3}).permute({0, 3, 1, 2}), torch::randn({3, 4, 5, 6})};
  };
  prog.run = [](nn::Conv2d& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  check_against_eager(model, prog);
}

TEST(NnModules, Conv2dFloat64NoBiasDilated) {
  torch::manual_seed(12);
  nn::Conv2d model(nn::Conv2dOptions(2, 3, {3, 2}).dilation({2, 1}).bias(false));
  model->to(torch::kDouble);
  Program<nn::Conv2d> prog;
  prog.input_names = {"x"};
  prog.make_inputs = [] { return Tensors{torch::randn({3, 2, 9, 13}, torch::kDouble).slice(3, 0, 13, 2)}; };
  prog.run = [](nn::Conv2d& m, const Tensors& in) {
    auto y = torch::sigmoid(m->forward(in[0]));
    auto loss = y.pow(3).sum();
    loss.backward();
    return Tensors{y, loss};
  };
  prog.rtol = 1e-10;
  prog.atol = 1e-12;
  check_against_eager(model, prog);
}

TEST(NnModules, BatchNorm2dTrainUpdatesRunningStats) {
  torch::manual_seed(13);
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(3, 5, 3)), nn::BatchNorm2d(5), nn::ReLU());
  randomize(*model);
  model->train();
  Program<nn::Sequential> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] {
    return Tensors{torch::randn({3, 3, 7, 9}).transpose(2, 3).contiguous().transpose(2, 3),
                   torch::randn({3, 5, 5, 7})};
  };
  prog.run = [](nn::Sequential& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  ir::Graph g;
  check_against_eager(model, prog, &g);
  if (HasFatalFailure()) return;
  // The running statistics and the batch counter are inputs the graph writes.
  const std::string buffers = names_of(g, ir::InputKind::Buffer);
  EXPECT_NE(buffers.find("1.running_mean"), std::string::npos) << dump(g);
  EXPECT_NE(buffers.find("1.running_var"), std::string::npos) << dump(g);
  EXPECT_NE(buffers.find("1.num_batches_tracked"), std::string::npos) << dump(g);
}

TEST(NnModules, BatchNorm2dEvalUsesRunningStats) {
  torch::manual_seed(14);
  nn::BatchNorm2d model(nn::BatchNorm2dOptions(4).momentum(0.3));
  randomize(*model);
  {
    torch::NoGradGuard no_grad;
    model->running_mean.uniform_(-1, 1);
    model->running_var.uniform_(0.5, 2);
    model->num_batches_tracked.fill_(7);
  }
  model->eval();
  Program<nn::BatchNorm2d> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] {
    return Tensors{torch::randn({5, 3, 4, 6}).permute({1, 0, 2, 3}).slice(1, 0, 4), torch::randn({3, 4, 4, 6})};
  };
  prog.run = [](nn::BatchNorm2d& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  check_against_eager(model, prog);
}

TEST(NnModules, LayerNormTransposedInput) {
  torch::manual_seed(15);
  nn::LayerNorm model(nn::LayerNormOptions({6, 7}).eps(1e-5));
  randomize(*model);
  Program<nn::LayerNorm> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] {
    return Tensors{torch::randn({3, 7, 6}).transpose(1, 2), torch::randn({3, 6, 7})};
  };
  prog.run = [](nn::LayerNorm& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  check_against_eager(model, prog);
}

TEST(NnModules, EmbeddingWithPaddingIdx) {
  torch::manual_seed(16);
  nn::Embedding model(nn::EmbeddingOptions(11, 5).padding_idx(2));
  Program<nn::Embedding> prog;
  prog.input_names = {"idx", "w"};
  prog.make_inputs = [] {
    // Indices 4x3 read transposed (3x4), with repeats and the padding index likely.
    return Tensors{torch::randint(0, 11, {4, 3}, torch::kLong).t(), torch::randn({3, 4, 5})};
  };
  prog.run = [](nn::Embedding& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  check_against_eager(model, prog);
}

TEST(NnModules, DropoutTrainSeeded) {
  torch::manual_seed(17);
  nn::Sequential model(nn::Linear(7, 9), nn::Dropout(0.4), nn::Tanh(), nn::Linear(9, 3));
  model->train();
  Program<nn::Sequential> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] { return Tensors{torch::randn({7, 5}).t(), torch::randn({5, 3})}; };
  prog.run = [](nn::Sequential& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  prog.rng_seed = 1234;
  ir::Graph g;
  check_against_eager(model, prog, &g);
  if (HasFatalFailure()) return;
  EXPECT_GE(count_op(g, "aten::bernoulli"), 1) << dump(g);
}

namespace {

Program<nn::TransformerEncoderLayer> transformer_program() {
  Program<nn::TransformerEncoderLayer> prog;
  prog.input_names = {"src", "w"};
  prog.make_inputs = [] {
    // (seq 5, batch 3, d_model 6), stored batch-major.
    return Tensors{torch::randn({3, 5, 6}).transpose(0, 1), torch::randn({5, 3, 6})};
  };
  prog.run = [](nn::TransformerEncoderLayer& m, const Tensors& in) {
    auto y = m->forward(in[0]);
    auto loss = weighted_loss(y, in[1]);
    loss.backward();
    return Tensors{y, loss};
  };
  return prog;
}

}  // namespace

TEST(NnModules, TransformerEncoderLayerNoDropout) {
  torch::manual_seed(18);
  nn::TransformerEncoderLayer model(nn::TransformerEncoderLayerOptions(6, 2).dim_feedforward(11).dropout(0.0));
  model->train();
  check_against_eager(model, transformer_program());
}

TEST(NnModules, TransformerEncoderLayerEval) {
  torch::manual_seed(19);
  nn::TransformerEncoderLayer model(
      nn::TransformerEncoderLayerOptions(6, 3).dim_feedforward(9).dropout(0.2).activation(torch::kGELU));
  model->eval();
  check_against_eager(model, transformer_program());
}

TEST(NnModules, TransformerEncoderLayerTrainDropoutSeeded) {
  torch::manual_seed(20);
  nn::TransformerEncoderLayer model(nn::TransformerEncoderLayerOptions(6, 2).dim_feedforward(11).dropout(0.25));
  model->train();
  auto prog = transformer_program();
  prog.rng_seed = 99;
  ir::Graph g;
  check_against_eager(model, prog, &g);
  if (HasFatalFailure()) return;
  EXPECT_GE(count_op(g, "aten::bernoulli"), 1) << dump(g);
}

TEST(NnModules, MultiheadAttentionCrossWithMasks) {
  torch::manual_seed(28);
  nn::MultiheadAttention model(nn::MultiheadAttentionOptions(6, 2));
  Program<nn::MultiheadAttention> prog;
  prog.input_names = {"query", "key", "value", "key_padding_mask", "attn_mask", "w"};
  prog.make_inputs = [] {
    // query (L 4, N 3, E 6); key and value (S 5, N 3, E 6), key stored batch-major.
    auto padding = torch::rand({3, 5}) < 0.4;
    padding.select(1, 0).fill_(false);  // every row keeps one key (no all -inf softmax row)
    return Tensors{torch::randn({4, 3, 6}), torch::randn({3, 5, 6}).transpose(0, 1), torch::randn({5, 3, 6}),
                   padding, torch::randn({4, 5}), torch::randn({4, 3, 6})};
  };
  prog.run = [](nn::MultiheadAttention& m, const Tensors& in) {
    auto [y, attn] = m->forward(in[0], in[1], in[2], in[3], /*need_weights=*/true, in[4]);
    auto loss = weighted_loss(y, in[5]) + attn.pow(2).sum();
    loss.backward();
    return Tensors{y, attn, loss};
  };
  check_against_eager(model, prog);
}

TEST(NnModules, LstmTwoLayers) {
  torch::manual_seed(21);
  nn::LSTM model(nn::LSTMOptions(5, 6).num_layers(2));
  Program<nn::LSTM> prog;
  prog.input_names = {"x", "w"};
  prog.make_inputs = [] {
    // (seq 4, batch 3, features 5), stored batch-major.
    return Tensors{torch::randn({3, 4, 5}).transpose(0, 1), torch::randn({4, 3, 6})};
  };
  prog.run = [](nn::LSTM& m, const Tensors& in) {
    auto [y, state] = m->forward(in[0]);
    auto [h, c] = state;
    auto loss = weighted_loss(y, in[1]) + h.sum() * 0.5 + c.pow(2).sum();
    loss.backward();
    return Tensors{y, h, c, loss};
  };
  check_against_eager(model, prog);
}

TEST(NnModules, GruBatchFirst) {
  torch::manual_seed(22);
  nn::GRU model(nn::GRUOptions(5, 7).batch_first(true));
  Program<nn::GRU> prog;
  prog.input_names = {"x", "h0", "w"};
  prog.make_inputs = [] {
    return Tensors{torch::randn({3, 4, 10}).slice(2, 0, 10, 2), torch::randn({1, 3, 7}),
                   torch::randn({3, 4, 7})};
  };
  prog.run = [](nn::GRU& m, const Tensors& in) {
    auto [y, h] = m->forward(in[0], in[1]);
    auto loss = weighted_loss(y, in[2]) + h.sum();
    loss.backward();
    return Tensors{y, h, loss};
  };
  check_against_eager(model, prog);
}

namespace {

// Two training iterations (zero_grad, forward, loss, backward, step) of a small MLP, so
// that the second step reads the optimizer state the first one made.
template <class Optimizer, class Options>
Program<nn::Sequential> training_program(Options options) {
  Program<nn::Sequential> prog;
  prog.input_names = {"x", "target"};
  prog.make_inputs = [] { return Tensors{torch::randn({7, 3}).t(), torch::randn({3, 4})}; };
  prog.run = [options](nn::Sequential& m, const Tensors& in) {
    Optimizer opt(m->parameters(), options);
    Tensors losses;
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      auto loss = torch::mse_loss(m->forward(in[0]), in[1]);
      loss.backward();
      opt.step();
      losses.push_back(loss);
    }
    return losses;
  };
  return prog;
}

nn::Sequential small_mlp() { return nn::Sequential(nn::Linear(7, 5), nn::Tanh(), nn::Linear(5, 4)); }

}  // namespace

TEST(NnModules, SgdMomentumStep) {
  torch::manual_seed(23);
  auto prog = training_program<torch::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-2));
  check_against_eager(small_mlp(), prog);
}

TEST(NnModules, SgdNesterovStep) {
  torch::manual_seed(24);
  auto prog = training_program<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.8).nesterov(true));
  check_against_eager(small_mlp(), prog);
}

TEST(NnModules, AdamStep) {
  torch::manual_seed(25);
  auto prog = training_program<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).weight_decay(1e-3));
  check_against_eager(small_mlp(), prog);
}

TEST(NnModules, AdamAmsgradStep) {
  torch::manual_seed(26);
  auto prog = training_program<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).amsgrad(true));
  check_against_eager(small_mlp(), prog);
}

TEST(NnModules, CnnTrainingStepWithBatchNorm) {
  // A small CNN end to end: conv, batch norm (train), pooling, linear, cross entropy, SGD.
  torch::manual_seed(27);
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1)), nn::BatchNorm2d(4), nn::ReLU(),
                       nn::MaxPool2d(2), nn::Flatten(), nn::Linear(4 * 3 * 4, 5));
  model->train();
  Program<nn::Sequential> prog;
  prog.input_names = {"x", "labels"};
  prog.make_inputs = [] {
    return Tensors{torch::randn({3, 7, 9, 2}).permute({0, 3, 1, 2}), torch::randint(0, 5, {3}, torch::kLong)};
  };
  prog.run = [](nn::Sequential& m, const Tensors& in) {
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
    opt.zero_grad();
    auto logits = m->forward(in[0]);
    auto loss = torch::nn::functional::cross_entropy(logits, in[1]);
    loss.backward();
    opt.step();
    return Tensors{logits, loss};
  };
  check_against_eager(model, prog);
}

