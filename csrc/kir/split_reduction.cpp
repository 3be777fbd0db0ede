#include "kir/split_reduction.h"

#include <algorithm>
#include <string>

namespace tcap::kir {

// Note [Split reductions]
// A reduction kernel runs in parallel over its outputs (Kernel::parallel_range), so a full
// reduction (a loss's sum or mean) or one into a few outputs (a column sum over a long
// batch of few columns) runs on one thread, at a fraction of the memory bandwidth. Split:
// one reduced dim of size n is cut into `splits` chunks of n / splits (a divisor, so every
// chunk is whole), and the kernel becomes two:
//
//   partial   domain [splits, outer..., reduced...] (that dim n / splits): every Reduce over
//             its chunk, stored into scratch[s, outer]; element-wise stores as before
//   combine   domain [outer..., splits], reducing splits: each Reduce over the partials
//             (a sum of sums, a max of maxima), then what the kernel computes and stores
//             per output (a mean's division, a loss's scaling)
//
// `partial` runs in parallel over splits * outputs; `combine` reads splits numbers per
// output. The number of splits depends on the sizes only, never on the thread count, so
// the summation order (and the bits of the result) is the same at any number of threads;
// it is the smallest divisor giving at least kSplitOutputs parallel iterations with chunks
// of at least kMinChunk elements, else the largest divisor with such chunks. The dim is the
// outermost reduced one that has such a divisor (a batch dim before a spatial one).
// Only single-pass kernels are split: every Reduce reads element values (level 0), and no
// element-wise store writes a value computed from a Reduce (softmax's second pass): a
// combine of those would need the online rescaling of Note [CUDA row reductions] and is not
// done on the CPU. The sum is reassociated (Note [CPU summation order]): the chunks are
// summed in order of the chunk index.

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

// Splits of a reduced dim of size n, `rest` reduced elements per index of it.
int64_t choose_splits(int64_t n, int64_t rest, int64_t outputs) {
  int64_t best = 0;
  for (int64_t s = 2; s <= n && (n / s) * rest >= kMinChunk; ++s) {
    if (n % s != 0) continue;
    best = s;
    if (outputs * s >= kSplitOutputs) break;
  }
  return best;
}

}  // namespace

std::optional<SplitReduction> split_reduction(const Kernel& k) {
  if (k.num_reduce_dims == 0) return std::nullopt;
  const int64_t outputs = k.outer_numel(), reduced = k.reduce_numel();
  if (outputs >= kSplitOutputs || reduced < kMinSplitElements || outputs == 0) return std::nullopt;
  const std::vector<bool> elem = element_level(k);
  const std::vector<int> level = reduce_level(k);
  for (const auto& in : k.instrs) {
    if (is_reduce(in.op) && level[static_cast<size_t>(in.args[0])] != 0) return std::nullopt;
  }
  for (const auto& s : k.stores) {
    if (per_element(k, s, elem) && level[static_cast<size_t>(s.value)] != 0) return std::nullopt;
  }
  const size_t rank = k.sizes.size(), no = rank - static_cast<size_t>(k.num_reduce_dims);
  // The reduced dim to split: the outermost one with a divisor (inner dims keep the
  // chunks' accesses contiguous).
  size_t dim = rank;
  int64_t splits = 0;
  for (size_t d = no; d < rank && splits == 0; ++d) {
    splits = choose_splits(k.sizes[d], reduced / k.sizes[d], outputs);
    if (splits) dim = d;
  }
  if (!splits) return std::nullopt;
  const int64_t chunk = k.sizes[dim] / splits;
  const std::vector<int64_t> outer(k.sizes.begin(), k.sizes.begin() + static_cast<long>(no));
  const std::vector<int64_t> outer_strides = dense_strides(outer);

  SplitReduction out;
  out.splits = splits;
  // --- partial: [splits, outer..., reduced...] ---
  Kernel& p = out.partial;
  p.name = k.name + "_partial";
  p.sizes = k.sizes;
  p.sizes[dim] = chunk;
  p.sizes.insert(p.sizes.begin(), splits);
  p.num_reduce_dims = k.num_reduce_dims;
  p.buffers = k.buffers;
  auto widen = [&](const std::vector<int64_t>& st) {
    std::vector<int64_t> w = st;
    w.insert(w.begin(), st[dim] * chunk);
    return w;
  };
  std::vector<int32_t> pmap(k.instrs.size(), -1);
  std::vector<int32_t> reduces;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    if (level[v] != 0 && !is_reduce(in.op)) continue;  // computed per output: combine's
    Instr c = in;
    for (auto& a : c.args) a = pmap[static_cast<size_t>(a)];
    if (c.op == OpCode::Load) c.strides = widen(in.strides);
    pmap[v] = add(p, std::move(c));
    if (is_reduce(in.op)) reduces.push_back(static_cast<int32_t>(v));
  }
  for (const auto& s : k.stores) {
    if (!per_element(k, s, elem)) continue;
    Store c = s;
    c.value = pmap[static_cast<size_t>(s.value)];
    c.strides = widen(s.strides);
    p.stores.push_back(std::move(c));
  }
  // Scratch r holds [splits, outer...] partials of Reduce r.
  std::vector<int64_t> scratch_strides{outputs};
  scratch_strides.insert(scratch_strides.end(), outer_strides.begin(), outer_strides.end());
  for (size_t r = 0; r < reduces.size(); ++r) {
    const Instr& red = k.instrs[static_cast<size_t>(reduces[r])];
    Buffer b;
    b.name = "partial" + std::to_string(r);
    b.dtype = red.dtype;
    b.is_output = true;
    p.buffers.push_back(b);
    out.scratch.push_back(splits * outputs);
    Store s;
    s.value = pmap[static_cast<size_t>(reduces[r])];
    s.buffer = static_cast<int32_t>(p.buffers.size() - 1);
    s.strides = scratch_strides;
    s.strides.resize(p.sizes.size(), 0);  // zero on the reduced dims
    p.stores.push_back(std::move(s));
  }

  // --- combine: [outer..., splits], reducing splits ---
  Kernel& c = out.combine;
  c.name = k.name + "_combine";
  c.sizes = outer;
  c.sizes.push_back(splits);
  c.num_reduce_dims = 1;
  c.buffers = k.buffers;
  for (size_t r = 0; r < reduces.size(); ++r) {
    Buffer b = p.buffers[k.buffers.size() + r];
    b.is_output = false;
    c.buffers.push_back(b);
  }
  auto narrow = [&](const std::vector<int64_t>& st) {  // k's strides on the outer dims, 0 on splits
    std::vector<int64_t> w(st.begin(), st.begin() + static_cast<long>(no));
    w.push_back(0);
    return w;
  };
  std::vector<int32_t> cmap(k.instrs.size(), -1);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    if (elem[v]) continue;  // read only by the Reduces, which read the partials instead
    if (is_reduce(in.op)) {
      const size_t r = static_cast<size_t>(std::find(reduces.begin(), reduces.end(), static_cast<int32_t>(v)) - reduces.begin());
      Instr load;
      load.op = OpCode::Load;
      load.dtype = in.dtype;
      load.buffer = static_cast<int32_t>(k.buffers.size() + r);
      load.strides = outer_strides;
      load.strides.push_back(outputs);
      Instr red = in;
      red.args = {add(c, std::move(load))};
      cmap[v] = add(c, std::move(red));
      continue;
    }
    Instr n = in;
    for (auto& a : n.args) a = cmap[static_cast<size_t>(a)];
    if (n.op == OpCode::Load) n.strides = narrow(in.strides);
    cmap[v] = add(c, std::move(n));
  }
  for (const auto& s : k.stores) {
    if (per_element(k, s, elem)) continue;
    Store n = s;
    n.value = cmap[static_cast<size_t>(s.value)];
    n.strides = narrow(s.strides);
    c.stores.push_back(std::move(n));
  }
  verify(p);
  verify(c);
  return out;
}

}  // namespace tcap::kir
