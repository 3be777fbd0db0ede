// OpInfo-style sweep of tcap::compile: one table of ATen ops, each run in float32 and
// float64, on contiguous and on non-contiguous inputs.
//
// For every (op, dtype) case and every layout, a fresh compiled function is called three
// times with fresh random inputs of the same shapes:
//   call 1 runs eagerly and captures; its backward (of sum_k (out_k * w_k).sum(), with
//          fixed random weights w_k) completes the capture and compiles the region;
//   calls 2 and 3 must be replays (stats().replays, eager_reason() == "").
// Each call's outputs, every input's .grad and every input the op writes (running stats)
// are compared with an eager run of the same lambda on the same inputs.
//
// Tolerances: float32 rtol 1e-4 atol 1e-5, float64 rtol 1e-7 atol 1e-9; a row may scale
// them (Row::tol) with a comment saying why.
//
// Inputs: differentiable inputs are leaves with requires_grad; index tensors are int64,
// masks bool, targets/statistics plain tensors without grad. The non-contiguous layout
// builds even-numbered float/bool inputs of rank >= 2 as the transpose of a tensor of
// transposed shape, and the others as a step-2 slice (index tensors stay contiguous).
//
// Built as its own binary (tcap_op_sweep_tests): the file is not named *_test.cpp so the
// compile/ glob of test/CMakeLists.txt does not pick it up too. It is built a second time
// as tcap_op_sweep_llvm_tests with TCAP_SWEEP_BACKEND="llvm": the same cases through the
// fused LLVM kernels (same tolerances: libmvec's transcendentals are within 4 ulp and
// reassociated sums stay far inside them at these sizes).
//
// A third build, tcap_op_sweep_cuda_tests (TCAP_SWEEP_CUDA), is the cuda backend's sweep: with a
// CUDA device the inputs live on it (same layouts) and the backend is `cuda`; without
// one, the graphs stay on the CPU and every kernel the fusion pass forms from them is
// rendered to CUDA C++, compiled to PTX with NVRTC (a failure names the kernel and carries
// NVRTC's log) and run by the CUDA host emulator (test/support/cuda_emu.h, Note [CUDA host
// emulation]), so the CUDA renderer's kernels are checked against eager on every op
// without a GPU. The emulator uses the host's libm, so the tolerances stay those above.
//
// The llvm build also sweeps every row (contiguous inputs) with each floating-point scalar
// constant of its graphs made a host scalar input, as compile_step's per-call scalars are
// (OpSweepHostScalars, one test over all rows): every kernel takes such a number as a parameter, or leaves its op to
// ATen (Note [Kernel parameters]), and matches eager either way, forward and backward.
#include <tcap/compile.h>

#include "op_sweep.h"
#include "support/compare.h"

#ifdef TCAP_SWEEP_BACKEND
#include "passes/scalar_inputs.h"
#endif

#ifdef TCAP_SWEEP_CUDA
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "support/cuda_emu.h"

#include <torch/cuda.h>
#endif

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using tcap::testing::close;

namespace {

using namespace tcap::test::op_sweep;

// ---- running one case ---------------------------------------------------------------

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

at::ScalarType other_float(at::ScalarType t) { return t == at::kFloat ? at::kDouble : at::kFloat; }

bool is_float_kind(Kind k) {
  return k == Kind::Float || k == Kind::Other || k == Kind::Const || k == Kind::Pos || k == Kind::Prob ||
         k == Kind::Sign;
}

// Values of one input with the given (storage) shape.
at::Tensor values(const Spec& s, const Shape& shape, at::ScalarType dtype) {
  const auto opt = torch::TensorOptions().dtype(s.kind == Kind::Other ? other_float(dtype) : dtype);
  switch (s.kind) {
    case Kind::Float:
    case Kind::Other:
    case Kind::Const: return torch::randn(shape, opt);
    case Kind::Pos: return torch::rand(shape, opt) + 0.5;
    case Kind::Prob: return torch::rand(shape, opt) * 0.9 + 0.05;
    case Kind::Sign: return torch::where(torch::rand(shape, opt) < 0.5, -1.0, 1.0).to(dtype);
    case Kind::Mask: return torch::rand(shape) < 0.5;
    case Kind::Index: return torch::randint(s.high, shape, torch::kLong);
    case Kind::Unique: {
      TORCH_CHECK(!shape.empty() && shape.back() <= s.high, "bad Unique spec");
      Shape full = shape;
      full.back() = s.high;
      return std::get<1>(torch::rand(full).sort(-1)).narrow(-1, 0, shape.back()).contiguous();
    }
  }
  TORCH_CHECK(false, "unknown kind");
}

// One input; k is its position (alternates the non-contiguous layout).
at::Tensor make_input(const Spec& s, at::ScalarType dtype, bool noncontig, size_t k) {
  at::Tensor t;
  const Shape& shape = s.shape;
  Shape swapped = shape;
  if (shape.size() >= 2) std::swap(swapped[shape.size() - 1], swapped[shape.size() - 2]);
  // Transposing around size-1 dims can still give a contiguous tensor: slice those instead.
  const bool transpose_works = shape.size() >= 2 && !torch::empty(swapped).transpose(-1, -2).is_contiguous();
  if (!noncontig || shape.empty() || !(is_float_kind(s.kind) || s.kind == Kind::Mask)) {
    t = values(s, shape, dtype);
  } else if (k % 2 == 0 && transpose_works) {
    t = values(s, swapped, dtype).transpose(-1, -2);
  } else {
    // A step-2 slice along the first dim of size > 1.
    size_t d = 0;
    while (d + 1 < shape.size() && shape[d] == 1) ++d;
    Shape storage = shape;
    storage[d] *= 2;
    t = values(s, storage, dtype).slice(static_cast<int64_t>(d), 0, storage[d], 2);
  }
  if (s.kind == Kind::Float || s.kind == Kind::Other) t.requires_grad_(true);
  return t;
}

#ifdef TCAP_SWEEP_CUDA
// Whether the sweep runs on a CUDA device (else: PTX only, see the top of the file).
bool on_device() {
  static const bool yes = [] {
    std::string why;
    return tcap::codegen::cuda::cuda_available(&why) && torch::cuda::is_available();
  }();
  return yes;
}

// The same tensor on the device, with the same sizes and strides.
at::Tensor to_device(const at::Tensor& t) {
  at::Tensor d = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCUDA));
  d.copy_(t.detach());
  return d.requires_grad_(t.requires_grad());
}

// Without a device: every kernel compiled to PTX, and run by the host emulator.
tcap::Executable emulating_compiler(const tcap::ir::Graph& g) {
  return tcap::testing::cuda_emu::compiler(g, /*also_ptx=*/true);
}
#endif

#ifdef TCAP_SWEEP_BACKEND
// The graph with every floating-point scalar constant a host scalar input, fused by the
// sweep's backend; the executable appends the numbers the graph had to each call's inputs.
tcap::Executable host_scalar_compiler(const tcap::ir::Graph& g) {
  namespace ir = tcap::ir;
  std::vector<tcap::passes::ScalarArg> args;
  std::vector<double> numbers;
  for (const auto& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const ir::Arg& a = n.args[i];
      const bool floating = a.kind == ir::ArgKind::Double || (a.kind == ir::ArgKind::WrappedScalar &&
                                                              c10::isFloatingType(static_cast<c10::ScalarType>(a.i2)));
      if (!floating) continue;
      args.push_back({n.id, i, "s" + std::to_string(args.size())});
      numbers.push_back(a.d);
    }
  }
  tcap::Executable exe = tcap::llvm_backend(tcap::passes::scalars_as_inputs(g, args));
  return [exe, numbers](std::vector<at::Tensor> in) {
    for (double d : numbers) in.push_back(tcap::passes::host_scalar_input(d));
    return exe(std::move(in));
  };
}
#endif

Tensors make_inputs(const Row& row, at::ScalarType dtype, bool noncontig) {
  Tensors in;
  for (size_t k = 0; k < row.inputs.size(); ++k) in.push_back(make_input(row.inputs[k], dtype, noncontig, k));
#ifdef TCAP_SWEEP_CUDA
  if (on_device()) {
    for (auto& t : in) t = to_device(t);
  }
#endif
  return in;
}

struct Snapshot {
  Tensors outs, grads, state;  // state: every input that does not require grad
};

Snapshot snapshot(const Tensors& outs, const Tensors& in) {
  Snapshot s;
  for (const auto& o : outs) s.outs.push_back(o.detach().clone());
  for (const auto& t : in) {
    s.grads.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
    s.state.push_back(t.requires_grad() ? at::Tensor() : t.detach().clone());
  }
  return s;
}

::testing::AssertionResult same(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (a.defined() && b.defined() && !a.is_floating_point()) {
    if (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "integer/bool tensors differ";
  }
  return close(a, b, rtol, atol);
}

using Param = std::tuple<size_t, at::ScalarType>;

std::string dtype_suffix(at::ScalarType t) { return t == at::kFloat ? "f32" : "f64"; }

// Rows that fail because of a known tcap bug: "name" or "name_f32"/"name_f64" -> reason.
// They are skipped with the reason; TCAP_SWEEP_RUN_KNOWN_BUGS=1 runs them anyway (to check
// a fix, then delete the entry).
const std::map<std::string, std::string>& known_bugs() {
  // Empty: the rows the sweep found (silu/mish backward kernels that were taken for
  // composite ops, index.Tensor refused as data-dependent) are fixed.
  static const std::map<std::string, std::string> bugs = {};
  return bugs;
}

bool run_known_bugs() {
  const char* e = std::getenv("TCAP_SWEEP_RUN_KNOWN_BUGS");
  return e && std::string(e) == "1";
}

// Why a case is skipped as a known bug ("" when it is not one, or when they run anyway).
std::string known_bug(const Row& row, at::ScalarType dtype) {
  if (run_known_bugs()) return "";
  for (const std::string& key : {row.name, row.name + "_" + dtype_suffix(dtype)}) {
    auto it = known_bugs().find(key);
    if (it != known_bugs().end()) return it->second;
  }
  return "";
}

class OpSweep : public ::testing::TestWithParam<Param> {};

void run_layout(const Row& row, at::ScalarType dtype, bool noncontig, bool host_scalars = false) {
  const std::string where = std::string(noncontig ? "non-contiguous" : "contiguous") + " inputs";
  SCOPED_TRACE(where);
  const double rtol = (dtype == at::kFloat ? 1e-4 : 1e-7) * row.tol;
  const double atol = (dtype == at::kFloat ? 1e-5 : 1e-9) * row.tol;
  torch::manual_seed(fnv1a(row.name) ^ (dtype == at::kFloat ? 0 : 0x5f64) ^ (noncontig ? 0xc0de : 0));

  tcap::CompileOptions options;
  options.name = row.name;
#ifdef TCAP_SWEEP_BACKEND
  options.backend = TCAP_SWEEP_BACKEND;
  if (host_scalars) {
    options.fw_compiler = host_scalar_compiler;
    options.bw_compiler = host_scalar_compiler;
  }
#else
  (void)host_scalars;
#endif
#ifdef TCAP_SWEEP_CUDA
  if (on_device()) {
    options.backend = "cuda";
  } else {
    std::string why;
    if (!tcap::codegen::cuda::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC here: " << why;
    if (!tcap::testing::cuda_emu::available(&why)) GTEST_SKIP() << "no CUDA host emulation here: " << why;
    options.fw_compiler = emulating_compiler;
    options.bw_compiler = emulating_compiler;
  }
#endif
  auto f = tcap::compile(row.fn, options);
  Tensors weights;
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    Tensors in = make_inputs(row, dtype, noncontig);
    if (noncontig) {
      ASSERT_TRUE(std::any_of(in.begin(), in.end(), [](const at::Tensor& t) { return !t.is_contiguous(); }))
          << "the non-contiguous layout gave only contiguous inputs";
    }
    Tensors before;  // inputs without grad, to undo what the compiled call wrote into them
    for (const auto& t : in) before.push_back(t.requires_grad() ? at::Tensor() : t.detach().clone());

    // Compiled (call 1: eager + capture; its backward completes the capture).
    Tensors out = (*f)(in);
    if (weights.empty()) {
      for (const auto& o : out) {
        weights.push_back(torch::randn(o.sizes(), torch::TensorOptions().dtype(o.scalar_type()).device(o.device())));
      }
    }
    ASSERT_EQ(out.size(), weights.size());
    if (at::Tensor loss = tcap::testing::weighted_loss(out, weights); loss.defined()) loss.backward();
    const Snapshot got = snapshot(out, in);
    {
      const auto& st = f->stats();
      ASSERT_EQ(f->eager_reason(), "") << "fell back to eager";
      if (call == 0) {
        EXPECT_EQ(st.captures, 1);
        EXPECT_EQ(st.compiles, 1) << "the first call's backward did not complete the capture";
      } else {
        ASSERT_GE(st.replays, call) << "call " << call + 1 << " was not a replay (captures " << st.captures
                                    << ", compiles " << st.compiles << ", recompiles " << st.recompiles
                                    << ", eager calls " << st.eager_calls << ")";
        EXPECT_EQ(st.recompiles, 0);
      }
    }

    // Eager reference on the same inputs.
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k].requires_grad()) {
        if (in[k].grad().defined()) in[k].mutable_grad().reset();
      } else if (!at::equal(in[k], before[k])) {
        at::NoGradGuard no_grad;
        in[k].copy_(before[k]);
      }
    }
    Tensors ref = row.fn(in);
    ASSERT_EQ(ref.size(), out.size());
    if (at::Tensor loss = tcap::testing::weighted_loss(ref, weights); loss.defined()) loss.backward();
    const Snapshot want = snapshot(ref, in);

    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_EQ(out[k].requires_grad(), ref[k].requires_grad()) << "output " << k;
      EXPECT_TRUE(close(got.outs[k], want.outs[k], rtol, atol)) << "output " << k;
    }
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TRUE(close(got.grads[k], want.grads[k], rtol, atol)) << "grad of input " << k;
      EXPECT_TRUE(same(got.state[k], want.state[k], rtol, atol)) << "value of input " << k << " after the call";
    }
  }
}

TEST_P(OpSweep, MatchesEager) {
  const Row& row = rows().at(std::get<0>(GetParam()));
  const at::ScalarType dtype = std::get<1>(GetParam());
  if (const std::string why = known_bug(row, dtype); !why.empty()) GTEST_SKIP() << "known tcap bug: " << why;
  run_layout(row, dtype, /*noncontig=*/false);
  if (HasFatalFailure()) return;
  if (row.noncontig) run_layout(row, dtype, /*noncontig=*/true);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return rows().at(std::get<0>(info.param)).name + "_" + dtype_suffix(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Ops, OpSweep,
                         ::testing::Combine(::testing::Range<size_t>(0, rows().size()),
                                            ::testing::Values(at::kFloat, at::kDouble)),
                         param_name);

#ifdef TCAP_SWEEP_BACKEND
// One test, not one per row: each row takes milliseconds here, and a test process of its
// own would cost more than the row (the failures name the row and dtype).
TEST(OpSweepHostScalars, EveryRowMatchesEager) {
  for (size_t r = 0; r < rows().size(); ++r) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      const Row& row = rows()[r];
      SCOPED_TRACE(row.name + "_" + dtype_suffix(dtype));
      if (!known_bug(row, dtype).empty()) continue;
      run_layout(row, dtype, /*noncontig=*/false, /*host_scalars=*/true);
    }
  }
}
#endif

TEST(OpSweepTable, HasEnoughDistinctRows) {
  std::set<std::string> names;
  for (const auto& r : rows()) {
    EXPECT_TRUE(names.insert(r.name).second) << "duplicate row " << r.name;
    for (char c : r.name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '_') << r.name;
  }
  EXPECT_GE(rows().size(), 150u);
  size_t noncontig = 0;
  for (const auto& r : rows()) noncontig += r.noncontig;
  EXPECT_GE(noncontig, rows().size() - 5) << "most rows also run on non-contiguous inputs";
}

}  // namespace
