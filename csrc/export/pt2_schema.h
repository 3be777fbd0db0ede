// The serialized ExportedProgram of the pinned LibTorch (torch/_export/serde/schema.yaml,
// mirrored in C++ by torch/csrc/utils/generated_serialization_types.h) and the PT2 archive
// layout (torch/csrc/export/pt2_archive_constants.h): the one file that knows them, so a
// LibTorch that changes them is mended here (Note [PT2 schema version]).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace tcap::pt2 {

// Note [PT2 schema version]
// The model JSON carries schema_version {major, minor}. A reader accepts the major version
// it was written for and any minor version (minor versions add optional fields); a newer
// major version is refused with both versions named. kSchemaMajor/kSchemaMinor are
// torch/_export/serde/schema.py's SCHEMA_VERSION of the pinned LibTorch (2.11: 8.17); the
// round-trip tests read it from the wheel's Python and fail when it moves.
constexpr int64_t kSchemaMajor = 8;
constexpr int64_t kSchemaMinor = 17;
constexpr int64_t kAtenOpset = 10;  // opset_version {"aten": 10} of torch.export in 2.11

using Json = nlohmann::ordered_json;

// Archive records (relative to the archive's root folder; PyTorchStreamWriter adds it).
std::string model_record(const std::string& model_name);          // models/<name>.json
std::string weights_config_record(const std::string& model_name);  // data/weights/<name>_weights_config.json
std::string constants_config_record(const std::string& model_name);
std::string sample_inputs_record(const std::string& model_name);  // data/sample_inputs/<name>.pt
std::string weight_record(const std::string& file);    // data/weights/<file>
std::string constant_record(const std::string& file);  // data/constants/<file>
extern const char* const kArchiveFormatRecord;          // "archive_format"
extern const char* const kArchiveFormatValue;           // "pt2"
extern const char* const kArchiveVersionRecord;
extern const char* const kArchiveVersionValue;
extern const char* const kWeightPrefix;                 // "weight_"
extern const char* const kTensorConstantPrefix;         // "tensor_"

// Enum values of the schema (not c10's numbering).
int64_t dtype_code(c10::ScalarType t);  // throws for a dtype the schema lacks
c10::ScalarType dtype_from_code(int64_t code);
int64_t layout_code(c10::Layout l);
c10::Layout layout_from_code(int64_t code);
int64_t memory_format_code(c10::MemoryFormat m);
c10::MemoryFormat memory_format_from_code(int64_t code);
Json device_json(const c10::Device& d);
c10::Device device_from_json(const Json& j);

// A concrete TensorMeta (sizes and strides as_int).
Json tensor_meta(const at::Tensor& t, bool requires_grad);
// What torch.save(v) writes, readable by torch.load(weights_only=True) (tuples, dicts and
// lists of tensors and numbers).
std::string torch_save_bytes(const c10::IValue& v);
// Raw bytes of a contiguous copy of t on the CPU (the archive's weight files).
std::string tensor_bytes(const at::Tensor& t);

}  // namespace tcap::pt2
