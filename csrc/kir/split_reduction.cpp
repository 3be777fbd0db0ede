#include "kir/split_reduction.h"

#include <algorithm>
#include <limits>
#include <string>

namespace tcap::kir {

// Note [Split reductions]
// A reduction kernel runs in parallel over its outputs (Kernel::parallel_range), so a full
// reduction (a loss's sum or mean) or one into a few outputs (a column sum over a long
// batch of few columns, a softmax over a few long rows) runs on one thread, or a few, at a
// fraction of the memory bandwidth. Split: one reduced dim of size n is cut into `splits`
// chunks of n / splits (a divisor, so every chunk is whole), and the kernel becomes a
// sequence of kernels, one pair per level of Reduces (the passes of kir.h):
//
//   partial q   domain [splits, outer..., reduced...] (that dim n / splits): each Reduce
//               of level q+1 over its chunk, stored into scratch[s, outer]; the Reduces of
//               lower levels are read from their final results (outer-level Loads), so
//               the kernel is one pass; element-wise stores of level q
//   combine q   domain [outer..., splits], reducing splits: each Reduce of level q+1 over
//               the partials (a sum of sums, a max of maxima), stored as its final result
//               where a later kernel reads it; the last combine also computes and stores
//               what the kernel stores per output (a mean's division, a loss's scaling)
//   tail        domain as a partial's, no Reduce: the element-wise stores that read the
//               last level (softmax's exp(x - max) / sum), when there are any
//
// A single-pass kernel (a sum, a mean, a column sum) is one partial and one combine; a
// layer norm over a few long rows is partial 0 (sum), combine 0, partial 1 (sum of
// squared deviations), combine 1 and the tail: five launches and the three passes over
// the data of the unsplit kernel, each over all threads (a softmax's first two levels
// share one pass, below). The partials run in parallel over splits * outputs; the
// combines read splits numbers per output. The number of splits depends on the sizes only,
// never on the thread count, so the summation order (and the bits of the result) is the
// same at any number of threads; it is the smallest divisor giving at least kSplitOutputs
// parallel iterations with chunks of at least kMinChunk elements, else the largest
// divisor with such chunks. The dim is the outermost reduced one that has such a divisor
// (a batch dim before a spatial one). A level's Reduces are final before the next level's
// partials start, except for the sums of exponentials below. The sum is reassociated
// (Note [CPU summation order]): the chunks are summed in order of the chunk index; maxima
// and minima are exact.
//
// Note [Online softmax in split reductions]
// A softmax, log_softmax, cross-entropy or log-sum-exp computes m = max(e) and then
// s = sum(exp(e - m)): two levels, so two passes over the data. Split, the sum need not
// wait for the row's maximum: a chunk computes its own maximum m_c and s_c = sum(exp(e -
// m_c)) over the chunk, and the combine rescales, s = sum_c s_c * exp(m_c - m) (the
// online softmax of Milakov and Gimelshein, by chunks as Note [CUDA row reductions] does
// by lanes). So such a sum is at its maximum's level (split_level): the partial reads
// each chunk twice, the second time from the cache, since chunks then hold at most
// kMaxOnlineChunk elements, and the data once from memory. A softmax over few long rows
// reads its input twice instead of three times (the second pass writes the result).
// Infinities as eager: a chunk of -inf sums around 0 (s_c = 0, scaled by exp(-inf - m) =
// 0); a row of -inf gets nan (exp(-inf - -inf)), as eager's exp(e - m) does; a +inf or a
// nan makes its chunk's and so the row's sum nan. Each exp(e - m) becomes exp(e - m_c) *
// exp(m_c - m): within a few ulps of eager's. Which sums qualify: exactly
// ReduceSum(Exp(Sub(e, m))) with m = ReduceMax(e) of one floating dtype (online_sums); a
// sum around a function of the maximum (logsumexp's shift of infinite maxima) keeps its
// own level.

namespace {

// Contiguous strides of `sizes` (row-major), 0 where a size is 1.
std::vector<int64_t> dense_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size(), 0);
  int64_t s = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    st[d] = sizes[d] == 1 ? 0 : s;
    s *= sizes[d];
  }
  return st;
}

// Splits of a reduced dim of size n, `rest` reduced elements per index of it: the
// smallest divisor giving kSplitOutputs parallel iterations and chunks of at most
// `max_chunk` elements, else the largest whose chunks keep kMinChunk elements.
int64_t choose_splits(int64_t n, int64_t rest, int64_t outputs, int64_t max_chunk) {
  int64_t best = 0;
  for (int64_t s = 2; s <= n && (n / s) * rest >= kMinChunk; ++s) {
    if (n % s != 0) continue;
    best = s;
    if (outputs * s >= kSplitOutputs && (n / s) * rest <= max_chunk) break;
  }
  return best;
}

// The ReduceSums that an online pass can compute beside their maximum (Note [Online
// softmax in split reductions]): s = ReduceSum(Exp(Sub(e, m))) with m = ReduceMax(e), all
// of one floating dtype. Indexed by value id: m's id for such an s, else -1.
std::vector<int32_t> online_sums(const Kernel& k) {
  std::vector<int32_t> max_of(k.instrs.size(), -1);
  auto at = [&](int32_t v) -> const Instr& { return k.instrs[static_cast<size_t>(v)]; };
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& s = k.instrs[v];
    if (s.op != OpCode::ReduceSum || !is_floating(s.dtype)) continue;
    const Instr& ex = at(s.args[0]);
    if (ex.op != OpCode::Exp || ex.dtype != s.dtype) continue;
    const Instr& sub = at(ex.args[0]);
    if (sub.op != OpCode::Sub || sub.dtype != s.dtype) continue;
    const Instr& m = at(sub.args[1]);
    if (m.op != OpCode::ReduceMax || m.dtype != s.dtype || m.args[0] != sub.args[0]) continue;
    max_of[v] = sub.args[1];
  }
  return max_of;
}

// reduce_level with each online sum at its maximum's level: computed in the same pass.
std::vector<int> split_level(const Kernel& k, const std::vector<int32_t>& online) {
  std::vector<int> level(k.instrs.size(), 0);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    int l = 0;
    for (int32_t a : in.args) l = std::max(l, level[static_cast<size_t>(a)]);
    if (online[v] >= 0) level[v] = level[static_cast<size_t>(online[v])];
    else level[v] = is_reduce(in.op) ? l + 1 : l;
  }
  return level;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

Instr op(OpCode code, DType t, std::vector<int32_t> args) {
  Instr in;
  in.op = code;
  in.dtype = t;
  in.args = std::move(args);
  return in;
}
Instr load(DType t, int32_t buffer, std::vector<int64_t> strides) {
  Instr in;
  in.op = OpCode::Load;
  in.dtype = t;
  in.buffer = buffer;
  in.strides = std::move(strides);
  return in;
}
Instr constant(DType t, double f) {
  Instr in;
  in.op = OpCode::Const;
  in.dtype = t;
  in.f = f;
  return in;
}

}  // namespace

std::optional<SplitReduction> split_reduction(const Kernel& k) {
  if (k.num_reduce_dims == 0) return std::nullopt;
  const int64_t outputs = k.outer_numel(), reduced = k.reduce_numel();
  if (outputs >= kSplitOutputs || reduced < kMinSplitElements || outputs == 0) return std::nullopt;
  const std::vector<bool> elem = element_level(k);
  const std::vector<int32_t> online = online_sums(k);
  const std::vector<int> level = split_level(k, online);
  const bool has_online = std::any_of(online.begin(), online.end(), [](int32_t m) { return m >= 0; });
  const size_t rank = k.sizes.size(), no = rank - static_cast<size_t>(k.num_reduce_dims);
  // The reduced dim to split: the outermost one with a divisor (inner dims keep the
  // chunks' accesses contiguous).
  size_t dim = rank;
  int64_t splits = 0;
  for (size_t d = no; d < rank && splits == 0; ++d) {
    splits = choose_splits(k.sizes[d], reduced / k.sizes[d], outputs,
                           has_online ? kMaxOnlineChunk : std::numeric_limits<int64_t>::max());
    if (splits) dim = d;
  }
  if (!splits) return std::nullopt;
  const int64_t chunk = k.sizes[dim] / splits;
  const std::vector<int64_t> outer(k.sizes.begin(), k.sizes.begin() + static_cast<long>(no));
  const std::vector<int64_t> outer_strides = dense_strides(outer);

  // The Reduces, by level; the number of levels; the level of the element-wise stores.
  std::vector<int32_t> reduces;
  int levels = 0;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (!is_reduce(k.instrs[v].op)) continue;
    reduces.push_back(static_cast<int32_t>(v));
    levels = std::max(levels, level[v]);
  }
  bool has_tail = false;
  for (const auto& s : k.stores) {
    if (per_element(k, s, elem) && level[static_cast<size_t>(s.value)] == levels) has_tail = levels > 0;
  }
  if (levels == 0) return std::nullopt;

  // Scratch: a partial per Reduce ([splits, outer...]), then a final result per Reduce
  // that a later kernel reads ([outer...]): those below the last level, and the last
  // level's where the tail reads them.
  SplitReduction out;
  out.splits = splits;
  const size_t nb = k.buffers.size();
  std::vector<Buffer> scratch;
  std::vector<int32_t> partial_buf(k.instrs.size(), -1), final_buf(k.instrs.size(), -1);
  for (size_t r = 0; r < reduces.size(); ++r) {
    const Instr& red = k.instrs[static_cast<size_t>(reduces[r])];
    partial_buf[static_cast<size_t>(reduces[r])] = static_cast<int32_t>(nb + scratch.size());
    scratch.push_back({"partial" + std::to_string(r), red.dtype, false, false});
    out.scratch.push_back(splits * outputs);
  }
  for (size_t r = 0; r < reduces.size(); ++r) {
    const size_t v = static_cast<size_t>(reduces[r]);
    if (level[v] == levels && !has_tail) continue;
    final_buf[v] = static_cast<int32_t>(nb + scratch.size());
    scratch.push_back({"final" + std::to_string(r), k.instrs[v].dtype, false, false});
    out.scratch.push_back(outputs);
  }
  auto buffers_writing = [&](const std::vector<int32_t>& written) {
    std::vector<Buffer> b = k.buffers;
    b.insert(b.end(), scratch.begin(), scratch.end());
    for (int32_t w : written) b[static_cast<size_t>(w)].is_output = true;
    return b;
  };

  // A store of `value` into `buffer` at `strides` (offset 0, or k's store's) in `into`.
  auto store = [](Kernel& into, std::vector<int32_t>& written, int32_t value, int32_t buffer,
                  std::vector<int64_t> strides, int64_t offset) {
    into.stores.push_back({value, buffer, std::move(strides), offset});
    written.push_back(buffer);
  };

  // A partial-shaped kernel ([splits, outer..., reduced...]): the values of level <= q,
  // the Reduces of level q+1 as partials (when `reduce`), Reduces below as final results.
  const size_t pr = rank + 1;
  auto widen = [&](const std::vector<int64_t>& st) {
    std::vector<int64_t> w = st;
    w.insert(w.begin(), st[dim] * chunk);
    return w;
  };
  std::vector<int64_t> final_in_partial{0};  // a final result read by a partial: per output
  final_in_partial.insert(final_in_partial.end(), outer_strides.begin(), outer_strides.end());
  final_in_partial.resize(pr, 0);
  auto chunked = [&](int q, bool reduce, const std::string& name) {
    Kernel p;
    p.name = k.name + name;
    p.sizes = k.sizes;
    p.sizes[dim] = chunk;
    p.sizes.insert(p.sizes.begin(), splits);
    p.num_reduce_dims = k.num_reduce_dims;
    std::vector<int32_t> written, map(k.instrs.size(), -1);
    for (size_t v = 0; v < k.instrs.size(); ++v) {
      const Instr& in = k.instrs[v];
      if (is_reduce(in.op) && level[v] <= q) {
        map[v] = add(p, load(in.dtype, final_buf[v], final_in_partial));
        continue;
      }
      if (level[v] > q + (reduce && is_reduce(in.op) ? 1 : 0)) continue;
      if (online[v] >= 0) {
        // The chunk's sum of exp(e - m_c) around the chunk's maximum m_c, or around 0
        // where m_c is -inf (every element -inf: exp(-inf - -inf) would be nan).
        const DType t = in.dtype;
        const int32_t mc = map[static_cast<size_t>(online[v])];
        const int32_t e = map[static_cast<size_t>(k.instrs[static_cast<size_t>(online[v])].args[0])];
        const int32_t empty = add(p, op(OpCode::Eq, DType::Bool, {mc, add(p, constant(t, -kInf))}));
        const int32_t around = add(p, op(OpCode::Where, t, {empty, add(p, constant(t, 0)), mc}));
        const int32_t ex = add(p, op(OpCode::Exp, t, {add(p, op(OpCode::Sub, t, {e, around}))}));
        map[v] = add(p, op(OpCode::ReduceSum, t, {ex}));
      } else {
        Instr c = in;
        for (auto& a : c.args) a = map[static_cast<size_t>(a)];
        if (c.op == OpCode::Load) c.strides = widen(in.strides);
        map[v] = add(p, std::move(c));
      }
      if (is_reduce(in.op)) {
        std::vector<int64_t> st{outputs};
        st.insert(st.end(), outer_strides.begin(), outer_strides.end());
        st.resize(pr, 0);  // zero on the reduced dims
        store(p, written, map[v], partial_buf[v], std::move(st), 0);
      }
    }
    for (const auto& s : k.stores) {
      if (!per_element(k, s, elem) || level[static_cast<size_t>(s.value)] != q) continue;
      store(p, written, map[static_cast<size_t>(s.value)], s.buffer, widen(s.strides), s.offset);
    }
    p.buffers = buffers_writing(written);
    return p;
  };

  // A combine ([outer..., splits], reducing splits): the Reduces of level q+1 from their
  // partials, the lower ones from their final results; the last also stores per output.
  auto narrow = [&](const std::vector<int64_t>& st) {  // k's strides on the outer dims, 0 on splits
    std::vector<int64_t> w(st.begin(), st.begin() + static_cast<long>(no));
    w.push_back(0);
    return w;
  };
  auto combine = [&](int q) {
    const bool last = q + 1 == levels;
    Kernel c;
    c.name = k.name + "_combine" + (levels > 1 ? std::to_string(q) : "");
    c.sizes = outer;
    c.sizes.push_back(splits);
    c.num_reduce_dims = 1;
    std::vector<int32_t> written, map(k.instrs.size(), -1);
    for (size_t v = 0; v < k.instrs.size(); ++v) {
      const Instr& in = k.instrs[v];
      if (elem[v]) continue;  // read only by the Reduces, which read the partials instead
      if (!last && !is_reduce(in.op)) continue;
      if (is_reduce(in.op) && level[v] <= q) {
        if (!last) continue;
        std::vector<int64_t> st = outer_strides;
        st.push_back(0);
        map[v] = add(c, load(in.dtype, final_buf[v], std::move(st)));
        continue;
      }
      if (is_reduce(in.op)) {
        if (level[v] != q + 1) continue;
        auto partials = [&](int32_t of) {
          std::vector<int64_t> st = outer_strides;
          st.push_back(outputs);
          return add(c, load(in.dtype, partial_buf[static_cast<size_t>(of)], std::move(st)));
        };
        if (online[v] >= 0) {
          // sum over chunks of s_c * exp(m_c - m): each chunk's sum rescaled to the
          // row's maximum (0 for a chunk of -inf, nan for a row of -inf, as eager).
          const DType t = in.dtype;
          const int32_t mc = partials(online[v]);
          const int32_t scale = add(c, op(OpCode::Exp, t, {add(c, op(OpCode::Sub, t, {mc, map[static_cast<size_t>(online[v])]}))}));
          map[v] = add(c, op(OpCode::ReduceSum, t, {add(c, op(OpCode::Mul, t, {partials(static_cast<int32_t>(v)), scale}))}));
        } else {
          Instr red = in;
          red.args = {partials(static_cast<int32_t>(v))};
          map[v] = add(c, std::move(red));
        }
        if (final_buf[v] >= 0) {
          std::vector<int64_t> st = outer_strides;
          st.push_back(0);
          store(c, written, map[v], final_buf[v], std::move(st), 0);
        }
        continue;
      }
      Instr n = in;
      for (auto& a : n.args) a = map[static_cast<size_t>(a)];
      if (n.op == OpCode::Load) n.strides = narrow(in.strides);
      map[v] = add(c, std::move(n));
    }
    if (last) {
      for (const auto& s : k.stores) {
        if (!per_element(k, s, elem)) store(c, written, map[static_cast<size_t>(s.value)], s.buffer, narrow(s.strides), s.offset);
      }
    }
    c.buffers = buffers_writing(written);
    return c;
  };

  for (int q = 0; q < levels; ++q) {
    out.kernels.push_back(chunked(q, true, levels > 1 ? "_partial" + std::to_string(q) : "_partial"));
    out.kernels.push_back(combine(q));
  }
  if (has_tail) out.kernels.push_back(chunked(levels, false, "_tail"));
  for (const Kernel& kk : out.kernels) verify(kk);
  return out;
}

}  // namespace tcap::kir
