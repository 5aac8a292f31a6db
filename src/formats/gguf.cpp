#include "formats/gguf.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/checked_math.h"
#include "base/file_io.h"

namespace dflash {

static_assert(std::endian::native == std::endian::little, "GGUF files are little-endian; so is this reader");

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "unknown";
}

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 4;

bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
    case GgufType::kBool:
      return true;
    default:
      return false;
  }
}
bool is_float_type(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

// Bytes one element of a fixed-size type occupies in the file; 0 for string/array.
uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Whether integer v (u64 bit-cast for kU64) is representable in t.
bool int_fits(GgufType t, int64_t v) {
  switch (t) {
    case GgufType::kU8: return v >= 0 && v <= 0xff;
    case GgufType::kI8: return v >= -128 && v <= 127;
    case GgufType::kU16: return v >= 0 && v <= 0xffff;
    case GgufType::kI16: return v >= -32768 && v <= 32767;
    case GgufType::kU32: return v >= 0 && v <= 0xffffffffLL;
    case GgufType::kI32: return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    case GgufType::kBool: return v == 0 || v == 1;
    case GgufType::kU64: case GgufType::kI64: return true;
    default: return false;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GgufValue

GgufValue GgufValue::f32(float v) {
  GgufValue g;
  g.type_ = GgufType::kF32;
  g.float_ = v;
  return g;
}
GgufValue GgufValue::f64(double v) {
  GgufValue g;
  g.type_ = GgufType::kF64;
  g.float_ = v;
  return g;
}
GgufValue GgufValue::string(std::string v) {
  GgufValue g;
  g.type_ = GgufType::kString;
  g.str_ = std::move(v);
  return g;
}
GgufValue GgufValue::string_array(std::vector<std::string> v) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_ = GgufType::kString;
  g.strs_ = std::move(v);
  return g;
}
GgufValue GgufValue::int_array(GgufType elem, std::vector<int64_t> v) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_ = is_int_type(elem) ? elem : GgufType::kI64;
  g.ints_ = std::move(v);
  return g;
}
GgufValue GgufValue::float_array(GgufType elem, std::vector<double> v) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_ = is_float_type(elem) ? elem : GgufType::kF64;
  g.floats_ = std::move(v);
  return g;
}
GgufValue GgufValue::nested_array(std::vector<GgufValue> v) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_ = GgufType::kArray;
  g.nested_ = std::move(v);
  return g;
}

size_t GgufValue::array_size() const {
  if (type_ != GgufType::kArray) return 0;
  if (elem_ == GgufType::kString) return strs_.size();
  if (elem_ == GgufType::kArray) return nested_.size();
  if (is_float_type(elem_)) return floats_.size();
  return ints_.size();
}

std::optional<int64_t> GgufValue::as_int() const {
  if (!is_int_type(type_)) return std::nullopt;
  if (type_ == GgufType::kU64 && int_ < 0) return std::nullopt;  // above INT64_MAX
  return int_;
}
std::optional<uint64_t> GgufValue::as_uint() const {
  if (!is_int_type(type_)) return std::nullopt;
  if (type_ == GgufType::kU64) return static_cast<uint64_t>(int_);
  if (int_ < 0) return std::nullopt;
  return static_cast<uint64_t>(int_);
}
std::optional<double> GgufValue::as_float() const {
  if (is_float_type(type_)) return float_;
  if (type_ == GgufType::kU64) return static_cast<double>(static_cast<uint64_t>(int_));
  if (is_int_type(type_) && type_ != GgufType::kBool) return static_cast<double>(int_);
  return std::nullopt;
}
std::optional<bool> GgufValue::as_bool() const {
  if (type_ == GgufType::kBool) return int_ != 0;
  return std::nullopt;
}
const std::vector<std::string>* GgufValue::as_string_array() const {
  return type_ == GgufType::kArray && elem_ == GgufType::kString ? &strs_ : nullptr;
}
const std::vector<int64_t>* GgufValue::as_int_array() const {
  return type_ == GgufType::kArray && is_int_type(elem_) ? &ints_ : nullptr;
}
std::optional<std::vector<double>> GgufValue::as_float_array() const {
  if (type_ != GgufType::kArray) return std::nullopt;
  if (is_float_type(elem_)) return floats_;
  if (is_int_type(elem_) && elem_ != GgufType::kBool) {
    std::vector<double> out;
    out.reserve(ints_.size());
    for (int64_t v : ints_)
      out.push_back(elem_ == GgufType::kU64 ? static_cast<double>(static_cast<uint64_t>(v)) : static_cast<double>(v));
    return out;
  }
  return std::nullopt;
}
const std::vector<GgufValue>* GgufValue::as_nested_array() const {
  return type_ == GgufType::kArray && elem_ == GgufType::kArray ? &nested_ : nullptr;
}

namespace {

std::string quote_short(const std::string& s, size_t max_chars = 60) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
    char c = s[i];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else out += c;
  }
  if (s.size() > max_chars) out += "…";
  return out + "\"";
}

std::string format_scalar(GgufType t, int64_t i, double f) {
  if (t == GgufType::kBool) return i ? "true" : "false";
  if (t == GgufType::kU64) return fmt::format("{}", static_cast<uint64_t>(i));
  if (is_float_type(t)) return fmt::format("{}", f);
  return fmt::format("{}", i);
}

}  // namespace

std::string GgufValue::summary(size_t max_items) const {
  if (type_ == GgufType::kString) return quote_short(str_, 200);
  if (type_ != GgufType::kArray) return format_scalar(type_, int_, float_);
  size_t n = array_size();
  std::string out = fmt::format("[{} x {}]", gguf_type_name(elem_), n);
  for (size_t k = 0; k < n && k < max_items; ++k) {
    out += k == 0 ? " " : ", ";
    if (elem_ == GgufType::kString) out += quote_short(strs_[k], 24);
    else if (elem_ == GgufType::kArray) out += nested_[k].summary(2);
    else if (is_float_type(elem_)) out += format_scalar(elem_, 0, floats_[k]);
    else out += format_scalar(elem_, ints_[k], 0);
  }
  if (n > max_items) out += ", …";
  return out;
}

uint64_t GgufTensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated against overflow at parse time
  return n;
}

// ---------------------------------------------------------------------------------------------
// Parser

class GgufParser {
 public:
  explicit GgufParser(std::span<const uint8_t> bytes) : b_(bytes) {}

  Status parse(GgufFile& f) {
    uint32_t magic = 0;
    DF_RETURN_IF_ERROR(read_pod(magic, "magic"));
    if (magic != kMagic) return corrupt("not a GGUF file (magic {:08x}, expected 'GGUF')", magic);
    DF_RETURN_IF_ERROR(read_pod(f.version_, "version"));
    if (f.version_ == 1) return unsupported("GGUF version 1 is not supported (re-convert the model)");
    if (f.version_ != 2 && f.version_ != 3) {
      if (__builtin_bswap32(f.version_) == 2 || __builtin_bswap32(f.version_) == 3)
        return unsupported("big-endian GGUF files are not supported");
      return unsupported("GGUF version {} is not supported (2 and 3 are)", f.version_);
    }
    uint64_t n_tensors = 0, n_kv = 0;
    DF_RETURN_IF_ERROR(read_pod(n_tensors, "tensor count"));
    DF_RETURN_IF_ERROR(read_pod(n_kv, "metadata count"));
    // Every key-value takes at least 12 bytes (key length + type), every tensor info at least 24:
    // counts beyond what the file could hold are corrupt, and never drive an allocation.
    if (n_kv > remaining() / 12) return corrupt("metadata count {} is larger than the file can hold", n_kv);
    if (n_tensors > remaining() / 24) return corrupt("tensor count {} is larger than the file can hold", n_tensors);

    f.kv_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key;
      DF_RETURN_IF_ERROR(read_string(key, fmt::format("metadata key #{}", i)));
      if (key.empty()) return corrupt("metadata key #{} is empty", i);
      if (f.kv_index_.count(key)) return corrupt("metadata key '{}' appears twice", key);
      uint32_t type = 0;
      DF_RETURN_IF_ERROR(read_pod(type, "metadata type"));
      GgufValue v;
      DF_RETURN_IF_ERROR(read_value(type, v, key, 0));
      f.kv_index_[key] = f.kv_.size();
      f.kv_.emplace_back(std::move(key), std::move(v));
    }

    if (auto it = f.kv_index_.find("general.alignment"); it != f.kv_index_.end()) {
      const GgufValue& a = f.kv_[it->second].second;
      if (a.type() != GgufType::kU32) return corrupt("general.alignment must be a u32, not {}", gguf_type_name(a.type()));
      uint64_t al = *a.as_uint();
      if (al == 0 || (al & (al - 1)) != 0) return corrupt("general.alignment {} is not a power of two", al);
      f.alignment_ = al;
    }

    f.tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo t;
      DF_RETURN_IF_ERROR(read_string(t.name, fmt::format("tensor #{} name", i)));
      if (t.name.empty()) return corrupt("tensor #{} has an empty name", i);
      if (f.tensor_index_.count(t.name)) return corrupt("tensor '{}' appears twice", t.name);
      uint32_t n_dims = 0;
      DF_RETURN_IF_ERROR(read_pod(n_dims, "tensor dimension count"));
      if (n_dims == 0 || n_dims > kGgufMaxDims)
        return corrupt("tensor '{}' has {} dimensions (1 to {} allowed)", t.name, n_dims, kGgufMaxDims);
      uint64_t n_elem = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        uint64_t dim = 0;
        DF_RETURN_IF_ERROR(read_pod(dim, "tensor dimension"));
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return corrupt("tensor '{}' dimension {} is {}, too large", t.name, d, dim);
        auto prod = checked_mul(n_elem, dim);
        if (!prod || *prod > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return corrupt("tensor '{}' element count overflows", t.name);
        n_elem = *prod;
        t.shape.push_back(dim);
      }
      uint32_t type = 0;
      DF_RETURN_IF_ERROR(read_pod(type, "tensor type"));
      auto info = dtype_info(type);
      if (!info) return unsupported("tensor '{}' has type id {}, which this build does not support", t.name, type);
      t.type = info->type;
      if (t.shape[0] % info->block_elems != 0)
        return corrupt("tensor '{}' row of {} elements is not a multiple of the {} block size {}", t.name,
                       t.shape[0], info->name, info->block_elems);
      auto nbytes = checked_mul(n_elem / info->block_elems, info->block_bytes);
      if (!nbytes) return corrupt("tensor '{}' byte size overflows", t.name);
      t.nbytes = *nbytes;
      DF_RETURN_IF_ERROR(read_pod(t.offset, "tensor offset"));
      if (t.offset % f.alignment_ != 0)
        return corrupt("tensor '{}' offset {} is not aligned to {}", t.name, t.offset, f.alignment_);
      f.tensor_index_[t.name] = f.tensors_.size();
      f.tensors_.push_back(std::move(t));
    }

    uint64_t data_start = align_up(pos_, f.alignment_);
    f.data_offset_ = data_start;
    uint64_t data_size = data_start <= b_.size() ? b_.size() - data_start : 0;
    for (const auto& t : f.tensors_) {
      auto end = checked_add(t.offset, t.nbytes);
      if (!end || *end > data_size)
        return corrupt("tensor '{}' data [{}, +{}) runs past the end of the file (data section holds {} bytes)",
                       t.name, t.offset, t.nbytes, data_size);
    }
    return Status();
  }

 private:
  uint64_t remaining() const { return b_.size() - pos_; }

  template <typename T>
  Status read_pod(T& out, const char* what) {
    if (remaining() < sizeof(T)) return corrupt("file truncated while reading {} at offset {}", what, pos_);
    std::memcpy(&out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status();
  }

  Status read_string(std::string& out, const std::string& what) {
    uint64_t len = 0;
    DF_RETURN_IF_ERROR(read_pod(len, "string length"));
    if (len > remaining())
      return corrupt("{}: string of {} bytes at offset {} runs past the end of the file", what, len, pos_);
    out.assign(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return Status();
  }

  Status read_value(uint32_t type, GgufValue& v, const std::string& key, int depth) {
    if (!valid_type(type)) return corrupt("metadata '{}' has unknown value type {}", key, type);
    GgufType t = static_cast<GgufType>(type);
    v.type_ = t;
    switch (t) {
      case GgufType::kString:
        return read_string(v.str_, fmt::format("metadata '{}'", key));
      case GgufType::kArray:
        return read_array(v, key, depth);
      case GgufType::kF32: {
        float x = 0;
        DF_RETURN_IF_ERROR(read_pod(x, "f32 value"));
        v.float_ = x;
        return Status();
      }
      case GgufType::kF64:
        return read_pod(v.float_, "f64 value");
      default:
        return read_int(t, v.int_, key);
    }
  }

  Status read_int(GgufType t, int64_t& out, const std::string& key) {
    switch (t) {
      case GgufType::kU8: { uint8_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "u8")); out = x; break; }
      case GgufType::kI8: { int8_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "i8")); out = x; break; }
      case GgufType::kU16: { uint16_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "u16")); out = x; break; }
      case GgufType::kI16: { int16_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "i16")); out = x; break; }
      case GgufType::kU32: { uint32_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "u32")); out = x; break; }
      case GgufType::kI32: { int32_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "i32")); out = x; break; }
      case GgufType::kU64: { uint64_t x = 0; DF_RETURN_IF_ERROR(read_pod(x, "u64")); out = static_cast<int64_t>(x); break; }
      case GgufType::kI64: { DF_RETURN_IF_ERROR(read_pod(out, "i64")); break; }
      case GgufType::kBool: {
        uint8_t x = 0;
        DF_RETURN_IF_ERROR(read_pod(x, "bool"));
        if (x > 1) return corrupt("metadata '{}' has bool value {}", key, x);
        out = x;
        break;
      }
      default:
        return internal_error("read_int on non-integer type");
    }
    return Status();
  }

  Status read_array(GgufValue& v, const std::string& key, int depth) {
    if (depth >= kMaxArrayDepth) return corrupt("metadata '{}' nests arrays deeper than {}", key, kMaxArrayDepth);
    uint32_t elem = 0;
    uint64_t n = 0;
    DF_RETURN_IF_ERROR(read_pod(elem, "array element type"));
    DF_RETURN_IF_ERROR(read_pod(n, "array length"));
    if (!valid_type(elem)) return corrupt("metadata '{}' is an array of unknown type {}", key, elem);
    GgufType et = static_cast<GgufType>(elem);
    v.elem_ = et;
    // Strings take >= 8 bytes each, arrays >= 12, scalars their size: bound n before reserving.
    uint64_t min_size = et == GgufType::kString ? 8 : et == GgufType::kArray ? 12 : scalar_size(et);
    if (n > remaining() / min_size)
      return corrupt("metadata '{}' array of {} elements is larger than the file can hold", key, n);
    if (et == GgufType::kString) {
      v.strs_.resize(n);
      for (uint64_t i = 0; i < n; ++i)
        DF_RETURN_IF_ERROR(read_string(v.strs_[i], fmt::format("metadata '{}'[{}]", key, i)));
    } else if (et == GgufType::kArray) {
      v.nested_.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        v.nested_[i].type_ = GgufType::kArray;
        DF_RETURN_IF_ERROR(read_array(v.nested_[i], key, depth + 1));
      }
    } else if (is_float_type(et)) {
      v.floats_.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        if (et == GgufType::kF32) {
          float x = 0;
          DF_RETURN_IF_ERROR(read_pod(x, "f32"));
          v.floats_[i] = x;
        } else {
          DF_RETURN_IF_ERROR(read_pod(v.floats_[i], "f64"));
        }
      }
    } else {
      v.ints_.resize(n);
      for (uint64_t i = 0; i < n; ++i) DF_RETURN_IF_ERROR(read_int(et, v.ints_[i], key));
    }
    return Status();
  }

  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------
// GgufFile

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  f.bytes_ = bytes;
  GgufParser p(bytes);
  DF_RETURN_IF_ERROR(p.parse(f));
  return f;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  DF_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  auto parsed = parse(map.bytes());
  if (!parsed.ok()) return parsed.status().with_context(path);
  GgufFile f = std::move(parsed).value();
  f.map_ = std::move(map);  // the span points into the mapping, which moving does not relocate
  f.path_ = path;
  return f;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

Result<std::optional<std::string>> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<std::string>();
  if (!v->as_string()) return corrupt("metadata '{}' should be a string, not {}", key, gguf_type_name(v->type()));
  return std::optional<std::string>(*v->as_string());
}

Result<std::optional<int64_t>> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<int64_t>();
  auto i = v->as_int();
  if (!i) return corrupt("metadata '{}' should be an integer, not {}", key, gguf_type_name(v->type()));
  return std::optional<int64_t>(*i);
}

Result<std::optional<double>> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<double>();
  auto x = v->as_float();
  if (!x) return corrupt("metadata '{}' should be a number, not {}", key, gguf_type_name(v->type()));
  return std::optional<double>(*x);
}

Result<std::optional<bool>> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::optional<bool>();
  auto x = v->as_bool();
  if (!x) return corrupt("metadata '{}' should be a bool, not {}", key, gguf_type_name(v->type()));
  return std::optional<bool>(*x);
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensorInfo& t) const {
  return bytes_.subspan(data_offset_ + t.offset, t.nbytes);
}

// ---------------------------------------------------------------------------------------------
// Writer

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::remove(const std::string& key) {
  std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; });
}

const GgufValue* GgufWriter::find(const std::string& key) const {
  for (const auto& kv : kv_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

Status GgufWriter::add_tensor(const std::string& name, DType type, std::vector<uint64_t> shape, DataWriter data) {
  if (name.empty()) return invalid_argument("tensor name is empty");
  if (shape.empty() || shape.size() > kGgufMaxDims)
    return invalid_argument("tensor '{}' has {} dimensions (1 to {} allowed)", name, shape.size(), kGgufMaxDims);
  for (const auto& t : tensors_)
    if (t.info.name == name) return invalid_argument("tensor '{}' added twice", name);
  auto info = dtype_info(type);
  if (!info) return unsupported("tensor '{}': type id {} is not supported", name, static_cast<uint32_t>(type));
  if (shape[0] % info->block_elems != 0)
    return invalid_argument("tensor '{}': row of {} is not a multiple of the {} block size {}", name, shape[0],
                            info->name, info->block_elems);
  uint64_t n = 1;
  for (uint64_t d : shape) {
    auto p = checked_mul(n, d);
    if (!p) return invalid_argument("tensor '{}' element count overflows", name);
    n = *p;
  }
  PendingTensor t;
  t.info.name = name;
  t.info.type = type;
  t.info.shape = std::move(shape);
  t.info.nbytes = n / info->block_elems * info->block_bytes;
  t.data = std::move(data);
  tensors_.push_back(std::move(t));
  return Status();
}

Status GgufWriter::add_tensor(const std::string& name, DType type, std::vector<uint64_t> shape,
                              std::span<const uint8_t> data) {
  std::vector<uint64_t> shape_copy = shape;
  DF_RETURN_IF_ERROR(add_tensor(name, type, std::move(shape), DataWriter{}));
  PendingTensor& t = tensors_.back();
  if (data.size() != t.info.nbytes) {
    uint64_t want = t.info.nbytes;
    tensors_.pop_back();
    return invalid_argument("tensor '{}': {} bytes given, shape and type need {}", name, data.size(), want);
  }
  t.data = [data](std::FILE* f) { return write_all(f, data.data(), data.size()); };
  return Status();
}

namespace {

struct ByteSink {
  std::FILE* f;
  uint64_t written = 0;
  Status st;
  void raw(const void* p, size_t n) {
    if (!st.ok()) return;
    st = write_all(f, p, n);
    written += n;
  }
  template <typename T>
  void pod(T v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    uint64_t n = align_up(written, alignment) - written;
    while (n > 0 && st.ok()) {
      uint64_t k = std::min<uint64_t>(n, sizeof zeros);
      raw(zeros, k);
      n -= k;
    }
  }
};

Status write_int(ByteSink& s, GgufType t, int64_t v) {
  if (!int_fits(t, v)) return invalid_argument("value {} does not fit GGUF type {}", v, gguf_type_name(t));
  switch (t) {
    case GgufType::kU8: s.pod<uint8_t>(v); break;
    case GgufType::kI8: s.pod<int8_t>(v); break;
    case GgufType::kU16: s.pod<uint16_t>(v); break;
    case GgufType::kI16: s.pod<int16_t>(v); break;
    case GgufType::kU32: s.pod<uint32_t>(v); break;
    case GgufType::kI32: s.pod<int32_t>(v); break;
    case GgufType::kU64: s.pod<uint64_t>(static_cast<uint64_t>(v)); break;
    case GgufType::kI64: s.pod<int64_t>(v); break;
    case GgufType::kBool: s.pod<uint8_t>(v ? 1 : 0); break;
    default: return internal_error("write_int on non-integer type");
  }
  return Status();
}

Status write_value(ByteSink& s, const GgufValue& v, bool with_type);

Status write_array_body(ByteSink& s, const GgufValue& v) {
  GgufType et = v.array_type();
  s.pod<uint32_t>(static_cast<uint32_t>(et));
  s.pod<uint64_t>(v.array_size());
  if (const auto* strs = v.as_string_array()) {
    for (const auto& x : *strs) s.str(x);
  } else if (const auto* nested = v.as_nested_array()) {
    for (const auto& x : *nested) {
      if (!x.is_array()) return invalid_argument("nested GGUF array holds a non-array");
      DF_RETURN_IF_ERROR(write_array_body(s, x));
    }
  } else if (const auto* ints = v.as_int_array()) {
    for (int64_t x : *ints) DF_RETURN_IF_ERROR(write_int(s, et, x));
  } else {
    auto floats = v.as_float_array();
    for (double x : *floats) {
      if (et == GgufType::kF32) s.pod<float>(static_cast<float>(x));
      else s.pod<double>(x);
    }
  }
  return s.st;
}

Status write_value(ByteSink& s, const GgufValue& v, bool with_type) {
  if (with_type) s.pod<uint32_t>(static_cast<uint32_t>(v.type()));
  switch (v.type()) {
    case GgufType::kString: s.str(*v.as_string()); break;
    case GgufType::kArray: return write_array_body(s, v);
    case GgufType::kF32: s.pod<float>(static_cast<float>(*v.as_float())); break;
    case GgufType::kF64: s.pod<double>(*v.as_float()); break;
    case GgufType::kU64: s.pod<uint64_t>(*v.as_uint()); break;
    default: {
      auto i = v.type() == GgufType::kBool ? std::optional<int64_t>(*v.as_bool() ? 1 : 0) : v.as_int();
      DF_RETURN_IF_ERROR(write_int(s, v.type(), *i));
    }
  }
  return s.st;
}

}  // namespace

Status GgufWriter::write(const std::string& path) const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
    return invalid_argument("GGUF alignment {} is not a power of two", alignment_);
  return write_file_atomic(path, [&](std::FILE* f) -> Status {
    ByteSink s{f, 0, Status()};
    s.pod<uint32_t>(kMagic);
    s.pod<uint32_t>(3);
    s.pod<uint64_t>(tensors_.size());
    std::vector<std::pair<std::string, GgufValue>> kv = kv_;
    bool has_alignment = false;
    for (auto& [k, v] : kv)
      if (k == "general.alignment") {
        v = GgufValue::u32(static_cast<uint32_t>(alignment_));
        has_alignment = true;
      }
    if (!has_alignment && alignment_ != kGgufDefaultAlignment)
      kv.emplace_back("general.alignment", GgufValue::u32(static_cast<uint32_t>(alignment_)));
    s.pod<uint64_t>(kv.size());
    for (const auto& [k, v] : kv) {
      s.str(k);
      DF_RETURN_IF_ERROR(write_value(s, v, true).with_context(fmt::format("metadata '{}'", k)));
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      s.str(t.info.name);
      s.pod<uint32_t>(t.info.shape.size());
      for (uint64_t d : t.info.shape) s.pod<uint64_t>(d);
      s.pod<uint32_t>(static_cast<uint32_t>(t.info.type));
      s.pod<uint64_t>(offset);
      offset = align_up(offset + t.info.nbytes, alignment_);
    }
    s.pad_to(alignment_);
    for (const auto& t : tensors_) {
      DF_RETURN_IF_ERROR(s.st);
      long before = std::ftell(f);
      if (t.data) DF_RETURN_IF_ERROR(t.data(f).with_context(fmt::format("tensor '{}'", t.info.name)));
      long after = std::ftell(f);
      if (before >= 0 && after >= 0 && static_cast<uint64_t>(after - before) != t.info.nbytes)
        return internal_error("tensor '{}': data writer wrote {} bytes, expected {}", t.info.name, after - before,
                              t.info.nbytes);
      s.written += t.info.nbytes;
      s.pad_to(alignment_);
    }
    return s.st;
  });
}

}  // namespace dflash
