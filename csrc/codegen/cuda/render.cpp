#include "codegen/cuda/render.h"

#include "codegen/cuda/emit.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace tcap::codegen::cuda {

using kir::DType;
using kir::OpCode;

Renderer::Renderer(const kir::Kernel& k, const RenderOptions& o)
    : k_(k), o_(o), c_(kir::coalesce(k)), elem_(kir::element_level(k)), level_(kir::reduce_level(k)) {
  KernelPlan p = plan_kernel(k_, c_, elem_, level_, o_);
  plan_ = p.launch;
  idx_ = plan_.index32 ? "int" : "long long";
  nl_ = number_layout(k_, c_);
  nums_ = launch_numbers(k_, c_, p, nl_);
}

void Renderer::read_at_launch(std::vector<bool> at, std::string structure) {
  TORCH_INTERNAL_ASSERT(at.empty() || at.size() == nums_.size(), "cuda renderer: a mask of ", at.size(),
                        " numbers for a kernel of ", nums_.size());
  at_ = std::move(at);
  structure_ = std::move(structure);
}

std::string Renderer::num(int32_t slot) const {
  if (reads(slot)) return "((" + idx_ + ")tcap_n.n[" + std::to_string(slot) + "])";
  return std::to_string(nums_[static_cast<size_t>(slot)]);
}

int32_t Renderer::access_slot(const kir::Access& a) const {
  if (!c_.loads.empty() && &a >= c_.loads.data() && &a < c_.loads.data() + c_.loads.size()) {
    return nl_.load[static_cast<size_t>(&a - c_.loads.data())];
  }
  TORCH_INTERNAL_ASSERT(!c_.stores.empty() && &a >= c_.stores.data() && &a < c_.stores.data() + c_.stores.size(),
                        "cuda renderer: an access that is neither a load nor a store of the kernel");
  return nl_.store[static_cast<size_t>(&a - c_.stores.data())];
}

void Renderer::emit_split_scratch(std::ostringstream& os) const {
  os << "  __shared__ int tcap_last;\n";
  os << "  unsigned int* tcap_sem = reinterpret_cast<unsigned int*>(tcap_scratch);\n";
  for (size_t id = 0; id < k_.instrs.size(); ++id) {
    if (!kir::is_reduce(k_.instrs[id].op)) continue;
    const std::string T = acc_type(k_.instrs[id]);
    os << "  " << T << "* ws" << id << " = reinterpret_cast<" << T << "*>(tcap_scratch + " << num(nl_.workspace[id])
       << ");\n";
  }
}

void Renderer::emit_split_range(std::ostringstream& os) const {
  const std::string len = num(nl_.split_len), R = num(nl_.reduce);
  os << "    const " << idx_ << " split = u % " << num(nl_.splits) << ";\n";
  os << "    const " << idx_ << " r_begin = split * " << len << ";\n";
  os << "    const " << idx_ << " r_end = r_begin + " << len << " < " << R << " ? r_begin + " << len << " : " << R << ";\n";
}

void Renderer::emit_count_split(std::ostringstream& os, const std::string& sem) const {
  os << "    __threadfence();\n";
  os << "    __syncthreads();\n";
  const std::string last = reads(nl_.splits) ? "(unsigned int)(" + num(nl_.splits) + " - 1)" : std::to_string(plan_.splits - 1) + "u";
  os << "    if (threadIdx.x == 0) tcap_last = atomicAdd(tcap_sem + " << sem << ", 1u) == " << last << ";\n";
  os << "    __syncthreads();\n";
}

void Renderer::emit_combine_partials(std::ostringstream& os, const std::string& indent, int32_t r,
                                     const std::string& acc, const std::string& col) const {
  const kir::Instr& in = k_.instrs[static_cast<size_t>(r)];
  const std::string T = acc_type(in);
  const std::string vol = "reinterpret_cast<volatile " + T + "*>(ws" + std::to_string(r) + ")";
  os << indent << acc << " = " << vol << "[" << col << "];\n";
  os << indent << "for (int s = 1; s < " << num(nl_.splits) << "; ++s) {\n";
  os << indent << "  const " << T << " part = " << vol << "[s * " << num(nl_.outer) << " + " << col << "];\n";
  os << indent << "  " << acc << " = " << reduce_functor(in) << "(" << acc << ", part);\n";
  os << indent << "}\n";
}

void Renderer::params(std::ostringstream& os) const {
  std::vector<bool> read(k_.buffers.size(), false);
  for (const kir::Instr& in : k_.instrs) {
    if (in.op == OpCode::Load) read[static_cast<size_t>(in.buffer)] = true;
  }
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    const kir::Buffer& B = k_.buffers[b];
    os << (b ? ", " : "");
    if (B.param) {  // by value; the body reads it as a one-element array (run())
      os << "const " << mem_type(B.dtype) << " " << buf(static_cast<int32_t>(b)) << "_param";
      continue;
    }
    // An output that is also read would break const __restrict__; none is, but stay safe.
    if (!B.is_output) {
      os << "const " << mem_type(B.dtype) << "* __restrict__ ";
    } else if (read[b]) {
      os << mem_type(B.dtype) << "* ";
    } else {
      os << mem_type(B.dtype) << "* __restrict__ ";
    }
    os << buf(static_cast<int32_t>(b));
  }
  if (plan_.scratch_bytes > 0) os << (k_.buffers.empty() ? "" : ", ") << "unsigned char* __restrict__ tcap_scratch";
  if (!at_.empty()) os << (k_.buffers.empty() && plan_.scratch_bytes == 0 ? "" : ", ") << "const tcap_numbers tcap_n";
  os << (k_.buffers.empty() && plan_.scratch_bytes == 0 && at_.empty() ? "" : ", ") << "int vec_ok";
}

std::vector<int32_t> Renderer::needed(const std::vector<int32_t>& roots, bool element_only) const {
  std::vector<bool> want(k_.instrs.size(), false);
  std::vector<int32_t> stack(roots);
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    const auto u = static_cast<size_t>(id);
    if (want[u] || (element_only && !elem_[u])) continue;
    want[u] = true;
    for (int32_t a : k_.instrs[u].args) stack.push_back(a);
  }
  std::vector<int32_t> out;
  for (size_t id = 0; id < want.size(); ++id) {
    if (want[id]) out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

std::string Renderer::offset_expr(const kir::Access& a, int lo, int hi, bool with_offset) const {
  const int32_t slot = access_slot(a);
  std::string e = with_offset ? num(slot) : "";
  for (int d = lo; d < hi; ++d) {
    const int64_t s = a.strides[static_cast<size_t>(d)];
    if (s == 0 || c_.sizes[static_cast<size_t>(d)] == 1) continue;
    std::string term = "c" + std::to_string(d);
    const int32_t stride = slot + 1 + d;
    if (s != 1) term += " * " + (reads(stride) ? num(stride) : "(" + idx_ + ")" + std::to_string(s));
    e += e.empty() ? term : " + " + term;
  }
  return e.empty() ? "0" : e;
}

// Coordinates c<lo> .. c<hi-1> of a row-major linear index over coalesced dims [lo, hi).
void Renderer::coords(std::ostringstream& os, const std::string& linear, int lo, int hi,
                      const std::string& indent) const {
  if (hi - lo == 1) {
    os << indent << "const " << idx_ << " c" << lo << " = " << linear << ";\n";
    return;
  }
  os << indent << idx_ << " rem" << lo << " = " << linear << ";\n";
  for (int d = hi - 1; d > lo; --d) {
    const std::string s = num(d);
    os << indent << "const " << idx_ << " c" << d << " = rem" << lo << " % " << s << ";\n";
    os << indent << "rem" << lo << " /= " << s << ";\n";
  }
  os << indent << "const " << idx_ << " c" << lo << " = rem" << lo << ";\n";
}

void Renderer::pointwise(std::ostringstream& os) {
  const int rank = static_cast<int>(c_.sizes.size());
  std::vector<int32_t> roots;
  for (const kir::Store& s : k_.stores) roots.push_back(s.value);
  const std::vector<int32_t> ids = needed(roots, /*element_only=*/false);
  const std::string N = reads(nl_.elements) ? num(nl_.elements) : std::to_string(plan_.elements) + (plan_.index32 ? "" : "LL");
  const std::string tid = "(" + idx_ + ")blockIdx.x * blockDim.x + threadIdx.x";
  const std::string stride = "(" + idx_ + ")gridDim.x * blockDim.x";

  auto scalar_loop = [&](const std::string& start, const std::string& indent) {
    os << indent << "for (" << idx_ << " i = " << start << "; i < " << N << "; i += " << stride << ") {\n";
    const std::string in2 = indent + "  ";
    coords(os, "i", 0, rank, in2);
    emit_values(os, ids, in2, [&](int32_t id) {
      const kir::Instr& in = k_.instrs[static_cast<size_t>(id)];
      return buf(in.buffer) + "[" + offset_expr(c_.loads[static_cast<size_t>(id)], 0, rank, true) + "]";
    });
    for (size_t s = 0; s < k_.stores.size(); ++s) {
      const kir::Store& st = k_.stores[s];
      const DType t = k_.buffers[static_cast<size_t>(st.buffer)].dtype;
      os << in2 << buf(st.buffer) << "[" << offset_expr(c_.stores[s], 0, rank, true)
         << "] = " << to_memory(t, v(st.value)) << ";\n";
    }
    os << indent << "}\n";
  };

  if (plan_.vec == 1) {
    scalar_loop(tid, "  ");
    return;
  }
  const int V = plan_.vec;
  os << "  if (vec_ok) {\n";
  os << "    for (" << idx_ << " g = " << tid << "; g < " << N << " / " << V << "; g += " << stride << ") {\n";
  os << "      const " << idx_ << " base = g * " << V << ";\n";
  coords(os, "base", 0, rank, "      ");
  // Vector loads (stride 1) and broadcast scalars (stride 0) at the vector's first element.
  for (int32_t id : ids) {
    const kir::Instr& in = k_.instrs[static_cast<size_t>(id)];
    if (in.op != OpCode::Load) continue;
    const kir::Access& a = c_.loads[static_cast<size_t>(id)];
    const char* mt = mem_type(k_.buffers[static_cast<size_t>(in.buffer)].dtype);
    const std::string at = buf(in.buffer) + " + " + offset_expr(a, 0, rank, true);
    if (a.strides.back() == 1) {
      const std::string vt = vec_type(in.buffer, V);
      os << "      const " << vt << " l" << id << " = *reinterpret_cast<const " << vt << "*>(" << at << ");\n";
    } else {
      os << "      const " << mt << " l" << id << " = *(" << at << ");\n";
    }
  }
  for (size_t s = 0; s < k_.stores.size(); ++s) os << "      " << vec_type(k_.stores[s].buffer, V) << " o" << s << ";\n";
  os << "#pragma unroll\n";
  os << "      for (int j = 0; j < " << V << "; ++j) {\n";
  emit_values(os, ids, "        ", [&](int32_t id) {
    const kir::Access& a = c_.loads[static_cast<size_t>(id)];
    return "l" + std::to_string(id) + (a.strides.back() == 1 ? ".v[j]" : "");
  });
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    const kir::Store& st = k_.stores[s];
    os << "        o" << s << ".v[j] = " << to_memory(k_.buffers[static_cast<size_t>(st.buffer)].dtype, v(st.value))
       << ";\n";
  }
  os << "      }\n";
  for (size_t s = 0; s < k_.stores.size(); ++s) {
    const int32_t b = k_.stores[s].buffer;
    os << "      " << vector_store(b, V, buf(b) + " + " + offset_expr(c_.stores[s], 0, rank, true), "o" + std::to_string(s));
  }
  os << "    }\n";
  if (reads(nl_.elements) || plan_.elements % V != 0) {  // the tail (one coalesced dim only)
    scalar_loop("(" + N + " / " + std::to_string(V) + ") * " + std::to_string(V) + " + " + tid, "    ");
  }
  os << "  } else {\n";
  scalar_loop(tid, "    ");
  os << "  }\n";
}

CudaSource Renderer::run() {
  CudaSource out;
  out.plan = plan_;
  std::ostringstream os;
  if (at_.empty()) {
    out.entry = "tcap_" + kir::hash_hex(kir::structural_hash(k_));
    os << kPrelude << "\n// " << to_string(plan_) << "\n";
    // The kernel IR as a comment: what the source was rendered from.
    std::istringstream ir(kir::to_string(k_));
    for (std::string line; std::getline(ir, line);) {
      os << "// " << line << "\n";
    }
  } else {
    // Code that serves every kernel of a structure (Note [CUDA sizes at launch]): the
    // structure and the numbers read at launch, not one kernel's IR, name it.
    std::string text = structure_ + "at launch:";
    for (size_t i = 0; i < at_.size(); ++i) {
      if (at_[i]) text += " " + std::to_string(i);
    }
    out.entry = "tcap_" + kir::hash_hex(kir::fnv1a(text));
    os << kPrelude << "\n";
    std::istringstream ir(text);
    for (std::string line; std::getline(ir, line);) {
      os << "// " << line << "\n";
    }
    os << "struct tcap_numbers { long long n[" << at_.size() << "]; };\n";
  }
  os << "extern \"C\" __global__ void __launch_bounds__(" << plan_.block << ") " << out.entry << "(";
  params(os);
  os << ") {\n";
  // Note [Kernel parameters]: every Load of a parameter is at element 0 of it.
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    if (!k_.buffers[b].param) continue;
    const std::string name = buf(static_cast<int32_t>(b));
    os << "  const " << mem_type(k_.buffers[b].dtype) << " " << name << "[1] = {" << name << "_param};\n";
  }
  if (plan_.strategy == Strategy::Pointwise) {
    pointwise(os);
  } else if (plan_.strategy == Strategy::Column) {
    column(os);
  } else {
    reduction(os);
  }
  os << "}\n";
  out.source = os.str();
  return out;
}

namespace {

// Neither the kernel's name nor its buffers' names (graph values) change the code: kernels
// that differ only there (the same layer norm in every layer) share a binary.
kir::Kernel anonymous(const kir::Kernel& k) {
  kir::Kernel a = k;
  a.name.clear();
  for (kir::Buffer& b : a.buffers) b.name.clear();
  return a;
}

}  // namespace

CudaSource render(const kir::Kernel& k, const RenderOptions& o) {
  kir::check_renderable(k, "cuda", "CUDA");
  return Renderer(anonymous(k), o).run();
}

LaunchSource render_for_launch(const kir::Kernel& k, LaunchShapes& shapes, const RenderOptions& o) {
  kir::check_renderable(k, "cuda", "CUDA");
  const kir::Kernel a = anonymous(k);  // outlives r, which keeps a reference
  Renderer r(a, o);
  LaunchSource out;
  out.numbers = r.numbers();
  std::string structure = r.structure();
  std::vector<bool> at = shapes.at_launch(structure, out.numbers);
  out.reads_numbers = !at.empty();
  r.read_at_launch(std::move(at), std::move(structure));
  out.src = r.run();
  return out;
}

}  // namespace tcap::codegen::cuda
