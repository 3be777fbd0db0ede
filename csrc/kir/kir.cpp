#include "kir/kir.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace tcap::kir {

namespace {

int64_t product(const std::vector<int64_t>& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t d = begin; d < end; ++d) n *= s[d];
  return n;
}

void print_index(std::ostream& os, const std::vector<int64_t>& strides, int64_t offset) {
  os << "[";
  for (size_t d = 0; d < strides.size(); ++d) os << (d ? ", " : "") << strides[d];
  os << "]+" << offset;
}

std::string body(const Kernel& k) {
  std::ostringstream os;
  os << " sizes=[";
  for (size_t d = 0; d < k.sizes.size(); ++d) os << (d ? ", " : "") << k.sizes[d];
  os << "] reduce=" << k.num_reduce_dims << "\n";
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    os << "  buf" << b << (k.buffers[b].is_output ? " out " : k.buffers[b].param ? " param " : " in ")
       << to_string(k.buffers[b].dtype) << " "
       << k.buffers[b].name << "\n";
  }
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    os << "  %" << v << " = " << to_string(in.op) << "." << to_string(in.dtype);
    if (in.op == OpCode::Load) {
      os << " buf" << in.buffer << " ";
      print_index(os, in.strides, in.offset);
    } else if (in.op == OpCode::Const) {
      if (is_floating(in.dtype)) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", in.f);
        os << " " << buf;
      } else {
        os << " " << in.i;
      }
    }
    for (size_t a = 0; a < in.args.size(); ++a) os << (a ? ", %" : " %") << in.args[a];
    os << "\n";
  }
  for (const Store& s : k.stores) {
    os << "  store buf" << s.buffer << " ";
    print_index(os, s.strides, s.offset);
    os << " <- %" << s.value << "\n";
  }
  return os.str();
}

[[noreturn]] void fail(const Kernel& k, const std::string& what) {
  TORCH_CHECK(false, "tcap kernel IR: ", what, "\n", to_string(k));
}

// One dim of a coalesced group: its size and the stride of every access along it.
struct Dim {
  int64_t size = 1;
  std::vector<int64_t> strides;
};

// Coalesces dims [lo, hi) of `sizes` for the given accesses (each a full stride vector
// over the kernel's domain). Size-1 dims are dropped; an inner dim merges into the dim
// outside it when, for every access, outer_stride == inner_stride * inner_size, which
// keeps the row-major order of the points. A group with a size-0 dim becomes one size-0
// dim; an empty group becomes one size-1 dim with zero strides.
std::vector<Dim> coalesce_dims(const std::vector<int64_t>& sizes, size_t lo, size_t hi,
                               const std::vector<const std::vector<int64_t>*>& accesses) {
  const size_t n = accesses.size();
  std::vector<Dim> out;
  for (size_t d = lo; d < hi; ++d) {
    if (sizes[d] == 0) return {Dim{0, std::vector<int64_t>(n, 0)}};
    if (sizes[d] == 1) continue;
    Dim cur{sizes[d], {}};
    for (const auto* s : accesses) cur.strides.push_back((*s)[d]);
    if (!out.empty()) {
      Dim& prev = out.back();
      bool mergeable = true;
      for (size_t a = 0; a < n && mergeable; ++a) mergeable = prev.strides[a] == cur.strides[a] * cur.size;
      if (mergeable) {
        prev.size *= cur.size;
        prev.strides = cur.strides;
        continue;
      }
    }
    out.push_back(std::move(cur));
  }
  if (out.empty()) out.push_back(Dim{1, std::vector<int64_t>(n, 0)});
  return out;
}

}  // namespace

int64_t Kernel::numel() const { return product(sizes, 0, sizes.size()); }
int64_t Kernel::outer_numel() const {
  return product(sizes, 0, sizes.size() - static_cast<size_t>(num_reduce_dims));
}
int64_t Kernel::reduce_numel() const {
  return product(sizes, sizes.size() - static_cast<size_t>(num_reduce_dims), sizes.size());
}
int64_t Kernel::parallel_range() const { return num_reduce_dims == 0 ? numel() : outer_numel(); }

int32_t add(Kernel& k, Instr in) {
  k.instrs.push_back(std::move(in));
  return static_cast<int32_t>(k.instrs.size() - 1);
}

std::string to_string(const Kernel& k) { return "kernel " + k.name + body(k); }

namespace {

void stride_classes(std::ostringstream& os, const Access& a) {
  os << " [";
  for (int64_t s : a.strides) os << (s == 0 ? '0' : s == 1 ? '1' : 'x');
  os << "]";
}

}  // namespace

std::string structure_text(const Kernel& k, const std::vector<Access>& loads, const std::vector<Access>& stores,
                           const std::vector<bool>& elem) {
  std::ostringstream os;
  for (const Buffer& b : k.buffers) os << (b.param ? "param " : b.is_output ? "out " : "in ") << to_string(b.dtype) << "\n";
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    os << to_string(in.op) << "." << to_string(in.dtype) << (elem[v] ? " e" : " o");
    for (int32_t a : in.args) os << " %" << a;
    if (in.op == OpCode::Load) {
      os << " buf" << in.buffer;
      stride_classes(os, loads[v]);
    }
    os << "\n";
  }
  for (size_t i = 0; i < k.stores.size(); ++i) {
    os << "store buf" << k.stores[i].buffer << " <- %" << k.stores[i].value;
    stride_classes(os, stores[i]);
    os << "\n";
  }
  return os.str();
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t structural_hash(const Kernel& k) { return fnv1a(body(k)); }

std::string hash_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

const char* to_string(OpCode op) {
  switch (op) {
    case OpCode::Load: return "load";
    case OpCode::Const: return "const";
    case OpCode::Cast: return "cast";
    case OpCode::Neg: return "neg";
    case OpCode::Abs: return "abs";
    case OpCode::Exp: return "exp";
    case OpCode::Log: return "log";
    case OpCode::Log1p: return "log1p";
    case OpCode::Expm1: return "expm1";
    case OpCode::Sin: return "sin";
    case OpCode::Cos: return "cos";
    case OpCode::Tan: return "tan";
    case OpCode::Tanh: return "tanh";
    case OpCode::Erf: return "erf";
    case OpCode::Sqrt: return "sqrt";
    case OpCode::Rsqrt: return "rsqrt";
    case OpCode::Recip: return "recip";
    case OpCode::Floor: return "floor";
    case OpCode::Ceil: return "ceil";
    case OpCode::Round: return "round";
    case OpCode::Trunc: return "trunc";
    case OpCode::IsNan: return "isnan";
    case OpCode::Not: return "not";
    case OpCode::Add: return "add";
    case OpCode::Sub: return "sub";
    case OpCode::Mul: return "mul";
    case OpCode::Div: return "div";
    case OpCode::Pow: return "pow";
    case OpCode::Max: return "max";
    case OpCode::Min: return "min";
    case OpCode::Lt: return "lt";
    case OpCode::Le: return "le";
    case OpCode::Gt: return "gt";
    case OpCode::Ge: return "ge";
    case OpCode::Eq: return "eq";
    case OpCode::Ne: return "ne";
    case OpCode::And: return "and";
    case OpCode::Or: return "or";
    case OpCode::Where: return "where";
    case OpCode::Fma: return "fma";
    case OpCode::ReduceSum: return "reduce_sum";
    case OpCode::ReduceMax: return "reduce_max";
    case OpCode::ReduceMin: return "reduce_min";
  }
  return "?";
}

const char* to_string(DType t) {
  switch (t) {
    case DType::Bool: return "b8";
    case DType::U8: return "u8";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
  }
  return "?";
}

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::U8:
    case DType::I8: return 1;
    case DType::I16:
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I32:
    case DType::F32: return 4;
    case DType::I64:
    case DType::F64: return 8;
  }
  return 0;
}

bool is_floating(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64;
}

bool is_reduce(OpCode op) {
  return op == OpCode::ReduceSum || op == OpCode::ReduceMax || op == OpCode::ReduceMin;
}

bool is_comparison(OpCode op) {
  return op == OpCode::Lt || op == OpCode::Le || op == OpCode::Gt || op == OpCode::Ge || op == OpCode::Eq ||
         op == OpCode::Ne;
}

Coalesced coalesce(const Kernel& k) {
  const size_t rank = k.sizes.size();
  const size_t nr = static_cast<size_t>(k.num_reduce_dims);
  std::vector<const std::vector<int64_t>*> accesses;
  std::vector<size_t> load_ids;
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    if (k.instrs[v].op == OpCode::Load) {
      accesses.push_back(&k.instrs[v].strides);
      load_ids.push_back(v);
    }
  }
  for (const Store& s : k.stores) accesses.push_back(&s.strides);
  std::vector<Dim> dims = coalesce_dims(k.sizes, 0, rank - nr, accesses);
  Coalesced c;
  c.num_outer = static_cast<int>(dims.size());
  if (nr > 0) {
    std::vector<Dim> red = coalesce_dims(k.sizes, rank - nr, rank, accesses);
    dims.insert(dims.end(), red.begin(), red.end());
  }
  for (const Dim& d : dims) c.sizes.push_back(d.size);
  auto access = [&](size_t a, int64_t offset) {
    Access acc{offset, {}};
    for (const Dim& d : dims) acc.strides.push_back(d.strides[a]);
    return acc;
  };
  c.loads.resize(k.instrs.size());
  for (size_t a = 0; a < load_ids.size(); ++a) c.loads[load_ids[a]] = access(a, k.instrs[load_ids[a]].offset);
  for (size_t s = 0; s < k.stores.size(); ++s) c.stores.push_back(access(load_ids.size() + s, k.stores[s].offset));
  return c;
}

std::vector<bool> element_level(const Kernel& k) {
  const size_t rank = k.sizes.size();
  const size_t first_reduce = rank - static_cast<size_t>(k.num_reduce_dims);
  std::vector<bool> elem(k.instrs.size(), false);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    if (in.op == OpCode::Load) {
      // With a single reduce point (reduce dims of size 1) every load is one per point.
      if (k.num_reduce_dims == 0 || k.reduce_numel() == 1) {
        elem[v] = true;
      } else {
        for (size_t d = first_reduce; d < rank && d < in.strides.size(); ++d) elem[v] = elem[v] || in.strides[d] != 0;
      }
    } else if (is_reduce(in.op)) {
      elem[v] = false;
    } else {
      for (int32_t a : in.args) elem[v] = elem[v] || elem[static_cast<size_t>(a)];
    }
  }
  return elem;
}

std::vector<int> reduce_level(const Kernel& k) {
  std::vector<int> level(k.instrs.size(), 0);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    int l = 0;
    for (int32_t a : in.args) l = std::max(l, level[static_cast<size_t>(a)]);
    level[v] = is_reduce(in.op) ? l + 1 : l;
  }
  return level;
}

void check_renderable(const Kernel& k, const char* backend, const char* renderer) {
  verify(k);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    const char* why = nullptr;
    if (in.dtype == DType::Bool && (in.op == OpCode::Neg || in.op == OpCode::Sub || in.op == OpCode::Div ||
                                    in.op == OpCode::Pow || in.op == OpCode::ReduceSum)) {
      why = "arithmetic on Bool";
    } else if (in.op == OpCode::Pow && !is_floating(in.dtype)) {
      why = "integer pow";
    }
    TORCH_CHECK(why == nullptr, "tcap ", backend, ": kernel ", k.name, ": %", v, " = ", to_string(in.op), ".",
                to_string(in.dtype), ": ", why, " is not supported by the ", renderer,
                " renderer (leave this op to ATen)\n", to_string(k));
  }
}

void verify(const Kernel& k) {
  const size_t rank = k.sizes.size();
  if (k.num_reduce_dims < 0 || static_cast<size_t>(k.num_reduce_dims) > rank) fail(k, "bad num_reduce_dims");
  for (int64_t s : k.sizes) {
    if (s < 0) fail(k, "negative size");
  }
  for (const Buffer& b : k.buffers) {
    if (b.param && (b.is_output || b.dtype != DType::F64)) fail(k, "parameter " + b.name + " is not an f64 input");
  }
  const auto elem = element_level(k);
  for (size_t v = 0; v < k.instrs.size(); ++v) {
    const Instr& in = k.instrs[v];
    const std::string at = "%" + std::to_string(v) + " (" + to_string(in.op) + "): ";
    for (int32_t a : in.args) {
      if (a < 0 || static_cast<size_t>(a) >= v) fail(k, at + "operand %" + std::to_string(a) + " is not defined before");
    }
    auto arity = [&](size_t n) {
      if (in.args.size() != n) fail(k, at + "expects " + std::to_string(n) + " operands");
    };
    auto dt = [&](size_t a) { return k.instrs[static_cast<size_t>(in.args[a])].dtype; };
    switch (in.op) {
      case OpCode::Load:
        arity(0);
        if (in.buffer < 0 || static_cast<size_t>(in.buffer) >= k.buffers.size()) fail(k, at + "bad buffer");
        if (k.buffers[static_cast<size_t>(in.buffer)].dtype != in.dtype) fail(k, at + "dtype differs from the buffer's");
        if (in.strides.size() != rank) fail(k, at + "needs one stride per domain dim");
        if (k.buffers[static_cast<size_t>(in.buffer)].param &&
            (in.offset != 0 || std::any_of(in.strides.begin(), in.strides.end(), [](int64_t st) { return st != 0; }))) {
          fail(k, at + "reads a parameter at an offset or along a dim");
        }
        break;
      case OpCode::Const: arity(0); break;
      case OpCode::Cast: arity(1); break;
      case OpCode::IsNan:
        arity(1);
        if (in.dtype != DType::Bool || !is_floating(dt(0))) fail(k, at + "floating operand, Bool result");
        break;
      case OpCode::Not:
      case OpCode::And:
      case OpCode::Or:
        arity(in.op == OpCode::Not ? 1 : 2);
        for (size_t a = 0; a < in.args.size(); ++a) {
          if (dt(a) != DType::Bool) fail(k, at + "needs Bool operands");
        }
        if (in.dtype != DType::Bool) fail(k, at + "result must be Bool");
        break;
      case OpCode::Where:
        arity(3);
        if (dt(0) != DType::Bool || dt(1) != in.dtype || dt(2) != in.dtype) fail(k, at + "operand dtypes");
        break;
      case OpCode::Fma:
        arity(3);
        if (!is_floating(in.dtype)) fail(k, at + "needs a floating result");
        for (size_t a = 0; a < 3; ++a) {
          if (dt(a) != in.dtype) fail(k, at + "operand dtypes differ from the result's");
        }
        break;
      case OpCode::Lt:
      case OpCode::Le:
      case OpCode::Gt:
      case OpCode::Ge:
      case OpCode::Eq:
      case OpCode::Ne:
        arity(2);
        if (dt(0) != dt(1) || in.dtype != DType::Bool) fail(k, at + "comparison dtypes");
        break;
      case OpCode::Add:
      case OpCode::Sub:
      case OpCode::Mul:
      case OpCode::Div:
      case OpCode::Pow:
      case OpCode::Max:
      case OpCode::Min:
        arity(2);
        if (dt(0) != in.dtype || dt(1) != in.dtype) fail(k, at + "operand dtypes differ from the result's");
        break;
      case OpCode::ReduceSum:
      case OpCode::ReduceMax:
      case OpCode::ReduceMin:
        arity(1);
        if (k.num_reduce_dims == 0) fail(k, at + "reduction in a kernel without reduce dims");
        if (dt(0) != in.dtype) fail(k, at + "operand dtype differs");
        if (!elem[static_cast<size_t>(in.args[0])]) fail(k, at + "operand is not element-level");
        break;
      default:
        arity(1);
        if (dt(0) != in.dtype) fail(k, at + "operand dtype differs");
        if (!is_floating(in.dtype) && in.op != OpCode::Neg && in.op != OpCode::Abs) {
          fail(k, at + "needs a floating dtype");
        }
        break;
    }
  }
  for (const Store& s : k.stores) {
    if (s.value < 0 || static_cast<size_t>(s.value) >= k.instrs.size()) fail(k, "store of an undefined value");
    if (s.buffer < 0 || static_cast<size_t>(s.buffer) >= k.buffers.size()) fail(k, "store to a bad buffer");
    const Buffer& b = k.buffers[static_cast<size_t>(s.buffer)];
    if (!b.is_output) fail(k, "store to input buffer " + b.name);
    if (b.dtype != k.instrs[static_cast<size_t>(s.value)].dtype) fail(k, "store dtype differs from the buffer's");
    if (s.strides.size() != rank) fail(k, "store needs one stride per domain dim");
  }
}

bool per_element(const Kernel& k, const Store& s, const std::vector<bool>& elem) {
  if (elem[static_cast<size_t>(s.value)]) return true;
  const size_t rank = k.sizes.size();
  for (size_t d = rank - static_cast<size_t>(k.num_reduce_dims); d < rank && d < s.strides.size(); ++d) {
    if (s.strides[d] != 0) return true;
  }
  return false;
}

}  // namespace tcap::kir
