// Names of dtypes and IR enums. These strings are a contract: the JSON writer and
// reader (json.cpp), the printer and golden files all spell enums this way, so a
// change here is a change of the graph JSON schema (docs/graph-json.md).
#include <tcap/graph.h>

#include <c10/util/Exception.h>

#include <string>

namespace tcap::ir {

namespace {

// One row per c10::ScalarType. `name` is the Python spelling without "torch."
// (torch.float32 -> "float32"); `short_name` is the compact form used in printed
// types ("f32[4, 5]"), after torch.fx / inductor's convention.
struct DtypeName {
  c10::ScalarType type;
  const char* name;
  const char* short_name;
};

constexpr DtypeName kDtypes[] = {
    {c10::ScalarType::Float, "float32", "f32"},
    {c10::ScalarType::Double, "float64", "f64"},
    {c10::ScalarType::Half, "float16", "f16"},
    {c10::ScalarType::BFloat16, "bfloat16", "bf16"},
    {c10::ScalarType::Long, "int64", "i64"},
    {c10::ScalarType::Int, "int32", "i32"},
    {c10::ScalarType::Short, "int16", "i16"},
    {c10::ScalarType::Char, "int8", "i8"},
    {c10::ScalarType::Byte, "uint8", "u8"},
    {c10::ScalarType::Bool, "bool", "b8"},
    {c10::ScalarType::ComplexHalf, "complex32", "c32"},
    {c10::ScalarType::ComplexFloat, "complex64", "c64"},
    {c10::ScalarType::ComplexDouble, "complex128", "c128"},
    {c10::ScalarType::UInt16, "uint16", "u16"},
    {c10::ScalarType::UInt32, "uint32", "u32"},
    {c10::ScalarType::UInt64, "uint64", "u64"},
    {c10::ScalarType::Float8_e5m2, "float8_e5m2", "f8e5m2"},
    {c10::ScalarType::Float8_e4m3fn, "float8_e4m3fn", "f8e4m3fn"},
    {c10::ScalarType::Float8_e5m2fnuz, "float8_e5m2fnuz", "f8e5m2fnuz"},
    {c10::ScalarType::Float8_e4m3fnuz, "float8_e4m3fnuz", "f8e4m3fnuz"},
    {c10::ScalarType::Float8_e8m0fnu, "float8_e8m0fnu", "f8e8m0fnu"},
    {c10::ScalarType::Float4_e2m1fn_x2, "float4_e2m1fn_x2", "f4e2m1fnx2"},
    {c10::ScalarType::QInt8, "qint8", "qi8"},
    {c10::ScalarType::QUInt8, "quint8", "qu8"},
    {c10::ScalarType::QInt32, "qint32", "qi32"},
    {c10::ScalarType::QUInt4x2, "quint4x2", "qu4x2"},
    {c10::ScalarType::QUInt2x4, "quint2x4", "qu2x4"},
    {c10::ScalarType::Bits1x8, "bits1x8", "bits1x8"},
    {c10::ScalarType::Bits2x4, "bits2x4", "bits2x4"},
    {c10::ScalarType::Bits4x2, "bits4x2", "bits4x2"},
    {c10::ScalarType::Bits8, "bits8", "bits8"},
    {c10::ScalarType::Bits16, "bits16", "bits16"},
    {c10::ScalarType::UInt1, "uint1", "u1"},
    {c10::ScalarType::UInt2, "uint2", "u2"},
    {c10::ScalarType::UInt3, "uint3", "u3"},
    {c10::ScalarType::UInt4, "uint4", "u4"},
    {c10::ScalarType::UInt5, "uint5", "u5"},
    {c10::ScalarType::UInt6, "uint6", "u6"},
    {c10::ScalarType::UInt7, "uint7", "u7"},
    {c10::ScalarType::Int1, "int1", "i1"},
    {c10::ScalarType::Int2, "int2", "i2"},
    {c10::ScalarType::Int3, "int3", "i3"},
    {c10::ScalarType::Int4, "int4", "i4"},
    {c10::ScalarType::Int5, "int5", "i5"},
    {c10::ScalarType::Int6, "int6", "i6"},
    {c10::ScalarType::Int7, "int7", "i7"},
    {c10::ScalarType::Undefined, "undefined", "undefined"},
};

const DtypeName* find_dtype(c10::ScalarType t) {
  for (const auto& row : kDtypes) {
    if (row.type == t) return &row;
  }
  return nullptr;
}

}  // namespace

std::string dtype_short_name(c10::ScalarType t) {
  if (const DtypeName* row = find_dtype(t)) return row->short_name;
  // A dtype newer than this table: still printable, never a crash.
  return "dtype" + std::to_string(static_cast<int>(t));
}

std::string dtype_name(c10::ScalarType t) {
  if (const DtypeName* row = find_dtype(t)) return row->name;
  return "dtype" + std::to_string(static_cast<int>(t));
}

// Accepts the long names of dtype_name() and, as a convenience for hand-written
// graphs and tools, the short names of dtype_short_name() ("f32"). Both sets are
// disjoint except where they coincide for the same dtype (the bits types).
c10::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& row : kDtypes) {
    if (name == row.name || name == row.short_name) return row.type;
  }
  TORCH_CHECK(false, "unknown dtype '", name, "'");
}

std::string to_string(NodeKind k) {
  switch (k) {
    case NodeKind::Input: return "input";
    case NodeKind::Call: return "call";
    case NodeKind::CallHook: return "call_hook";
    case NodeKind::Output: return "output";
  }
  return "node_kind" + std::to_string(static_cast<int>(k));
}

std::string to_string(InputKind k) {
  switch (k) {
    case InputKind::UserInput: return "user_input";
    case InputKind::Parameter: return "parameter";
    case InputKind::Buffer: return "buffer";
    case InputKind::Tangent: return "tangent";
    case InputKind::Constant: return "constant";
    case InputKind::Saved: return "saved";
    case InputKind::HostScalar: return "host_scalar";
  }
  return "input_kind" + std::to_string(static_cast<int>(k));
}

std::string to_string(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
  }
  return "phase" + std::to_string(static_cast<int>(p));
}

std::string to_string(OutputKind k) {
  switch (k) {
    case OutputKind::User: return "user";
    case OutputKind::Grad: return "grad";
    case OutputKind::Saved: return "saved";
  }
  return "output_kind" + std::to_string(static_cast<int>(k));
}

std::string to_string(HookKind k) {
  switch (k) {
    case HookKind::TensorPreHook: return "tensor_pre_hook";
    case HookKind::RetainsGradHook: return "retains_grad_hook";
    case HookKind::PreHook: return "pre_hook";
    case HookKind::PostHook: return "post_hook";
    case HookKind::AccumulateGrad: return "accumulate_grad";
  }
  return "hook_kind" + std::to_string(static_cast<int>(k));
}

std::string to_string(ArgKind k) {
  switch (k) {
    case ArgKind::None: return "none";
    case ArgKind::UndefinedTensor: return "undefined_tensor";
    case ArgKind::Value: return "value";
    case ArgKind::ValueList: return "value_list";
    case ArgKind::OptValueList: return "opt_value_list";
    case ArgKind::Bool: return "bool";
    case ArgKind::Int: return "int";
    case ArgKind::Double: return "double";
    case ArgKind::Complex: return "complex";
    case ArgKind::String: return "string";
    case ArgKind::IntList: return "int_list";
    case ArgKind::DoubleList: return "double_list";
    case ArgKind::BoolList: return "bool_list";
    case ArgKind::ScalarType: return "scalar_type";
    case ArgKind::Layout: return "layout";
    case ArgKind::MemoryFormat: return "memory_format";
    case ArgKind::Device: return "device";
    case ArgKind::WrappedScalar: return "wrapped_scalar";
    case ArgKind::Opaque: return "opaque";
  }
  return "arg_kind" + std::to_string(static_cast<int>(k));
}

}  // namespace tcap::ir
