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
// A third build, tcap_op_sweep_cuda_tests (TCAP_SWEEP_CUDA), is issue 6's sweep: with a
// CUDA device the inputs live on it (same layouts) and the backend is `cuda`; without
// one, the graphs stay on the CPU and every kernel the fusion pass forms from them is
// rendered to CUDA C++, compiled to PTX with NVRTC (a failure names the kernel and carries
// NVRTC's log) and run by the CUDA host emulator (test/support/cuda_emu.h, Note [CUDA host
// emulation]), so the CUDA renderer's kernels are checked against eager on every op
// without a GPU. The emulator uses the host's libm, so the tolerances stay those above.
#include <tcap/compile.h>

#include "support/compare.h"

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
using Tensors = std::vector<at::Tensor>;
using torch::indexing::None;
using torch::indexing::Slice;

namespace {

using Shape = std::vector<int64_t>;
using Fn = std::function<Tensors(const Tensors&)>;

enum class Kind {
  Float,   // randn, requires grad (a leaf)
  Other,   // randn of the other float dtype (f64 in an f32 case and f32 in an f64 case), requires grad
  Const,   // randn, no grad
  Pos,     // uniform in [0.5, 1.5), no grad (variances, weights, Poisson targets)
  Prob,    // uniform in [0.05, 0.95), no grad (probability targets)
  Sign,    // +1 / -1, no grad (margin / hinge targets)
  Mask,    // bool
  Index,   // int64 in [0, high)
  Unique,  // int64 in [0, high), distinct along the last dim
};

struct Spec {
  Kind kind;
  Shape shape;
  int64_t high = 0;
};

Spec F(Shape s) { return {Kind::Float, std::move(s)}; }
Spec Oth(Shape s) { return {Kind::Other, std::move(s)}; }
Spec C(Shape s) { return {Kind::Const, std::move(s)}; }
Spec Pos(Shape s) { return {Kind::Pos, std::move(s)}; }
Spec Prob(Shape s) { return {Kind::Prob, std::move(s)}; }
Spec Sgn(Shape s) { return {Kind::Sign, std::move(s)}; }
Spec Mask(Shape s) { return {Kind::Mask, std::move(s)}; }
Spec Idx(Shape s, int64_t high) { return {Kind::Index, std::move(s), high}; }
Spec Uniq(Shape s, int64_t high) { return {Kind::Unique, std::move(s), high}; }

struct Row {
  std::string name;
  std::vector<Spec> inputs;
  Fn fn;
  double tol = 1;          // scales rtol and atol
  bool noncontig = true;   // also run with non-contiguous inputs
};

// FN(a, b, ...) is a function returning {a, b, ...}; FNV(v) one returning the vector v.
// x, y, z, u, v name in[0..4].
#define TCAP_SWEEP_ARGS                                                       \
  [[maybe_unused]] const at::Tensor& x = in.at(0);                            \
  [[maybe_unused]] const at::Tensor& y = in.size() > 1 ? in[1] : in[0];       \
  [[maybe_unused]] const at::Tensor& z = in.size() > 2 ? in[2] : in[0];       \
  [[maybe_unused]] const at::Tensor& u = in.size() > 3 ? in[3] : in[0];       \
  [[maybe_unused]] const at::Tensor& v = in.size() > 4 ? in[4] : in[0];
#define FN(...) [](const Tensors& in) -> Tensors { TCAP_SWEEP_ARGS return Tensors{__VA_ARGS__}; }
#define FNV(...) [](const Tensors& in) -> Tensors { TCAP_SWEEP_ARGS return __VA_ARGS__; }

constexpr int64_t kMean = at::Reduction::Mean;
constexpr int64_t kSum = at::Reduction::Sum;

const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    const Shape S57{5, 7};
    const Shape S345{3, 4, 5};
    std::vector<Row> r = {
        // ---- pointwise unary -------------------------------------------------------
        {"sin", {F(S57)}, FN(torch::sin(x))},
        {"cos", {F(S57)}, FN(torch::cos(x))},
        {"tan", {F(S57)}, FN(torch::tan(x * 0.3))},
        {"exp", {F(S57)}, FN(torch::exp(x))},
        {"expm1", {F(S57)}, FN(torch::expm1(x))},
        {"exp2", {F(S57)}, FN(torch::exp2(x))},
        {"log", {F(S57)}, FN(torch::log(x.abs() + 1))},
        {"log1p", {F(S57)}, FN(torch::log1p(x.abs()))},
        {"log2", {F(S57)}, FN(torch::log2(x.abs() + 1))},
        {"log10", {F(S57)}, FN(torch::log10(x.abs() + 1))},
        {"tanh", {F(S57)}, FN(torch::tanh(x))},
        {"sigmoid", {F(S57)}, FN(torch::sigmoid(x))},
        {"relu", {F(S57)}, FN(torch::relu(x))},
        {"gelu", {F(S57)}, FN(torch::gelu(x))},
        {"gelu_tanh", {F(S57)}, FN(torch::gelu(x, "tanh"))},
        {"silu", {F(S57)}, FN(torch::silu(x))},
        {"mish", {F(S57)}, FN(torch::mish(x))},
        {"sqrt", {F(S57)}, FN(torch::sqrt(x.abs() + 0.1))},
        {"rsqrt", {F(S57)}, FN(torch::rsqrt(x.abs() + 0.1))},
        {"abs", {F(S57)}, FN(torch::abs(x))},
        {"neg", {F(S57)}, FN(torch::neg(x))},
        {"reciprocal", {F(S57)}, FN(torch::reciprocal(x.abs() + 0.5))},
        {"erf", {F(S57)}, FN(torch::erf(x))},
        {"erfc", {F(S57)}, FN(torch::erfc(x))},
        {"erfinv", {F(S57)}, FN(torch::erfinv(torch::tanh(x) * 0.9))},
        {"softplus", {F(S57)}, FN(torch::softplus(x, 1.5, 20))},
        {"elu", {F(S57)}, FN(torch::elu(x, 0.8))},
        {"selu", {F(S57)}, FN(torch::selu(x))},
        {"celu", {F(S57)}, FN(torch::celu(x, 0.7))},
        {"leaky_relu", {F(S57)}, FN(torch::leaky_relu(x, 0.1))},
        {"hardtanh", {F(S57)}, FN(torch::hardtanh(x, -0.8, 0.8))},
        {"hardsigmoid", {F(S57)}, FN(torch::hardsigmoid(x * 3))},
        {"hardswish", {F(S57)}, FN(torch::hardswish(x * 3))},
        {"relu6", {F(S57)}, FN(torch::relu6(x * 4))},
        {"log_sigmoid", {F(S57)}, FN(torch::log_sigmoid(x))},
        {"softsign", {F(S57)}, FN(x / (x.abs() + 1))},
        {"hardshrink", {F(S57)}, FN(torch::hardshrink(x, 0.3))},
        {"softshrink", {F(S57)}, FN(torch::softshrink(x, 0.3))},
        {"tanhshrink", {F(S57)}, FN(x - torch::tanh(x))},
        {"asin", {F(S57)}, FN(torch::asin(torch::tanh(x) * 0.9))},
        {"acos", {F(S57)}, FN(torch::acos(torch::tanh(x) * 0.9))},
        {"atan", {F(S57)}, FN(torch::atan(x))},
        {"sinh", {F(S57)}, FN(torch::sinh(x))},
        {"cosh", {F(S57)}, FN(torch::cosh(x))},
        {"asinh", {F(S57)}, FN(torch::asinh(x))},
        {"acosh", {F(S57)}, FN(torch::acosh(x.abs() + 1.5))},
        {"atanh", {F(S57)}, FN(torch::atanh(torch::tanh(x) * 0.9))},
        {"square", {F(S57)}, FN(torch::square(x))},
        {"sign_mul", {F(S57)}, FN(torch::sign(x) * x)},
        {"floor", {F(S57)}, FN(torch::floor(x * 3) + x)},
        {"round", {F(S57)}, FN(torch::round(x * 3) * x)},
        {"frac", {F(S57)}, FN(torch::frac(x * 3))},
        {"sinc", {F(S57)}, FN(torch::sinc(x))},
        {"logit", {F(S57)}, FN(torch::logit(torch::sigmoid(x) * 0.8 + 0.1))},
        {"lgamma", {F(S57)}, FN(torch::lgamma(x.abs() + 0.5))},
        {"digamma", {F(S57)}, FN(torch::digamma(x.abs() + 0.5))},
        {"polygamma", {F(S57)}, FN(torch::polygamma(1, x.abs() + 0.5))},
        {"i0", {F(S57)}, FN(torch::i0(x))},
        {"nan_to_num", {F(S57)}, FN(torch::nan_to_num(x * 2))},
        {"clamp", {F(S57)}, FN(torch::clamp(x, -0.5, 0.5))},
        {"clamp_min", {F(S57)}, FN(torch::clamp_min(x, 0.1))},
        {"clamp_max", {F(S57)}, FN(torch::clamp_max(x, 0.1))},
        {"clamp_tensor", {F(S57), F({7})}, FN(torch::clamp(x, y - 0.5, y + 0.5))},
        {"threshold", {F(S57)}, FN(torch::threshold(x, 0.1, 2.0))},
        {"glu", {F({5, 8})}, FN(torch::glu(x, -1))},
        {"prelu", {F({4, 3, 5}), F({3})}, FN(torch::prelu(x, y))},
        {"pow_int_exponent", {F(S57)}, FN(torch::pow(x, 3))},
        {"pow_float_exponent", {F(S57)}, FN(torch::pow(x.abs() + 0.5, 2.5))},
        {"pow_scalar_base", {F(S57)}, FN(torch::pow(2.0, x))},
        {"deg2rad", {F(S57)}, FN(torch::deg2rad(x * 90))},

        // ---- pointwise binary: broadcasting, type promotion, scalars ------------------
        {"add_bcast", {F(S57), F({7})}, FN(x + y)},
        {"add_alpha_bcast", {F({5, 1, 7}), F({3, 1})}, FN(torch::add(x, y, 0.5))},
        {"sub_bcast", {F({3, 1, 5}), F({4, 5})}, FN(x - y)},
        {"mul_bcast", {F(S57), F({5, 1})}, FN(x * y)},
        {"div_bcast", {F(S57), F({7})}, FN(x / (y.abs() + 0.5))},
        {"rsub_scalar", {F(S57)}, FN(torch::rsub(x, 2.0))},
        {"add_scalar", {F(S57)}, FN(x + 3.5)},
        {"mul_scalar", {F(S57)}, FN(x * 1.5)},
        {"div_scalar", {F(S57)}, FN(x / 3.0)},
        {"pow_tensor", {F(S57), F({7})}, FN(torch::pow(x.abs() + 0.5, y))},
        {"maximum", {F(S57), F(S57)}, FN(torch::maximum(x, y))},
        {"minimum_bcast", {F(S57), F({7})}, FN(torch::minimum(x, y))},
        {"fmax", {F(S57), F(S57)}, FN(torch::fmax(x, y))},
        {"fmin", {F(S57), F({5, 1})}, FN(torch::fmin(x, y))},
        {"atan2", {F(S57), F(S57)}, FN(torch::atan2(x, y.abs() + 0.5))},
        {"where", {Mask(S57), F(S57), F({7})}, FN(torch::where(x, y, z))},
        {"where_scalar", {Mask({7}), F(S57)}, FN(torch::where(x, y, 0.25))},
        {"lerp_scalar", {F(S57), F(S57)}, FN(torch::lerp(x, y, 0.3))},
        {"lerp_tensor", {F(S57), F({7}), F(S57)}, FN(torch::lerp(x, y, z))},
        {"addcmul", {F(S57), F(S57), F({7})}, FN(torch::addcmul(x, y, z, 0.5))},
        {"addcdiv", {F(S57), F(S57), F({7})}, FN(torch::addcdiv(x, y, z.abs() + 0.5, 0.5))},
        {"promote_add", {F(S57), Oth(S57)}, FN(x + y)},
        {"promote_mul_bcast", {F(S57), Oth({7})}, FN(x * y)},
        {"promote_int_tensor", {F(S57), Idx(S57, 5)}, FN(x * y)},
        {"promote_zero_dim_other", {F(S57), Oth({})}, FN(x * y)},
        {"hypot", {F(S57), F(S57)}, FN(torch::hypot(x, y))},
        {"copysign", {F(S57), F(S57)}, FN(torch::copysign(x, y))},
        {"fmod", {F(S57)}, FN(torch::fmod(x * 3, 1.5))},
        {"remainder", {F(S57), F({7})}, FN(torch::remainder(x, y.abs() + 0.5))},
        {"xlogy", {F(S57), F(S57)}, FN(torch::xlogy(x, y.abs() + 0.5))},
        {"logaddexp", {F(S57), F(S57)}, FN(torch::logaddexp(x, y))},
        {"logaddexp2", {F(S57), F({7})}, FN(torch::logaddexp2(x, y))},
        {"float_power", {F(S57)}, FN(torch::float_power(x.abs() + 0.5, 2.0))},
        {"dist", {F(S57), F(S57)}, FN(torch::dist(x, y, 2))},
        {"cdist", {F({5, 3}), F({4, 3})}, FN(torch::cdist(x, y))},
        {"cosine_similarity", {F(S57), F(S57)}, FN(torch::cosine_similarity(x, y, 1))},
        {"pairwise_distance", {F(S57), F(S57)}, FN(torch::pairwise_distance(x, y))},
        {"cross", {F({5, 3}), F({5, 3})}, FN(torch::linalg_cross(x, y, -1))},

        // ---- reductions ---------------------------------------------------------------
        {"sum_all", {F(S345)}, FN(x.sum())},
        {"sum_dim_keepdim", {F(S345)}, FN(x.sum(at::IntArrayRef{1}, true))},
        {"sum_dims", {F(S345)}, FN(x.sum(at::IntArrayRef{0, 2}))},
        {"mean_dim", {F(S345)}, FN(x.mean(at::IntArrayRef{-1}))},
        {"mean_all", {F(S345)}, FN(x.mean())},
        {"prod_dim", {F(S345)}, FN(x.prod(1))},
        {"prod_all", {F({3, 4})}, FN(x.prod())},
        {"amax", {F(S345)}, FN(x.amax({1}))},
        {"amin_keepdim", {F(S345)}, FN(x.amin({0, 2}, true))},
        {"max_dim", {F(S345)}, FN(std::get<0>(x.max(1)))},
        {"min_dim_keepdim", {F(S345)}, FN(std::get<0>(x.min(2, true)))},
        {"max_all", {F(S345)}, FN(x.max())},
        {"var_dim", {F(S345)}, FN(x.var(at::IntArrayRef{1}, true, false))},
        {"var_biased_keepdim", {F(S345)}, FN(x.var(at::IntArrayRef{0, 2}, false, true))},
        {"std_dim", {F(S345)}, FN(x.std(at::IntArrayRef{2}, true, true))},
        {"var_mean", {F(S345)}, FNV([&] {
           auto vm = torch::var_mean(x, at::IntArrayRef{1});
           return Tensors{std::get<0>(vm), std::get<1>(vm)};
         }())},
        {"std_mean", {F(S345)}, FNV([&] {
           auto sm = torch::std_mean(x, at::IntArrayRef{0, 2}, true, true);
           return Tensors{std::get<0>(sm), std::get<1>(sm)};
         }())},
        {"norm_dim", {F(S345)}, FN(x.norm(2, {1}))},
        {"norm_p1_keepdim", {F(S345)}, FN(x.norm(1, {2}, true))},
        {"norm_all", {F(S345)}, FN(x.norm())},
        {"vector_norm_p3", {F(S345)}, FN(torch::linalg_vector_norm(x, 3, at::IntArrayRef{1, 2}, false))},
        {"logsumexp", {F(S345)}, FN(torch::logsumexp(x, at::IntArrayRef{1}))},
        {"cumsum", {F(S345)}, FN(torch::cumsum(x, 1))},
        {"cumprod", {F(S345)}, FN(torch::cumprod(x, 2))},
        {"cummax", {F(S345)}, FN(std::get<0>(torch::cummax(x, 1)))},
        {"logcumsumexp", {F(S345)}, FN(torch::logcumsumexp(x, 2))},
        {"median_dim", {F(S345)}, FN(std::get<0>(torch::median(x, 1)))},
        {"kthvalue", {F(S345)}, FN(std::get<0>(torch::kthvalue(x, 2, 2)))},
        {"nansum", {F(S345)}, FN(torch::nansum(x, at::IntArrayRef{1}))},
        {"trace", {F(S57)}, FN(torch::trace(x))},
        {"nanmean", {F(S345)}, FN(torch::nanmean(x, at::IntArrayRef{0, 2}, true))},

        // ---- views and shape ops ------------------------------------------------------
        // view needs compatible strides: contiguous inputs only.
        {"view", {F(S57)}, FN(x.view({35})), 1, false},
        {"view_3d", {F(S345)}, FN(x.view({12, 5})), 1, false},
        {"reshape", {F(S345)}, FN(x.reshape({4, 15}))},
        {"permute", {F(S345)}, FN(x.permute({2, 0, 1}))},
        {"transpose", {F(S345)}, FN(x.transpose(0, 2))},
        {"t", {F(S57)}, FN(x.t())},
        {"expand", {F({5, 1})}, FN(x.expand({4, 5, 3}))},
        {"squeeze_dim", {F({5, 1, 7})}, FN(x.squeeze(1))},
        {"squeeze_all", {F({1, 5, 1, 7})}, FN(x.squeeze())},
        {"unsqueeze", {F(S57)}, FN(x.unsqueeze(1))},
        {"narrow", {F(S57)}, FN(x.narrow(1, 2, 4))},
        {"slice_index", {F(S57)}, FN(x.index({Slice(1, 4), Slice(None, None, 2)}))},
        {"select", {F(S345)}, FN(x.select(1, 2))},
        {"flatten", {F(S345)}, FN(x.flatten(1))},
        {"unflatten", {F({3, 20})}, FN(x.unflatten(1, {4, 5}))},
        {"unfold", {F(S57)}, FN(x.unfold(1, 3, 2))},
        {"diagonal", {F(S345)}, FN(x.diagonal(1, 1, 2))},
        {"chunk", {F(S57)}, FNV(x.chunk(3, 1))},
        {"split", {F(S57)}, FNV(x.split(2, 0))},
        {"split_with_sizes", {F(S57)}, FNV(x.split_with_sizes({2, 5}, 1))},
        {"unbind", {F(S345)}, FNV(x.unbind(1))},
        {"movedim", {F(S345)}, FN(x.movedim(0, 2))},
        {"repeat", {F({2, 3})}, FN(x.repeat({2, 1, 3}))},
        {"roll", {F(S57)}, FN(x.roll({1, -2}, {0, 1}))},
        {"flip", {F(S57)}, FN(x.flip({0, 1}))},
        {"rot90", {F(S57)}, FN(torch::rot90(x, 1, {0, 1}))},
        {"tril", {F(S57)}, FN(x.tril(1))},
        {"triu", {F(S57)}, FN(x.triu(-1))},
        {"clone", {F(S57)}, FN(x.clone())},
        {"diag_embed", {F({3, 4})}, FN(torch::diag_embed(x))},
        {"diag", {F({5})}, FN(torch::diag(x))},

        // ---- indexing -----------------------------------------------------------------
        {"index_select", {F(S57), Idx({4}, 7)}, FN(torch::index_select(x, 1, y))},
        {"gather", {F(S57), Idx({5, 3}, 7)}, FN(torch::gather(x, 1, y))},
        {"index_tensor", {F(S57), Idx({4}, 5)}, FN(x.index({y}))},
        {"index_tensor_dim1", {F(S57), Idx({3, 2}, 7)}, FN(x.index({Slice(), y}))},
        {"index_two_tensors", {F(S57), Idx({4}, 5), Idx({4}, 7)}, FN(x.index({y, z}))},
        {"masked_fill", {F(S57), Mask(S57)}, FN(x.masked_fill(y, 0.5))},
        {"masked_fill_bcast", {F(S57), Mask({7})}, FN(x.masked_fill(y, -1.0))},
        {"scatter", {F(S57), Uniq({5, 3}, 7), F({5, 3})}, FN(torch::scatter(x, 1, y, z))},
        {"scatter_value", {F(S57), Uniq({5, 3}, 7)}, FN(torch::scatter(x, 1, y, 2.0))},
        {"scatter_add", {F(S57), Idx({5, 4}, 7), F({5, 4})}, FN(torch::scatter_add(x, 1, y, z))},
        {"scatter_reduce_sum", {F(S57), Idx({5, 4}, 7), F({5, 4})}, FN(torch::scatter_reduce(x, 1, y, z, "sum"))},
        {"index_add", {F(S57), Idx({6}, 5), F({6, 7})}, FN(torch::index_add(x, 0, y, z, 0.5))},
        {"index_copy", {F(S57), Uniq({3}, 5), F({3, 7})}, FN(torch::index_copy(x, 0, y, z))},
        {"index_fill", {F(S57), Idx({3}, 7)}, FN(x.index_fill(1, y, 0.25))},
        {"index_put_accumulate", {F(S57), Idx({4}, 5), F({4, 7})}, FN(x.index_put({y}, z, true))},
        {"take_along_dim", {F(S57), Idx({5, 3}, 7)}, FN(torch::take_along_dim(x, y, 1))},
        {"take", {F(S57), Idx({6}, 35)}, FN(torch::take(x, y))},
        {"embedding", {F({10, 4}), Idx({3, 5}, 10)}, FN(torch::embedding(x, y))},

        // ---- matmul family ------------------------------------------------------------
        {"mm", {F(S57), F({7, 3})}, FN(torch::mm(x, y))},
        {"bmm", {F({3, 5, 4}), F({3, 4, 6})}, FN(torch::bmm(x, y))},
        {"matmul_bcast", {F({2, 5, 4}), F({4, 3})}, FN(torch::matmul(x, y))},
        {"matmul_vec_mat", {F({4}), F({4, 3})}, FN(torch::matmul(x, y))},
        {"matmul_batch_bcast", {F({2, 1, 5, 4}), F({3, 4, 6})}, FN(torch::matmul(x, y))},
        {"addmm", {F({3}), F({5, 4}), F({4, 3})}, FN(torch::addmm(x, y, z, 0.5, 2.0))},
        {"baddbmm", {F({3, 5, 6}), F({3, 5, 4}), F({3, 4, 6})}, FN(torch::baddbmm(x, y, z, 0.5, 1.5))},
        {"addmv", {F({5}), F({5, 4}), F({4})}, FN(torch::addmv(x, y, z))},
        {"addbmm", {F({5, 6}), F({3, 5, 4}), F({3, 4, 6})}, FN(torch::addbmm(x, y, z))},
        {"addr", {F({5, 4}), F({5}), F({4})}, FN(torch::addr(x, y, z))},
        {"linear", {F(S57), F({3, 7}), F({3})}, FN(torch::linear(x, y, z))},
        {"linear_nobias", {F({2, 5, 7}), F({3, 7})}, FN(torch::linear(x, y))},
        {"bilinear", {F({5, 3}), F({5, 4}), F({2, 3, 4}), F({2})}, FN(torch::bilinear(x, y, z, u))},
        {"einsum_bmm", {F({3, 5, 4}), F({3, 4, 6})}, FN(torch::einsum("bij,bjk->bik", {x, y}))},
        {"einsum_rowdot", {F(S57), F(S57)}, FN(torch::einsum("ij,ij->i", {x, y}))},
        {"outer", {F({5}), F({7})}, FN(torch::outer(x, y))},
        {"dot", {F({7}), F({7})}, FN(torch::dot(x, y))},
        {"mv", {F(S57), F({7})}, FN(torch::mv(x, y))},
        {"tensordot", {F(S345), F({4, 5, 2})}, FN(torch::tensordot(x, y, {1, 2}, {0, 1}))},
        // kron _unsafe_views its inputs: eager PyTorch rejects non-contiguous ones.
        {"kron", {F({2, 3}), F({3, 2})}, FN(torch::kron(x, y)), 1, false},
        {"linalg_inv", {F({5, 5})}, FN(torch::linalg_inv(x * 0.1 + torch::eye(5, x.options())))},

        // ---- convolution --------------------------------------------------------------
        {"conv1d", {F({2, 3, 11}), F({4, 3, 3}), F({4})}, FN(torch::conv1d(x, y, z))},
        {"conv1d_stride_pad", {F({2, 3, 11}), F({4, 3, 3}), F({4})}, FN(torch::conv1d(x, y, z, 2, 1))},
        {"conv2d_stride_pad", {F({2, 3, 7, 9}), F({4, 3, 3, 3}), F({4})}, FN(torch::conv2d(x, y, z, 2, 1))},
        {"conv2d_groups", {F({2, 4, 7, 9}), F({6, 2, 3, 3}), F({6})}, FN(torch::conv2d(x, y, z, 1, 1, 1, 2))},
        {"conv2d_dilation_nobias", {F({2, 3, 9, 9}), F({2, 3, 3, 3})}, FN(torch::conv2d(x, y, at::Tensor(), 1, at::IntArrayRef{0}, 2))},
        {"conv_transpose1d", {F({2, 3, 7}), F({3, 4, 3}), F({4})}, FN(torch::conv_transpose1d(x, y, z, 2, 1))},
        {"conv_transpose2d", {F({2, 3, 5, 6}), F({3, 4, 3, 3}), F({4})},
         FN(torch::conv_transpose2d(x, y, z, 2, 1, 1))},
        {"conv3d", {F({1, 2, 5, 5, 5}), F({3, 2, 3, 3, 3}), F({3})}, FN(torch::conv3d(x, y, z))},

        // ---- pooling and resampling ---------------------------------------------------
        {"max_pool2d", {F({2, 3, 7, 9})}, FN(torch::max_pool2d(x, {2, 2}))},
        {"max_pool2d_pad", {F({2, 3, 7, 9})}, FN(torch::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}))},
        {"max_pool1d", {F({2, 3, 11})}, FN(torch::max_pool1d(x, 3, 2))},
        {"avg_pool2d", {F({2, 3, 7, 9})}, FN(torch::avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}))},
        {"avg_pool2d_no_pad_count", {F({2, 3, 7, 9})}, FN(torch::avg_pool2d(x, {2, 2}, {2, 2}, {1, 1}, false, false))},
        {"avg_pool1d", {F({2, 3, 11})}, FN(torch::avg_pool1d(x, 3, 2))},
        {"adaptive_avg_pool2d", {F({2, 3, 7, 9})}, FN(torch::adaptive_avg_pool2d(x, {3, 2}))},
        {"adaptive_max_pool2d", {F({2, 3, 7, 9})}, FN(std::get<0>(torch::adaptive_max_pool2d(x, {3, 2})))},
        {"adaptive_avg_pool1d", {F({2, 3, 11})}, FN(torch::adaptive_avg_pool1d(x, 4))},
        {"upsample_nearest2d", {F({2, 3, 4, 5})}, FN(at::upsample_nearest2d(x, at::IntArrayRef{8, 10}))},
        {"upsample_bilinear2d", {F({2, 3, 4, 5})}, FN(at::upsample_bilinear2d(x, at::IntArrayRef{7, 9}, false))},
        {"pixel_shuffle", {F({2, 8, 3, 4})}, FN(torch::pixel_shuffle(x, 2))},

        // ---- normalization ------------------------------------------------------------
        {"layer_norm", {F(S345), F({5}), F({5})}, FN(torch::layer_norm(x, {5}, y, z))},
        {"layer_norm_noaffine", {F(S345)}, FN(torch::layer_norm(x, {4, 5}))},
        {"group_norm", {F({2, 6, 5}), F({6}), F({6})}, FN(torch::group_norm(x, 3, y, z))},
        // Training mode with running stats: u and v are updated in place (compared too).
        {"batch_norm_train", {F({4, 3, 5}), F({3}), F({3}), C({3}), Pos({3})},
         FN(torch::batch_norm(x, y, z, u, v, true, 0.1, 1e-5, false))},
        {"batch_norm_eval", {F({4, 3, 5}), F({3}), F({3}), C({3}), Pos({3})},
         FN(torch::batch_norm(x, y, z, u, v, false, 0.1, 1e-5, false))},
        {"batch_norm_2d_no_stats", {F({4, 3, 5, 2}), F({3}), F({3})},
         FN(torch::batch_norm(x, y, z, {}, {}, true, 0.1, 1e-5, false))},
        {"instance_norm", {F({2, 3, 7}), F({3}), F({3})},
         FN(torch::instance_norm(x, y, z, {}, {}, true, 0.1, 1e-5, false))},
        {"rms_norm", {F(S345), F({5})}, FN(at::rms_norm(x, {5}, y, 1e-6))},
        {"normalize", {F(S57)}, FN(x / x.norm(2, {1}, true).clamp_min(1e-12))},

        // ---- softmax ------------------------------------------------------------------
        {"softmax_last", {F(S345)}, FN(torch::softmax(x, -1))},
        {"softmax_dim0", {F(S345)}, FN(torch::softmax(x, 0))},
        {"log_softmax", {F(S345)}, FN(torch::log_softmax(x, 1))},

        // ---- losses -------------------------------------------------------------------
        {"mse_loss", {F(S57), F(S57)}, FN(torch::mse_loss(x, y))},
        {"mse_loss_sum", {F(S57), C(S57)}, FN(torch::mse_loss(x, y, kSum))},
        {"l1_loss", {F(S57), F(S57)}, FN(torch::l1_loss(x, y))},
        {"smooth_l1_loss", {F(S57), F(S57)}, FN(torch::smooth_l1_loss(x, y, kMean, 0.5))},
        {"huber_loss", {F(S57), F(S57)}, FN(torch::huber_loss(x, y, kMean, 0.7))},
        {"cross_entropy", {F(S57), Idx({5}, 7)}, FN(torch::cross_entropy_loss(x, y))},
        {"cross_entropy_label_smoothing", {F(S57), Idx({5}, 7)},
         FN(torch::cross_entropy_loss(x, y, {}, kMean, -100, 0.1))},
        {"cross_entropy_prob_target", {F(S57), Prob(S57)}, FN(torch::cross_entropy_loss(x, y))},
        {"cross_entropy_weight", {F(S57), Idx({5}, 7), Pos({7})}, FN(torch::cross_entropy_loss(x, y, z))},
        {"nll_loss", {F(S57), Idx({5}, 7)}, FN(torch::nll_loss(torch::log_softmax(x, 1), y))},
        {"nll_loss2d", {F({2, 4, 3, 5}), Idx({2, 3, 5}, 4)}, FN(torch::nll_loss2d(torch::log_softmax(x, 1), y))},
        {"bce_with_logits", {F(S57), Prob(S57)}, FN(torch::binary_cross_entropy_with_logits(x, y))},
        {"bce_with_logits_pos_weight", {F(S57), Prob(S57), Pos({7})},
         FN(torch::binary_cross_entropy_with_logits(x, y, {}, z))},
        {"binary_cross_entropy", {F(S57), Prob(S57)}, FN(torch::binary_cross_entropy(torch::sigmoid(x), y))},
        {"kl_div", {F(S57), C(S57)}, FN(torch::kl_div(torch::log_softmax(x, 1), torch::softmax(y, 1)))},
        {"kl_div_log_target", {F(S57), F(S57)},
         FN(torch::kl_div(torch::log_softmax(x, 1), torch::log_softmax(y, 1), kMean, true))},
        {"soft_margin_loss", {F(S57), Sgn(S57)}, FN(torch::soft_margin_loss(x, y))},
        {"margin_ranking_loss", {F({7}), F({7}), Sgn({7})}, FN(torch::margin_ranking_loss(x, y, z, 0.1))},
        {"hinge_embedding_loss", {F(S57), Sgn(S57)}, FN(torch::hinge_embedding_loss(x, y, 1.0))},
        {"cosine_embedding_loss", {F(S57), F(S57), Sgn({5})}, FN(torch::cosine_embedding_loss(x, y, z, 0.1))},
        {"poisson_nll_loss", {F(S57), Pos(S57)}, FN(torch::poisson_nll_loss(x, y, true, false, 1e-8, kMean))},
        {"multi_margin_loss", {F(S57), Idx({5}, 7)}, FN(torch::multi_margin_loss(x, y, 1, 1.0))},
        {"triplet_margin_loss", {F(S57), F(S57), F(S57)},
         FN(torch::triplet_margin_loss(x, y, z, 1.0, 2, 1e-6, false, kMean))},

        // ---- joining, padding, sorting, misc -------------------------------------------
        {"cat_dim0", {F({2, 7}), F({3, 7})}, FN(torch::cat({x, y}, 0))},
        {"cat_dim1_three", {F({5, 2}), F({5, 3}), F({5, 1})}, FN(torch::cat({x, y, z}, 1))},
        {"stack", {F(S57), F(S57), F(S57)}, FN(torch::stack({x, y, z}, 1))},
        {"constant_pad", {F(S57)}, FN(torch::constant_pad_nd(x, {1, 2, 0, 1}, 0.5))},
        {"reflection_pad2d", {F({2, 3, 5, 6})}, FN(at::reflection_pad2d(x, {1, 1, 2, 0}))},
        {"replication_pad1d", {F({2, 3, 7})}, FN(at::replication_pad1d(x, {2, 3}))},
        {"sort_values", {F(S57)}, FN(std::get<0>(torch::sort(x, 1)))},
        {"sort_descending", {F(S57)}, FN(std::get<0>(torch::sort(x, 0, true)))},
        {"topk", {F(S57)}, FN(std::get<0>(torch::topk(x, 3, 1)))},
        {"topk_smallest", {F(S57)}, FN(std::get<0>(torch::topk(x, 2, 0, false)))},
        {"diff", {F(S57)}, FN(torch::diff(x, 1, 1))},
        {"ones_like_add", {F(S57)}, FN(x * 2 + torch::ones_like(x))},
        {"arange_mul", {F(S57)}, FN(x * torch::arange(7, x.options()))},
    };
    return r;
  }();
  return table;
}

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

class OpSweep : public ::testing::TestWithParam<Param> {};

void run_layout(const Row& row, at::ScalarType dtype, bool noncontig) {
  const std::string where = std::string(noncontig ? "non-contiguous" : "contiguous") + " inputs";
  SCOPED_TRACE(where);
  const double rtol = (dtype == at::kFloat ? 1e-4 : 1e-7) * row.tol;
  const double atol = (dtype == at::kFloat ? 1e-5 : 1e-9) * row.tol;
  torch::manual_seed(fnv1a(row.name) ^ (dtype == at::kFloat ? 0 : 0x5f64) ^ (noncontig ? 0xc0de : 0));

  tcap::CompileOptions options;
  options.name = row.name;
#ifdef TCAP_SWEEP_BACKEND
  options.backend = TCAP_SWEEP_BACKEND;
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
  for (const std::string& key : {row.name, row.name + "_" + dtype_suffix(dtype)}) {
    auto it = known_bugs().find(key);
    if (it != known_bugs().end() && !run_known_bugs()) GTEST_SKIP() << "known tcap bug: " << it->second;
  }
  run_layout(row, dtype, /*noncontig=*/false);
  if (HasFatalFailure()) return;
  if (row.noncontig) run_layout(row, dtype, /*noncontig=*/true);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpSweep,
                         ::testing::Combine(::testing::Range<size_t>(0, rows().size()),
                                            ::testing::Values(at::kFloat, at::kDouble)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return rows().at(std::get<0>(info.param)).name + "_" +
                                  dtype_suffix(std::get<1>(info.param));
                         });

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
