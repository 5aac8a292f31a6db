// safetensors: reader over a memory map (single files and sharded HF directories; every header field
// checked, hostile files give clear errors) and a small writer for tests and tools.
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section) plus an optional "__metadata__" object of string values. Shapes are row-major,
// outermost dimension first (the reverse of ggml's order). Tensor data is not aligned in general.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/dtype.h"

namespace dflash {

// Element types a safetensors header may name. All are recorded by the reader so that a file's
// layout is fully checked; only those with a DType (see safetensors_to_dtype) can be computed with.
enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kF8_E4M3,  // FP8 checkpoints: recognised so the error says what they are, not computed with
  kF8_E5M2,
  kF8_E8M0,
};

std::string_view safetensors_dtype_name(SafetensorsDType t);  // "F32", "BF16", ...
std::optional<SafetensorsDType> safetensors_dtype_from_name(std::string_view name);  // exact, case-sensitive
uint32_t safetensors_dtype_size(SafetensorsDType t);  // bytes per element
// The tensor DType this element type loads as (F32, F16, BF16, F64, I8, I16, I32, I64);
// kUnsupported with a message naming the type for the rest (U8, BOOL, unsigned, FP8).
Result<DType> safetensors_to_dtype(SafetensorsDType t);
// Inverse for the writer: F32, F16, BF16, F64, I8, I16, I32, I64; kUnsupported for quantized types.
Result<SafetensorsDType> safetensors_from_dtype(DType t);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<uint64_t> shape;  // row-major, outermost first; empty = scalar (one element)
  uint64_t offset = 0;          // byte offset from the start of the file
  uint64_t nbytes = 0;
  std::span<const uint8_t> data;  // into the file's bytes; not aligned in general
  uint64_t n_elements() const;
};

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;  // 100 MiB
inline constexpr size_t kSafetensorsMaxDims = 8;

class SafetensorsFile {
 public:
  // Maps and parses `path`; tensor data stays in the mapping.
  static Result<SafetensorsFile> open(const std::string& path);
  // Parses bytes the caller keeps alive (fuzzing, in-memory files). `name` is used in messages.
  static Result<SafetensorsFile> parse(std::span<const uint8_t> bytes, std::string name = "<memory>");

  const std::string& path() const { return path_; }
  uint64_t header_size() const { return header_size_; }  // N, the JSON length
  uint64_t data_offset() const { return 8 + header_size_; }
  uint64_t file_size() const { return bytes_.size(); }

  // Tensors in data-offset order (the order of their bytes in the file).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // The "__metadata__" map (e.g. {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  friend class SafetensorsParser;
  MappedFile map_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// A HF checkpoint directory: `model.safetensors`, or shards listed by `model.safetensors.index.json`
// ({"weight_map": {tensor name: shard file name}}). Shard names must be plain relative paths inside
// the directory (no "..", no absolute paths); symlinks (the HF hub cache layout) are followed.
// A tensor name may appear in one shard only.
class SafetensorsModel {
 public:
  static constexpr const char* kSingleFileName = "model.safetensors";
  static constexpr const char* kIndexFileName = "model.safetensors.index.json";

  static Result<SafetensorsModel> open_dir(const std::string& dir);
  // `path` may be a directory, a `.safetensors` file, or an index `.json` file.
  static Result<SafetensorsModel> open(const std::string& path);

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }

  const SafetensorsTensor* find(std::string_view name) const;
  // The shard holding `name` (nullptr when absent).
  const SafetensorsFile* file_of(std::string_view name) const;
  size_t tensor_count() const { return index_.size(); }
  std::vector<std::string> tensor_names() const;  // sorted
  uint64_t total_bytes() const;                   // sum of all tensors' nbytes

 private:
  static Result<SafetensorsModel> open_index(const std::string& index_path);
  Status add_file(SafetensorsFile file);

  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  // name -> (file index, tensor index within that file)
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> index_;
};

struct SafetensorsTensorToWrite {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<uint64_t> shape;     // row-major, outermost first
  std::span<const uint8_t> data;   // exactly n_elements * element size bytes
};

// Writes a safetensors file atomically; data follows in the order given, the header is padded with
// spaces to a multiple of 8 bytes so the data section starts aligned.
Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Writes `model.safetensors.index.json` content: {"metadata": {"total_size": N}, "weight_map": {...}}.
Status write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size);

}  // namespace dflash
