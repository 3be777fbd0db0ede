#include "export/pt2_schema.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/export/pt2_archive_constants.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace tcap::pt2 {
namespace spec = torch::_export::archive_spec;

namespace {

std::string format1(std::string_view pattern, const std::string& name) {
  std::string s(pattern);
  const auto at = s.find("{}");
  TORCH_INTERNAL_ASSERT(at != std::string::npos);
  return s.replace(at, 2, name);
}

// c10::ScalarType -> the schema's ScalarType (torch/_export/serde/schema.py).
struct DtypeCode {
  c10::ScalarType t;
  int64_t code;
};
constexpr DtypeCode kDtypes[] = {
    {c10::kByte, 1},          {c10::kChar, 2},          {c10::kShort, 3},           {c10::kInt, 4},
    {c10::kLong, 5},          {c10::kHalf, 6},          {c10::kFloat, 7},           {c10::kDouble, 8},
    {c10::kComplexHalf, 9},   {c10::kComplexFloat, 10}, {c10::kComplexDouble, 11},  {c10::kBool, 12},
    {c10::kBFloat16, 13},     {c10::kUInt16, 28},       {c10::kFloat8_e4m3fn, 29},  {c10::kFloat8_e5m2, 30},
    {c10::kFloat8_e4m3fnuz, 31}, {c10::kFloat8_e5m2fnuz, 32},
};

}  // namespace

const char* const kArchiveFormatRecord = spec::ARCHIVE_FORMAT_PATH.data();
const char* const kArchiveFormatValue = spec::ARCHIVE_FORMAT_VALUE.data();
const char* const kArchiveVersionRecord = spec::ARCHIVE_VERSION_PATH.data();
const char* const kArchiveVersionValue = spec::ARCHIVE_VERSION_VALUE.data();
const char* const kWeightPrefix = spec::WEIGHT_FILENAME_PREFIX.data();
const char* const kTensorConstantPrefix = spec::TENSOR_CONSTANT_FILENAME_PREFIX.data();

std::string model_record(const std::string& model_name) { return format1(spec::MODELS_FILENAME_FORMAT, model_name); }
std::string weights_config_record(const std::string& model_name) {
  return format1(spec::WEIGHTS_CONFIG_FILENAME_FORMAT, model_name);
}
std::string constants_config_record(const std::string& model_name) {
  return format1(spec::CONSTANTS_CONFIG_FILENAME_FORMAT, model_name);
}
std::string sample_inputs_record(const std::string& model_name) {
  return format1(spec::SAMPLE_INPUTS_FILENAME_FORMAT, model_name);
}
std::string weight_record(const std::string& file) { return std::string(spec::WEIGHTS_DIR) + file; }
std::string constant_record(const std::string& file) { return std::string(spec::CONSTANTS_DIR) + file; }

int64_t dtype_code(c10::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.t == t) return d.code;
  }
  TORCH_CHECK(false, "tcap export: dtype ", t, " has no value in the ExportedProgram schema");
}

c10::ScalarType dtype_from_code(int64_t code) {
  for (const auto& d : kDtypes) {
    if (d.code == code) return d.t;
  }
  TORCH_CHECK(false, "tcap load_program: unknown dtype code ", code, " in the program (schema ScalarType)");
}

int64_t layout_code(c10::Layout l) {
  TORCH_CHECK(l == c10::kStrided, "tcap export: only strided tensors can be exported, not layout ", l);
  return 7;  // Layout.Strided
}

c10::Layout layout_from_code(int64_t code) {
  TORCH_CHECK(code == 7, "tcap load_program: layout ", code, " is not supported (only Strided, 7)");
  return c10::kStrided;
}

int64_t memory_format_code(c10::MemoryFormat m) {
  switch (m) {
    case c10::MemoryFormat::Contiguous: return 1;
    case c10::MemoryFormat::ChannelsLast: return 2;
    case c10::MemoryFormat::ChannelsLast3d: return 3;
    case c10::MemoryFormat::Preserve: return 4;
    default: TORCH_CHECK(false, "tcap export: memory format ", m, " has no value in the schema");
  }
}

c10::MemoryFormat memory_format_from_code(int64_t code) {
  switch (code) {
    case 1: return c10::MemoryFormat::Contiguous;
    case 2: return c10::MemoryFormat::ChannelsLast;
    case 3: return c10::MemoryFormat::ChannelsLast3d;
    case 4: return c10::MemoryFormat::Preserve;
    default: TORCH_CHECK(false, "tcap load_program: unknown memory format code ", code);
  }
}

Json device_json(const c10::Device& d) {
  Json j;
  j["type"] = c10::DeviceTypeName(d.type(), /*lower_case=*/true);
  j["index"] = d.has_index() ? Json(static_cast<int64_t>(d.index())) : Json(nullptr);
  return j;
}

c10::Device device_from_json(const Json& j) {
  std::string s = j.at("type").get<std::string>();
  if (j.contains("index") && !j.at("index").is_null()) s += ":" + std::to_string(j.at("index").get<int64_t>());
  return c10::Device(s);
}

Json tensor_meta(const at::Tensor& t, bool requires_grad) {
  Json m;
  m["dtype"] = dtype_code(t.scalar_type());
  Json sizes = Json::array(), strides = Json::array();
  for (int64_t s : t.sizes()) sizes.push_back(Json{{"as_int", s}});
  for (int64_t s : t.strides()) strides.push_back(Json{{"as_int", s}});
  m["sizes"] = std::move(sizes);
  m["requires_grad"] = requires_grad;
  m["device"] = device_json(t.device());
  m["strides"] = std::move(strides);
  m["storage_offset"] = Json{{"as_int", t.storage_offset()}};
  m["layout"] = layout_code(t.layout());
  return m;
}

std::string tensor_bytes(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

std::string torch_save_bytes(const c10::IValue& v) {
  std::vector<char> pickle;
  // Untagged: a tagged dict or list is rebuilt through torch.jit._pickle.restore_type_tag,
  // which torch.load(weights_only=True) refuses.
  torch::jit::Pickler pickler([&](const char* b, size_t n) { pickle.insert(pickle.end(), b, b + n); }, nullptr,
                              nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(v);
  pickler.stop();
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return out;
}

}  // namespace tcap::pt2
