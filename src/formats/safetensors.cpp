#include "formats/safetensors.h"

#include <algorithm>
#include <array>
#include <set>

#include <fmt/ranges.h>

#include "base/checked_math.h"
#include "base/file_io.h"
#include "formats/untrusted_json.h"

namespace dflash {
namespace {

struct DTypeRow {
  SafetensorsDType type;
  std::string_view name;
  uint32_t size;
};

constexpr std::array<DTypeRow, 16> kDTypes = {{
    {SafetensorsDType::kBool, "BOOL", 1},
    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},
    {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},
    {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},
    {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
    {SafetensorsDType::kF8_E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kF8_E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8_E8M0, "F8_E8M0", 1},
}};

constexpr const char* kMetadataKey = "__metadata__";
constexpr size_t kMaxIndexJsonBytes = size_t{64} << 20;
constexpr size_t kMaxShards = 100000;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A shard name from index.json must name a file inside the model directory.
bool is_plain_relative_path(std::string_view p) {
  if (p.empty() || p.size() > 4096 || p.front() == '/') return false;
  if (p.find('\0') != std::string_view::npos || p.find('\\') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    std::string_view part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDType t) {
  for (const auto& r : kDTypes)
    if (r.type == t) return r.name;
  return "unknown";
}

std::optional<SafetensorsDType> safetensors_dtype_from_name(std::string_view name) {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.type;
  return std::nullopt;
}

uint32_t safetensors_dtype_size(SafetensorsDType t) {
  for (const auto& r : kDTypes)
    if (r.type == t) return r.size;
  return 0;
}

Result<DType> safetensors_to_dtype(SafetensorsDType t) {
  switch (t) {
    case SafetensorsDType::kF32: return DType::kF32;
    case SafetensorsDType::kF16: return DType::kF16;
    case SafetensorsDType::kBF16: return DType::kBF16;
    case SafetensorsDType::kF64: return DType::kF64;
    case SafetensorsDType::kI8: return DType::kI8;
    case SafetensorsDType::kI16: return DType::kI16;
    case SafetensorsDType::kI32: return DType::kI32;
    case SafetensorsDType::kI64: return DType::kI64;
    case SafetensorsDType::kF8_E4M3:
    case SafetensorsDType::kF8_E5M2:
    case SafetensorsDType::kF8_E8M0:
      return unsupported("safetensors dtype {} (FP8) is not supported; use a BF16/F16/F32 checkpoint",
                         safetensors_dtype_name(t));
    default:
      return unsupported("safetensors dtype {} has no tensor type in dflash", safetensors_dtype_name(t));
  }
}

Result<SafetensorsDType> safetensors_from_dtype(DType t) {
  switch (t) {
    case DType::kF32: return SafetensorsDType::kF32;
    case DType::kF16: return SafetensorsDType::kF16;
    case DType::kBF16: return SafetensorsDType::kBF16;
    case DType::kF64: return SafetensorsDType::kF64;
    case DType::kI8: return SafetensorsDType::kI8;
    case DType::kI16: return SafetensorsDType::kI16;
    case DType::kI32: return SafetensorsDType::kI32;
    case DType::kI64: return SafetensorsDType::kI64;
    default: return unsupported("dtype {} cannot be stored in safetensors", dtype_name(t));
  }
}

uint64_t SafetensorsTensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // checked at parse time
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reader

class SafetensorsParser {
 public:
  SafetensorsParser(SafetensorsFile& f, std::string_view name) : f_(f), name_(name) {}

  Status parse() {
    auto bytes = f_.bytes_;
    if (bytes.size() < 8)
      return corrupt("{}: file is {} bytes; a safetensors file starts with an 8-byte header length", name_,
                     bytes.size());
    uint64_t n = read_u64_le(bytes.data());
    if (n < 2) return corrupt("{}: header length {} is too small for a JSON object", name_, n);
    if (n > kSafetensorsMaxHeaderBytes)
      return corrupt("{}: header length {} exceeds the {} byte limit", name_, n, kSafetensorsMaxHeaderBytes);
    if (n > bytes.size() - 8)
      return corrupt("{}: header length {} runs past the end of the {}-byte file", name_, n, bytes.size());
    f_.header_size_ = n;
    data_size_ = bytes.size() - 8 - n;

    std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
    if (text.front() != '{') return corrupt("{}: header does not start with '{{'", name_);
    DF_ASSIGN_OR_RETURN(nlohmann::json header,
                        parse_untrusted_json(text, fmt::format("{}: safetensors header", name_)));
    if (!header.is_object()) return corrupt("{}: header is a JSON {}, not an object", name_, json_type_name(header));

    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == kMetadataKey) {
        DF_RETURN_IF_ERROR(parse_metadata(it.value()));
      } else {
        DF_RETURN_IF_ERROR(parse_tensor(it.key(), it.value()));
      }
    }
    return check_layout();
  }

 private:
  Status parse_metadata(const nlohmann::json& m) {
    if (!m.is_object())
      return corrupt("{}: \"__metadata__\" is a JSON {}, not an object of strings", name_, json_type_name(m));
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_string())
        return corrupt("{}: \"__metadata__\" value for '{}' is a JSON {}, not a string", name_, it.key(),
                       json_type_name(it.value()));
      f_.metadata_[it.key()] = it.value().get<std::string>();
    }
    return Status();
  }

  Status parse_tensor(const std::string& tname, const nlohmann::json& t) {
    if (tname.empty()) return corrupt("{}: a tensor has an empty name", name_);
    if (!t.is_object()) return corrupt("{}: tensor '{}' is a JSON {}, not an object", name_, tname, json_type_name(t));
    SafetensorsTensor out;
    out.name = tname;

    auto dt = t.find("dtype");
    if (dt == t.end()) return corrupt("{}: tensor '{}' has no \"dtype\"", name_, tname);
    if (!dt->is_string()) return corrupt("{}: tensor '{}' \"dtype\" is not a string", name_, tname);
    const std::string& dts = dt->get_ref<const std::string&>();
    auto parsed = safetensors_dtype_from_name(dts);
    if (!parsed)
      return unsupported("{}: tensor '{}' has unknown dtype '{}'", name_, tname, dts.substr(0, 32));
    out.dtype = *parsed;

    auto sh = t.find("shape");
    if (sh == t.end()) return corrupt("{}: tensor '{}' has no \"shape\"", name_, tname);
    if (!sh->is_array()) return corrupt("{}: tensor '{}' \"shape\" is not an array", name_, tname);
    if (sh->size() > kSafetensorsMaxDims)
      return corrupt("{}: tensor '{}' has {} dimensions; at most {} are supported", name_, tname, sh->size(),
                     kSafetensorsMaxDims);
    uint64_t elems = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        return corrupt("{}: tensor '{}' shape entry {} is not a non-negative integer", name_, tname, d.dump());
      uint64_t v = d.get<uint64_t>();
      out.shape.push_back(v);
      auto e = checked_mul(elems, v);
      if (!e) return corrupt("{}: tensor '{}' shape {} overflows the element count", name_, tname, sh->dump());
      elems = *e;
    }
    auto nbytes = checked_mul(elems, safetensors_dtype_size(out.dtype));
    if (!nbytes)
      return corrupt("{}: tensor '{}' shape {} of {} overflows the byte size", name_, tname,
                     shape_string(out.shape), dts);

    auto off = t.find("data_offsets");
    if (off == t.end()) return corrupt("{}: tensor '{}' has no \"data_offsets\"", name_, tname);
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      return corrupt("{}: tensor '{}' \"data_offsets\" is not a pair of non-negative integers", name_, tname);
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end)
      return corrupt("{}: tensor '{}' data_offsets [{}, {}] end before they begin", name_, tname, begin, end);
    if (end > data_size_)
      return corrupt("{}: tensor '{}' data_offsets [{}, {}] run past the {}-byte data section", name_, tname,
                     begin, end, data_size_);
    if (end - begin != *nbytes)
      return corrupt("{}: tensor '{}' data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", name_, tname,
                     begin, end, end - begin, shape_string(out.shape), dts, *nbytes);
    out.offset = f_.data_offset() + begin;
    out.nbytes = *nbytes;
    out.data = f_.bytes_.subspan(out.offset, out.nbytes);
    f_.tensors_.push_back(std::move(out));
    return Status();
  }

  // Byte ranges must not overlap (zero-size tensors overlap nothing).
  Status check_layout() {
    auto& ts = f_.tensors_;
    std::sort(ts.begin(), ts.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
    });
    const SafetensorsTensor* prev = nullptr;
    for (const auto& t : ts) {
      if (t.nbytes == 0) continue;
      if (prev != nullptr && t.offset < prev->offset + prev->nbytes)
        return corrupt("{}: tensors '{}' and '{}' overlap in the data section", name_, prev->name, t.name);
      prev = &t;
    }
    for (size_t i = 0; i < ts.size(); ++i) f_.index_.emplace(ts[i].name, i);
    return Status();
  }

  SafetensorsFile& f_;
  std::string_view name_;
  uint64_t data_size_ = 0;
};

Result<SafetensorsFile> SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string name) {
  SafetensorsFile f;
  f.bytes_ = bytes;
  f.path_ = std::move(name);
  SafetensorsParser p(f, f.path_);
  DF_RETURN_IF_ERROR(p.parse());
  return f;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  DF_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  SafetensorsFile f;
  f.map_ = std::move(map);
  f.bytes_ = f.map_.bytes();
  f.path_ = path;
  SafetensorsParser p(f, f.path_);
  DF_RETURN_IF_ERROR(p.parse());
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Directories

Status SafetensorsModel::add_file(SafetensorsFile file) {
  size_t fi = files_.size();
  for (size_t ti = 0; ti < file.tensors().size(); ++ti) {
    const std::string& name = file.tensors()[ti].name;
    auto [it, inserted] = index_.emplace(name, std::make_pair(fi, ti));
    if (!inserted)
      return corrupt("tensor '{}' appears in both '{}' and '{}'", name, files_[it->second.first].path(),
                     file.path());
  }
  files_.push_back(std::move(file));
  return Status();
}

Result<SafetensorsModel> SafetensorsModel::open_index(const std::string& index_path) {
  SafetensorsModel m;
  m.dir_ = parent_dir(index_path);
  m.sharded_ = true;
  DF_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path, kMaxIndexJsonBytes));
  DF_ASSIGN_OR_RETURN(nlohmann::json j, parse_untrusted_json(text, index_path));
  if (!j.is_object()) return corrupt("{}: top level is a JSON {}, not an object", index_path, json_type_name(j));
  auto wm = j.find("weight_map");
  if (wm == j.end()) return corrupt("{}: no \"weight_map\"", index_path);
  if (!wm->is_object()) return corrupt("{}: \"weight_map\" is a JSON {}, not an object", index_path, json_type_name(*wm));

  std::vector<std::string> shards;  // in first-mention order
  std::set<std::string> seen;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      return corrupt("{}: weight_map entry for '{}' is a JSON {}, not a file name", index_path, it.key(),
                     json_type_name(it.value()));
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!is_plain_relative_path(shard))
      return corrupt("{}: weight_map entry for '{}' names shard '{}', which is not a relative path inside the "
                     "model directory",
                     index_path, it.key(), shard.substr(0, 256));
    if (seen.insert(shard).second) shards.push_back(shard);
  }
  if (shards.empty()) return corrupt("{}: \"weight_map\" is empty", index_path);
  if (shards.size() > kMaxShards)
    return corrupt("{}: {} shards exceed the limit of {}", index_path, shards.size(), kMaxShards);

  std::map<std::string, size_t> shard_file;  // shard name -> index in files_
  for (const auto& shard : shards) {
    std::string p = path_join(m.dir_, shard);
    if (!file_exists(p))
      return not_found("{}: shard '{}' is listed in the weight_map but '{}' does not exist", index_path, shard, p);
    auto f = SafetensorsFile::open(p);
    if (!f.ok()) return f.status();
    shard_file[shard] = m.files_.size();
    DF_RETURN_IF_ERROR(m.add_file(std::move(f).value()));
  }
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string& shard = it.value().get_ref<const std::string&>();
    const SafetensorsFile& f = m.files_[shard_file[shard]];
    if (f.find(it.key()) == nullptr)
      return corrupt("{}: weight_map puts '{}' in '{}', but that shard has no such tensor", index_path, it.key(),
                     shard);
  }
  return m;
}

Result<SafetensorsModel> SafetensorsModel::open_dir(const std::string& dir) {
  if (!is_directory(dir)) return not_found("'{}' is not a directory", dir);
  std::string index = path_join(dir, kIndexFileName);
  if (file_exists(index)) return open_index(index);
  std::string single = path_join(dir, kSingleFileName);
  if (!file_exists(single))
    return not_found("'{}' has neither {} nor {}", dir, kSingleFileName, kIndexFileName);
  SafetensorsModel m;
  m.dir_ = dir;
  DF_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single));
  DF_RETURN_IF_ERROR(m.add_file(std::move(f)));
  return m;
}

Result<SafetensorsModel> SafetensorsModel::open(const std::string& path) {
  if (is_directory(path)) return open_dir(path);
  if (ends_with(path, ".json")) return open_index(path);
  SafetensorsModel m;
  m.dir_ = parent_dir(path);
  DF_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
  DF_RETURN_IF_ERROR(m.add_file(std::move(f)));
  return m;
}

const SafetensorsTensor* SafetensorsModel::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  return &files_[it->second.first].tensors()[it->second.second];
}

const SafetensorsFile* SafetensorsModel::file_of(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &files_[it->second.first];
}

std::vector<std::string> SafetensorsModel::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, loc] : index_) names.push_back(name);
  return names;
}

uint64_t SafetensorsModel::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_)
    for (const auto& t : f.tensors()) total += t.nbytes;
  return total;
}

// ---------------------------------------------------------------------------------------------
// Writer

Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) return invalid_argument("invalid tensor name '{}'", t.name);
    if (!names.insert(t.name).second) return invalid_argument("tensor '{}' is listed twice", t.name);
    if (t.shape.size() > kSafetensorsMaxDims)
      return invalid_argument("tensor '{}' has {} dimensions; at most {}", t.name, t.shape.size(), kSafetensorsMaxDims);
    uint64_t elems = 1;
    for (uint64_t d : t.shape) {
      auto e = checked_mul(elems, d);
      if (!e) return invalid_argument("tensor '{}' shape overflows", t.name);
      elems = *e;
    }
    auto nbytes = checked_mul(elems, safetensors_dtype_size(t.dtype));
    if (!nbytes || *nbytes != t.data.size())
      return invalid_argument("tensor '{}': shape {} of {} needs {} bytes, got {}", t.name, shape_string(t.shape),
                              safetensors_dtype_name(t.dtype), nbytes.value_or(0), t.data.size());
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + *nbytes}}};
    offset += *nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const std::exception& e) {  // invalid UTF-8 in a name
    return invalid_argument("cannot encode safetensors header: {}", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  return write_file_atomic(path, [&](std::FILE* f) -> Status {
    DF_RETURN_IF_ERROR(write_all(f, len, sizeof(len)));
    DF_RETURN_IF_ERROR(write_all(f, text.data(), text.size()));
    for (const auto& t : tensors) DF_RETURN_IF_ERROR(write_all(f, t.data.data(), t.data.size()));
    return Status();
  });
}

Status write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size) {
  nlohmann::json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const std::exception& e) {
    return invalid_argument("cannot encode safetensors index: {}", e.what());
  }
  return write_file_atomic(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace dflash
