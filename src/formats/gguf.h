// GGUF (v2/v3): reader over a memory map (every field checked, hostile files give clear errors) and writer.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/dtype.h"

namespace dflash {

// Metadata value types as stored in the file.
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value: a scalar, a string, or an array (of scalars, strings or arrays).
class GgufValue {
 public:
  GgufValue() = default;

  static GgufValue u8(uint8_t v) { return scalar_int(GgufType::kU8, v); }
  static GgufValue i8(int8_t v) { return scalar_int(GgufType::kI8, v); }
  static GgufValue u16(uint16_t v) { return scalar_int(GgufType::kU16, v); }
  static GgufValue i16(int16_t v) { return scalar_int(GgufType::kI16, v); }
  static GgufValue u32(uint32_t v) { return scalar_int(GgufType::kU32, v); }
  static GgufValue i32(int32_t v) { return scalar_int(GgufType::kI32, v); }
  static GgufValue u64(uint64_t v) { return scalar_int(GgufType::kU64, static_cast<int64_t>(v)); }
  static GgufValue i64(int64_t v) { return scalar_int(GgufType::kI64, v); }
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v) { return scalar_int(GgufType::kBool, v ? 1 : 0); }
  static GgufValue string(std::string v);
  static GgufValue string_array(std::vector<std::string> v);
  // Integer arrays of element type `elem` (kU8..kI64, kBool); values must fit the type.
  static GgufValue int_array(GgufType elem, std::vector<int64_t> v);
  static GgufValue float_array(GgufType elem, std::vector<double> v);  // kF32 or kF64
  static GgufValue nested_array(std::vector<GgufValue> v);             // array of arrays

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::kArray; }
  GgufType array_type() const { return elem_; }
  size_t array_size() const;

  // Scalars. Integers convert when the value fits; floats accept integers too.
  std::optional<int64_t> as_int() const;
  std::optional<uint64_t> as_uint() const;
  std::optional<double> as_float() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const { return type_ == GgufType::kString ? &str_ : nullptr; }

  // Arrays (nullptr / nullopt when the value is not an array of that kind).
  const std::vector<std::string>* as_string_array() const;
  const std::vector<int64_t>* as_int_array() const;  // any integer or bool element type (u64 bit-cast)
  std::optional<std::vector<double>> as_float_array() const;  // float or integer elements
  const std::vector<GgufValue>* as_nested_array() const;

  // Short human form for `dflash inspect`: scalars in full, arrays as "[type x N] first, ...".
  std::string summary(size_t max_items = 8) const;

  bool operator==(const GgufValue& o) const = default;

 private:
  friend class GgufParser;
  static GgufValue scalar_int(GgufType t, int64_t v) {
    GgufValue g;
    g.type_ = t;
    g.int_ = v;
    return g;
  }
  GgufType type_ = GgufType::kU32;
  GgufType elem_ = GgufType::kU8;  // element type when type_ == kArray
  int64_t int_ = 0;                // integer and bool scalars (u64 bit-cast)
  double float_ = 0;               // f32/f64 scalars
  std::string str_;
  std::vector<std::string> strs_;
  std::vector<int64_t> ints_;
  std::vector<double> floats_;
  std::vector<GgufValue> nested_;
};

struct GgufTensorInfo {
  std::string name;
  DType type = DType::kF32;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the contiguous (innermost) dimension
  uint64_t offset = 0;          // from the start of the data section
  uint64_t nbytes = 0;
  uint64_t n_elements() const;
};

inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxDims = 4;

class GgufFile {
 public:
  // Maps and parses a file; tensor data stays in the mapping.
  static Result<GgufFile> open(const std::string& path);
  // Parses bytes the caller keeps alive (fuzzing, in-memory files).
  static Result<GgufFile> parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return bytes_.size(); }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  // Typed lookups; nullopt when absent, an error Status when present with the wrong type.
  Result<std::optional<std::string>> get_string(const std::string& key) const;
  Result<std::optional<int64_t>> get_int(const std::string& key) const;
  Result<std::optional<double>> get_float(const std::string& key) const;
  Result<std::optional<bool>> get_bool(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& t) const;

 private:
  friend class GgufParser;
  MappedFile map_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Builds a GGUF v3 file. Metadata keeps insertion order (set() on an existing key replaces in place);
// tensor data is streamed at write time so models larger than memory can be converted.
class GgufWriter {
 public:
  using DataWriter = std::function<Status(std::FILE*)>;  // must write exactly the tensor's nbytes

  void set(const std::string& key, GgufValue value);
  void remove(const std::string& key);
  const GgufValue* find(const std::string& key) const;
  void set_alignment(uint64_t alignment) { alignment_ = alignment; }

  // Shape in ggml order (innermost first). Error when the row is not a whole number of blocks.
  Status add_tensor(const std::string& name, DType type, std::vector<uint64_t> shape, DataWriter data);
  Status add_tensor(const std::string& name, DType type, std::vector<uint64_t> shape,
                    std::span<const uint8_t> data);
  size_t tensor_count() const { return tensors_.size(); }

  // Writes atomically (temp file, fsync, rename).
  Status write(const std::string& path) const;

 private:
  struct PendingTensor {
    GgufTensorInfo info;
    DataWriter data;
  };
  uint64_t alignment_ = kGgufDefaultAlignment;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace dflash
