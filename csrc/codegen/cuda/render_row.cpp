#include "codegen/cuda/emit.h"

#include <set>

#include <sstream>
#include <string>
#include <vector>

namespace tcap::codegen::cuda {

using kir::DType;
using kir::OpCode;

void Renderer::reduction(std::ostringstream& os) {
  const int rank = static_cast<int>(c_.sizes.size());
  const int no = c_.num_outer;
  const bool block = plan_.strategy == Strategy::BlockRow;
  const std::string O = num(nl_.outer);
  const std::string R = num(nl_.reduce);
  const size_t n = k_.instrs.size();

  const int passes = num_passes();
  // Split rows (single-pass BlockRow kernels): this block's part [rb, re) of row o.
  const int S = plan_.splits;
  const std::string rb = S > 1 ? "r_begin" : "0", re = S > 1 ? "r_end" : R;
  // A row's threads: the block, or one warp of it (rows_per_block > 1).
  const bool warp_rows = block && plan_.rows_per_block > 1;
  const std::string tid = warp_rows ? "tcap_lane" : "threadIdx.x", tstride = warp_rows ? "32" : "blockDim.x";

  if (block) {
    for (size_t id = 0; id < n && !warp_rows; ++id) {
      if (kir::is_reduce(k_.instrs[id].op)) {
        os << "  __shared__ " << acc_type(k_.instrs[id]) << " smem" << id << "[32];\n";
      }
    }
    if (S > 1) {
      emit_split_scratch(os);
      os << "  for (" << idx_ << " u = blockIdx.x; u < " << num(nl_.work_items) << "; u += gridDim.x) {\n";
      os << "    const " << idx_ << " o = u / " << num(nl_.splits) << ";\n";
      emit_split_range(os);
    } else if (warp_rows) {
      const std::string rpb = std::to_string(plan_.rows_per_block);
      os << "  const int tcap_lane = threadIdx.x & 31;\n";
      os << "  for (" << idx_ << " o = (" << idx_ << ")blockIdx.x * " << rpb << " + (threadIdx.x >> 5); o < " << O
         << "; o += (" << idx_ << ")gridDim.x * " << rpb << ") {\n";
    } else {
      os << "  for (" << idx_ << " o = blockIdx.x; o < " << O << "; o += gridDim.x) {\n";
    }
  } else {
    os << "  for (" << idx_ << " o = (" << idx_ << ")blockIdx.x * blockDim.x + threadIdx.x; o < " << O
       << "; o += (" << idx_ << ")gridDim.x * blockDim.x) {\n";
  }
  coords(os, "o", 0, no, "    ");
  // Outer base offsets of every access.
  for (size_t id = 0; id < n; ++id) {
    if (k_.instrs[id].op != OpCode::Load) continue;
    os << "    const " << idx_ << " ob" << id << " = " << offset_expr(c_.loads[id], 0, no, true) << ";\n";
  }
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    os << "    const " << idx_ << " os" << s << " = " << offset_expr(c_.stores[s], 0, no, true) << ";\n";
  }
  auto outer_load = [&](int32_t id) {
    return buf(k_.instrs[static_cast<size_t>(id)].buffer) + "[ob" + std::to_string(id) + "]";
  };
  auto elem_load = [&](int32_t id) {
    const std::string r = offset_expr(c_.loads[static_cast<size_t>(id)], no, rank, false);
    return buf(k_.instrs[static_cast<size_t>(id)].buffer) + "[ob" + std::to_string(id) + (r == "0" ? "" : " + " + r) + "]";
  };
  // Outer-level values by level; level L is available after pass L-1 (0: before pass 0).
  auto emit_outer = [&](int level) {
    std::vector<int32_t> ids;
    for (size_t id = 0; id < n; ++id) {
      if (!elem_[id] && !kir::is_reduce(k_.instrs[id].op) && level_[id] == level) ids.push_back(static_cast<int32_t>(id));
    }
    emit_values(os, ids, "    ", outer_load);
  };
  emit_outer(0);
  // Persistent rows: each element load's vectors of this thread, filled by the first pass
  // that reads the load and reused by the later ones (all on the vec_ok path).
  std::set<int32_t> cached;
  if (plan_.row_chunks > 0) {
    for (size_t id = 0; id < n; ++id) {
      if (k_.instrs[id].op != OpCode::Load || !elem_[id]) continue;
      os << "    " << vec_type(k_.instrs[id].buffer, plan_.vec) << " lc" << id << "[" << plan_.row_chunks << "];\n";
    }
  }
  for (int p = 0; p < passes; ++p) {
    std::vector<int32_t> reds, roots;
    for (size_t id = 0; id < n; ++id) {
      const kir::Instr& in = k_.instrs[id];
      if (kir::is_reduce(in.op) && level_[static_cast<size_t>(in.args[0])] == p) {
        reds.push_back(static_cast<int32_t>(id));
        roots.push_back(in.args[0]);
      }
    }
    std::vector<size_t> stores;
    for (size_t s = 0; s < k_.stores.size(); ++s) {
      const auto u = static_cast<size_t>(k_.stores[s].value);
      if (kir::per_element(k_, k_.stores[s], elem_) && level_[u] == p) {
        stores.push_back(s);
        roots.push_back(k_.stores[s].value);
      }
    }
    for (int32_t r : reds) {
      const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
      os << "    " << acc_type(in) << " acc" << r << " = " << reduce_identity(in) << ";\n";
    }
    const std::vector<int32_t> elems = needed(roots, /*element_only=*/true);
    // The scalar loop over the reduce points (also the vector path's fallback).
    auto scalar_loop = [&](const std::string& indent) {
      const std::string in2 = indent + "  ";
      if (block) {
        os << indent << "for (" << idx_ << " r = " << (S > 1 ? rb + " + " : "") << tid << "; r < " << re
           << "; r += " << tstride << ") {\n";
      } else {
        os << indent << "for (" << idx_ << " r = 0; r < " << R << "; ++r) {\n";
      }
      coords(os, "r", no, rank, in2);
      emit_values(os, elems, in2, elem_load);
      for (int32_t r : reds) {
        const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
        os << in2 << "acc" << r << " = " << reduce_functor(in) << "(acc" << r << ", " << v(in.args[0]) << ");\n";
      }
      for (size_t s : stores) {
        const kir::Store& st = k_.stores[s];
        const std::string off = offset_expr(c_.stores[s], no, rank, false);
        os << in2 << buf(st.buffer) << "[os" << s << (off == "0" ? "" : " + " + off)
           << "] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value)) << ";\n";
      }
      os << indent << "}\n";
    };
    if (plan_.vec == 1) {
      scalar_loop("    ");
    } else {
      // Row vector path: each thread takes `vec` consecutive reduce points per step, with
      // 16-byte loads and stores (the plan checked strides; the host checks alignment).
      const int V = plan_.vec;
      const int K = plan_.row_chunks;
      os << "    if (vec_ok) {\n";
      if (K > 0) {
        // Persistent: a fixed number of chunks per thread, so the cached vectors stay in
        // registers (the same points as the strided loop).
        os << "#pragma unroll\n";
        os << "      for (int c = 0; c < " << K << "; ++c) {\n";
        os << "        const " << idx_ << " g = " << tid << " + c * (" << idx_ << ")" << tstride << ";\n";
        os << "        if (g >= " << R << " / " << V << ") break;\n";
      } else {
        os << "      for (" << idx_ << " g = " << (S > 1 ? rb + " / " + std::to_string(V) + " + " : "") << tid << "; g < "
           << re << " / " << V << "; g += " << tstride << ") {\n";
      }
      os << "        const " << idx_ << " r0 = g * " << V << ";\n";
      for (int32_t id : elems) {
        const kir::Instr& in = k_.instrs[static_cast<size_t>(id)];
        if (in.op != OpCode::Load) continue;
        const std::string vt = vec_type(in.buffer, V);
        const std::string load = "*reinterpret_cast<const " + vt + "*>(" + buf(in.buffer) + " + ob" + std::to_string(id) + " + r0)";
        if (K == 0) {
          os << "        const " << vt << " l" << id << " = " << load << ";\n";
          continue;
        }
        if (cached.insert(id).second) os << "        lc" << id << "[c] = " << load << ";\n";  // first pass to read it
        os << "        const " << vt << "& l" << id << " = lc" << id << "[c];\n";
      }
      for (size_t s : stores) os << "        " << vec_type(k_.stores[s].buffer, V) << " o" << s << ";\n";
      os << "#pragma unroll\n";
      os << "        for (int j = 0; j < " << V << "; ++j) {\n";
      emit_values(os, elems, "          ", [&](int32_t id) { return "l" + std::to_string(id) + ".v[j]"; });
      for (int32_t r : reds) {
        const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
        os << "          acc" << r << " = " << reduce_functor(in) << "(acc" << r << ", " << v(in.args[0]) << ");\n";
      }
      for (size_t s : stores) {
        const kir::Store& st = k_.stores[s];
        os << "          o" << s << ".v[j] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value))
           << ";\n";
      }
      os << "        }\n";
      for (size_t s : stores) {
        const int32_t b = k_.stores[s].buffer;
        os << "        " << vector_store(b, V, buf(b) + " + os" + std::to_string(s) + " + r0", "o" + std::to_string(s));
      }
      os << "      }\n";
      os << "    } else {\n";
      scalar_loop("      ");
      os << "    }\n";
    }
    for (int32_t r : reds) {
      const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
      if (warp_rows) {
        os << "    acc" << r << " = tcap_warp_reduce(acc" << r << ", " << reduce_functor(in) << ");\n";
      } else if (block) {
        os << "    acc" << r << " = tcap_block_reduce(acc" << r << ", " << reduce_functor(in) << ", (" << acc_type(in) << ")"
           << reduce_identity(in) << ", smem" << r << ");\n";
      }
    }
    if (block && S > 1) {
      // Partial results to the workspace; the row's last block combines them in split order
      // and runs the rest (Note [Split column reductions]).
      os << "    if (threadIdx.x == 0) {\n";
      for (int32_t r : reds) os << "      ws" << r << "[split * " << O << " + o] = acc" << r << ";\n";
      os << "    }\n";
      emit_count_split(os, "o");
      os << "    if (tcap_last) {\n";
      os << "    __threadfence();\n";
      for (int32_t r : reds) emit_combine_partials(os, "    ", r, "acc" + std::to_string(r), "o");
    }
    for (int32_t r : reds) {
      const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
      os << "    const " << reg_type(in.dtype) << " " << v(r) << " = " << round_to(in.dtype, "acc" + std::to_string(r))
         << ";\n";
    }
    emit_outer(p + 1);
  }
  // Outer-level stores, once per row.
  std::ostringstream outer_stores;
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    const kir::Store& st = k_.stores[s];
    if (kir::per_element(k_, st, elem_)) continue;
    outer_stores << "      " << buf(st.buffer) << "[os" << s
                 << "] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value)) << ";\n";
  }
  if (!outer_stores.str().empty()) {
    os << (block ? "    if (" + tid + " == 0) {\n" : std::string("    {\n")) << outer_stores.str() << "    }\n";
  }
  if (block && S > 1) {
    os << "    }\n";  // tcap_last
    os << "    __syncthreads();  // tcap_last is reused by the next row\n";
  }
  os << "  }\n";
}

}  // namespace tcap::codegen::cuda
