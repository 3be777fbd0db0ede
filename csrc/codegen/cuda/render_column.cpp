#include "codegen/cuda/emit.h"

#include <sstream>
#include <string>
#include <vector>

namespace tcap::codegen::cuda {

using kir::DType;
using kir::OpCode;

void Renderer::column(std::ostringstream& os) {
  const int rank = static_cast<int>(c_.sizes.size());
  const int no = c_.num_outer;
  const size_t olast = static_cast<size_t>(no - 1);
  const size_t n = k_.instrs.size();
  const int V = plan_.vec, L = plan_.lanes, Y = plan_.block / plan_.lanes, S = plan_.splits;
  const std::string I = idx_, O = num(nl_.outer);
  const std::string js = std::to_string(V);

  std::vector<int32_t> reds, roots;
  for (size_t id = 0; id < n; ++id) {
    if (kir::is_reduce(k_.instrs[id].op)) {
      reds.push_back(static_cast<int32_t>(id));
      roots.push_back(k_.instrs[id].args[0]);
    }
  }
  std::vector<size_t> elem_stores, outer_stores;
  std::vector<int32_t> outer_roots;
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    if (kir::per_element(k_, k_.stores[s], elem_)) {
      elem_stores.push_back(s);
      roots.push_back(k_.stores[s].value);
    } else {
      outer_stores.push_back(s);
      outer_roots.push_back(k_.stores[s].value);
    }
  }
  // Pass 0: the element values and the outer values they read (one per column), in
  // topological (id) order. Epilogue: the outer values before and after the Reduces.
  const std::vector<int32_t> pass = needed(roots, /*element_only=*/false);
  std::vector<int32_t> epi_before, epi_after;
  for (int32_t id : needed(outer_roots, /*element_only=*/false)) {
    const auto u = static_cast<size_t>(id);
    if (elem_[u] || kir::is_reduce(k_.instrs[u].op)) continue;
    (level_[u] == 0 ? epi_before : epi_after).push_back(id);
  }
  auto load_at = [&](int32_t id, const std::string& base) {
    const std::string r = offset_expr(c_.loads[static_cast<size_t>(id)], no, rank, false);
    return buf(k_.instrs[static_cast<size_t>(id)].buffer) + "[" + base + (r == "0" ? "" : " + " + r) + "]";
  };
  auto combine = [&](int32_t r, const std::string& into, const std::string& x) {
    return into + " = " + reduce_functor(k_.instrs[static_cast<size_t>(r)]) + "(" + into + ", " + x + ");";
  };

  for (int32_t r : reds) {
    os << "  __shared__ " << acc_type(k_.instrs[static_cast<size_t>(r)]) << " sm" << r << "[" << plan_.block * V
       << "];\n";
  }
  if (S > 1) emit_split_scratch(os);
  os << "  const int tx = threadIdx.x % " << L << ";\n";
  os << "  const int ty = threadIdx.x / " << L << ";\n";
  os << "  for (" << I << " u = blockIdx.x; u < " << num(nl_.work_items) << "; u += gridDim.x) {\n";
  os << "    const " << I << " tile = u / " << num(nl_.splits) << ";\n";
  emit_split_range(os);
  os << "    const " << I << " o0 = (tile * " << L << " + tx) * " << V << ";\n";
  // Outer offsets of every access for each of the thread's columns (clamped: a column past
  // the end is never read or written).
  for (size_t id = 0; id < n; ++id) {
    if (k_.instrs[id].op == OpCode::Load) os << "    " << I << " ob" << id << "[" << V << "];\n";
  }
  for (size_t s : elem_stores) os << "    " << I << " os" << s << "[" << V << "];\n";
  os << "#pragma unroll\n";
  os << "    for (int j = 0; j < " << V << "; ++j) {\n";
  os << "      const " << I << " o = o0 + j < " << O << " ? o0 + j : " << O << " - 1;\n";
  coords(os, "o", 0, no, "      ");
  for (size_t id = 0; id < n; ++id) {
    if (k_.instrs[id].op == OpCode::Load) os << "      ob" << id << "[j] = " << offset_expr(c_.loads[id], 0, no, true) << ";\n";
  }
  for (size_t s : elem_stores) os << "      os" << s << "[j] = " << offset_expr(c_.stores[s], 0, no, true) << ";\n";
  os << "    }\n";
  for (int32_t r : reds) {
    const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
    os << "    " << acc_type(in) << " acc" << r << "[" << V << "];\n";
    os << "#pragma unroll\n";
    os << "    for (int j = 0; j < " << V << "; ++j) acc" << r << "[j] = " << reduce_identity(in) << ";\n";
  }
  // The thread's rows of the split, for each of its columns.
  auto accumulate = [&](const std::string& indent) {
    for (int32_t r : reds) {
      os << indent << combine(r, "acc" + std::to_string(r) + "[j]", v(k_.instrs[static_cast<size_t>(r)].args[0])) << "\n";
    }
  };
  const std::string row_loop = "for (" + I + " r = r_begin + ty; r < r_end; r += " + std::to_string(Y) + ") {\n";
  os << "    if (o0 < " << O << ") {\n";
  if (V > 1) {
    os << "      if (vec_ok) {\n";
    os << "        " << row_loop;
    coords(os, "r", no, rank, "          ");
    for (int32_t id : pass) {
      const kir::Instr& in = k_.instrs[static_cast<size_t>(id)];
      if (in.op != OpCode::Load || !elem_[static_cast<size_t>(id)]) continue;
      const std::string at = load_at(id, "ob" + std::to_string(id) + "[0]");
      if (c_.loads[static_cast<size_t>(id)].strides[olast] == 1) {
        const std::string vt = vec_type(in.buffer, V);
        os << "          const " << vt << " l" << id << " = *reinterpret_cast<const " << vt << "*>(&" << at << ");\n";
      } else {  // the same element for every column of the vector
        os << "          const " << mem_type(k_.buffers[static_cast<size_t>(in.buffer)].dtype) << " l" << id << " = " << at
           << ";\n";
      }
    }
    for (size_t s : elem_stores) os << "          " << vec_type(k_.stores[s].buffer, V) << " st" << s << ";\n";
    os << "#pragma unroll\n";
    os << "          for (int j = 0; j < " << V << "; ++j) {\n";
    emit_values(os, pass, "            ", [&](int32_t id) {
      const auto u = static_cast<size_t>(id);
      if (!elem_[u]) return load_at(id, "ob" + std::to_string(id) + "[j]");
      return "l" + std::to_string(id) + (c_.loads[u].strides[olast] == 1 ? ".v[j]" : "");
    });
    accumulate("            ");
    for (size_t s : elem_stores) {
      const kir::Store& st = k_.stores[s];
      os << "            st" << s << ".v[j] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value))
         << ";\n";
    }
    os << "          }\n";
    for (size_t s : elem_stores) {
      const int32_t b = k_.stores[s].buffer;
      const std::string off = offset_expr(c_.stores[s], no, rank, false);
      os << "          "
         << vector_store(b, V, "&" + buf(b) + "[os" + std::to_string(s) + "[0]" + (off == "0" ? "" : " + " + off) + "]",
                         "st" + std::to_string(s));
    }
    os << "        }\n";
    os << "      } else {\n";
  }
  // Scalar path (also the vector path's fallback): one column at a time.
  const std::string ind = V > 1 ? "        " : "      ";
  os << ind << row_loop;
  coords(os, "r", no, rank, ind + "  ");
  os << "#pragma unroll\n";
  os << ind << "  for (int j = 0; j < " << V << "; ++j) {\n";
  os << ind << "    if (o0 + j < " << O << ") {\n";
  emit_values(os, pass, ind + "      ", [&](int32_t id) { return load_at(id, "ob" + std::to_string(id) + "[j]"); });
  accumulate(ind + "      ");
  for (size_t s : elem_stores) {
    const kir::Store& st = k_.stores[s];
    const std::string off = offset_expr(c_.stores[s], no, rank, false);
    os << ind << "      " << buf(st.buffer) << "[os" << s << "[j]" << (off == "0" ? "" : " + " + off)
       << "] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value)) << ";\n";
  }
  os << ind << "    }\n";
  os << ind << "  }\n";
  os << ind << "}\n";
  if (V > 1) os << "      }\n";
  os << "    }\n";
  // The block's row-threads, combined in order by the first row of threads.
  os << "#pragma unroll\n";
  os << "    for (int j = 0; j < " << V << "; ++j) {\n";
  for (int32_t r : reds) os << "      sm" << r << "[threadIdx.x * " << V << " + j] = acc" << r << "[j];\n";
  os << "    }\n";
  os << "    __syncthreads();\n";
  os << "    if (ty == 0) {\n";
  os << "#pragma unroll\n";
  os << "      for (int j = 0; j < " << V << "; ++j) {\n";
  os << "        for (int y = 1; y < " << Y << "; ++y) {\n";
  for (int32_t r : reds) {
    os << "          " << combine(r, "acc" + std::to_string(r) + "[j]", "sm" + std::to_string(r) + "[(y * " + std::to_string(L) + " + tx) * " + js + " + j]") << "\n";
  }
  os << "        }\n";
  os << "      }\n";
  os << "    }\n";
  // The epilogue of each of the thread's columns: outer values, the Reduces' results, stores.
  auto epilogue = [&](const std::string& indent) {
    os << "#pragma unroll\n";
    os << indent << "for (int j = 0; j < " << V << "; ++j) {\n";
    os << indent << "  if (o0 + j < " << O << ") {\n";
    const std::string in2 = indent + "    ";
    os << in2 << "const " << I << " o = o0 + j;\n";
    coords(os, "o", 0, no, in2);
    auto outer_load = [&](int32_t id) {
      return buf(k_.instrs[static_cast<size_t>(id)].buffer) + "[" + offset_expr(c_.loads[static_cast<size_t>(id)], 0, no, true) + "]";
    };
    emit_values(os, epi_before, in2, outer_load);
    for (int32_t r : reds) {
      const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
      os << in2 << "const " << reg_type(in.dtype) << " " << v(r) << " = " << round_to(in.dtype, "acc" + std::to_string(r) + "[j]")
         << ";\n";
    }
    emit_values(os, epi_after, in2, outer_load);
    for (size_t s : outer_stores) {
      const kir::Store& st = k_.stores[s];
      os << in2 << buf(st.buffer) << "[" << offset_expr(c_.stores[s], 0, no, true)
         << "] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value)) << ";\n";
    }
    os << indent << "  }\n";
    os << indent << "}\n";
  };
  if (S == 1) {
    os << "    if (ty == 0) {\n";
    epilogue("      ");
    os << "    }\n";
  } else {
    // Partial results to the workspace; the tile's last block combines them in split order.
    os << "    if (ty == 0) {\n";
    os << "#pragma unroll\n";
    os << "      for (int j = 0; j < " << V << "; ++j) {\n";
    os << "        if (o0 + j < " << O << ") {\n";
    for (int32_t r : reds) os << "          ws" << r << "[split * " << O << " + o0 + j] = acc" << r << "[j];\n";
    os << "        }\n";
    os << "      }\n";
    os << "    }\n";
    emit_count_split(os, "tile");
    os << "    if (tcap_last && ty == 0) {\n";
    os << "      __threadfence();\n";
    os << "#pragma unroll\n";
    os << "      for (int j = 0; j < " << V << "; ++j) {\n";
    os << "        if (o0 + j < " << O << ") {\n";
    for (int32_t r : reds) emit_combine_partials(os, "          ", r, "acc" + std::to_string(r) + "[j]", "o0 + j");
    os << "        }\n";
    os << "      }\n";
    epilogue("      ");
    os << "    }\n";
  }
  os << "    __syncthreads();  // shared memory is reused by the next tile\n";
  os << "  }\n";
}

}  // namespace tcap::codegen::cuda
