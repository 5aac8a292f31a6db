#include "state/snapshot_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "base/checked_math.h"
#include "base/file_io.h"
#include "base/mapped_file.h"
#include "formats/gguf.h"

namespace dflash {
namespace {

// What the file says it is (general.architecture), so GGUF tools show it for what it is.
constexpr std::string_view kArchitecture = "dflash_snapshot";
constexpr std::string_view kTempPrefix = ".dflash-snapshot-tmp.";
constexpr size_t kMaxModelIdBytes = 4096;
// The writer's data alignment (GgufWriter's default; general.alignment is never written).
constexpr uint64_t kAlignment = kGgufDefaultAlignment;
// GgufWriter writes this container version; v2 has the same layout but is not what we wrote.
constexpr uint32_t kGgufVersion = 3;

constexpr const char* kKeyArchitecture = "general.architecture";
constexpr const char* kKeyFormatVersion = "dflash.snapshot.format_version";
constexpr const char* kKeyModelId = "dflash.snapshot.model_id";
constexpr const char* kKeyModelBytes = "dflash.snapshot.model_bytes";
constexpr const char* kKeyModelMtime = "dflash.snapshot.model_mtime";
constexpr const char* kKeyLayoutHash = "dflash.snapshot.layout_hash";
constexpr const char* kKeyNCtx = "dflash.snapshot.n_ctx";
constexpr const char* kKeyTemplateHash = "dflash.snapshot.template_hash";
constexpr const char* kKeyNPast = "dflash.snapshot.n_past";
constexpr const char* kKeyTokens = "dflash.snapshot.tokens";
constexpr const char* kKeyTensorChecksums = "dflash.snapshot.tensor_checksums";
constexpr const char* kKeyHeaderChecksum = "dflash.snapshot.header_checksum";

// Every key a snapshot file holds, with its exact type (and element type for arrays): a file with any
// other key, or one of these with another type, is corrupt. A one-bit flip turns u64 into i64 or i32
// into u32 with the value bytes unchanged; exact types catch it.
struct KeySpec {
  const char* key;
  GgufType type;
  GgufType elem;  // arrays only
};
constexpr KeySpec kKeys[] = {
    {kKeyArchitecture, GgufType::kString, GgufType::kU8},
    {kKeyFormatVersion, GgufType::kU32, GgufType::kU8},
    {kKeyModelId, GgufType::kString, GgufType::kU8},
    {kKeyModelBytes, GgufType::kU64, GgufType::kU8},
    {kKeyModelMtime, GgufType::kI64, GgufType::kU8},
    {kKeyLayoutHash, GgufType::kU64, GgufType::kU8},
    {kKeyNCtx, GgufType::kI64, GgufType::kU8},
    {kKeyTemplateHash, GgufType::kU64, GgufType::kU8},
    {kKeyNPast, GgufType::kI64, GgufType::kU8},
    {kKeyTokens, GgufType::kArray, GgufType::kI32},
    {kKeyTensorChecksums, GgufType::kArray, GgufType::kU64},
    {kKeyHeaderChecksum, GgufType::kU64, GgufType::kU8},
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

// A name for an error message: hostile names can be long or hold control bytes.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 64) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

Status check_tensor_name(std::string_view name) {
  if (name.empty()) return invalid_argument("tensor name is empty");
  if (name.size() > kMaxSnapshotTensorName)
    return invalid_argument("tensor name '{}' is longer than {} bytes", printable(name), kMaxSnapshotTensorName);
  for (char c : name)
    if (!is_name_char(c))
      return invalid_argument("tensor name '{}' may hold only letters, digits, '.', '_' and '-'", printable(name));
  return Status();
}

// One tensor as the header checksum and the layout checks see it.
struct TensorEntry {
  std::string name;
  std::vector<uint64_t> ggml_shape;  // innermost first
  uint64_t checksum = 0;             // xxh64 (seed 0) of the f32 data bytes
};

uint64_t data_checksum(const void* data, size_t n) { return n == 0 ? XXH64("", 0, 0) : XXH64(data, n, 0); }

// xxh64 over a canonical serialization of everything the header says: format version, identity, n_past,
// tokens and the tensor list (names, shapes, data checksums). A flipped token id is caught by peek.
uint64_t header_checksum(uint32_t format_version, const SnapshotIdentity& id, int64_t n_past,
                         std::span<const int32_t> tokens, std::span<const TensorEntry> tensors) {
  std::vector<uint8_t> b;
  auto raw = [&](const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  };
  auto u64 = [&](uint64_t v) { raw(&v, sizeof v); };
  auto str = [&](std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  };
  b.reserve(256 + tokens.size() * 4 + tensors.size() * 96);
  str("dflash.snapshot.header");
  u64(format_version);
  str(id.model_id);
  u64(id.model_bytes);
  u64(static_cast<uint64_t>(id.model_mtime));
  u64(id.layout_hash);
  u64(static_cast<uint64_t>(id.n_ctx));
  u64(id.template_hash);
  u64(static_cast<uint64_t>(n_past));
  u64(tokens.size());
  raw(tokens.data(), tokens.size() * sizeof(int32_t));
  u64(tensors.size());
  for (const auto& t : tensors) {
    str(t.name);
    u64(t.ggml_shape.size());
    for (uint64_t d : t.ggml_shape) u64(d);
    u64(t.checksum);
  }
  return XXH64(b.data(), b.size(), 0);
}

Status check_identity(const SnapshotIdentity& id) {
  if (id.model_id.size() > kMaxModelIdBytes)
    return invalid_argument("snapshot model id is {} bytes (at most {})", id.model_id.size(), kMaxModelIdBytes);
  if (id.n_ctx < 0) return invalid_argument("snapshot n_ctx {} is negative", id.n_ctx);
  return Status();
}

Status check_positions(const SnapshotIdentity& id, int64_t n_past, size_t n_tokens) {
  if (n_past < 0) return invalid_argument("n_past {} is negative", n_past);
  if (static_cast<uint64_t>(n_past) != n_tokens)
    return invalid_argument("{} tokens for n_past {} (they must be equal)", n_tokens, n_past);
  if (id.n_ctx > 0 && n_past > id.n_ctx) return invalid_argument("n_past {} exceeds n_ctx {}", n_past, id.n_ctx);
  return Status();
}

// Bytes a metadata value takes in the file (the types of kKeys only).
uint64_t value_bytes(const GgufValue& v) {
  switch (v.type()) {
    case GgufType::kString: return 8 + v.as_string()->size();
    case GgufType::kU32: return 4;
    case GgufType::kArray: return 4 + 8 + v.array_size() * (v.array_type() == GgufType::kI32 ? 4 : 8);
    default: return 8;
  }
}

bool all_zero(std::span<const uint8_t> b) {
  for (uint8_t x : b)
    if (x != 0) return false;
  return true;
}

// A parsed container with its header checked (everything before the tensor data).
struct Container {
  GgufFile gguf;
  SnapshotFileInfo info;
  std::vector<TensorEntry> tensors;  // aligned with gguf.tensors()
};

// Checks every byte before the tensor data and the layout of the data section (offsets, size), without
// reading the data itself. Errors are kCorrupt except another format version (kUnsupported).
Result<Container> parse_container(std::span<const uint8_t> bytes) {
  auto parsed = GgufFile::parse(bytes);
  if (!parsed.ok()) return corrupt("{}", parsed.status().message());
  Container c{std::move(parsed).value(), {}, {}};
  const GgufFile& f = c.gguf;
  if (f.version() != kGgufVersion)
    return corrupt("GGUF container version {} (snapshot files are written as version {})", f.version(), kGgufVersion);

  const size_t n_keys = std::size(kKeys);
  if (f.metadata().size() != n_keys)
    return corrupt("{} metadata keys (a snapshot file has exactly {})", f.metadata().size(), n_keys);
  for (const KeySpec& k : kKeys) {
    const GgufValue* v = f.find(k.key);
    if (v == nullptr) return corrupt("metadata key '{}' is missing", k.key);
    if (v->type() != k.type)
      return corrupt("metadata '{}' is a {}, expected a {}", k.key, gguf_type_name(v->type()), gguf_type_name(k.type));
    if (k.type == GgufType::kArray && v->array_type() != k.elem)
      return corrupt("metadata '{}' is an array of {}, expected {}", k.key, gguf_type_name(v->array_type()),
                     gguf_type_name(k.elem));
  }
  if (*f.find(kKeyArchitecture)->as_string() != kArchitecture)
    return corrupt("general.architecture is '{}', not '{}'", printable(*f.find(kKeyArchitecture)->as_string()),
                   kArchitecture);
  const uint64_t version = *f.find(kKeyFormatVersion)->as_uint();
  if (version != kSnapshotFormatVersion)
    return unsupported("snapshot format version {} (this build reads version {})", version, kSnapshotFormatVersion);

  // The exact types are checked above, so these conversions cannot fail (u64 values are bit-cast).
  auto u64 = [&](const char* key) { return *f.find(key)->as_uint(); };
  auto i64 = [&](const char* key) { return *f.find(key)->as_int(); };
  SnapshotFileInfo& info = c.info;
  info.identity.model_id = *f.find(kKeyModelId)->as_string();
  info.identity.model_bytes = u64(kKeyModelBytes);
  info.identity.model_mtime = i64(kKeyModelMtime);
  info.identity.layout_hash = u64(kKeyLayoutHash);
  info.identity.n_ctx = i64(kKeyNCtx);
  info.identity.template_hash = u64(kKeyTemplateHash);
  info.n_past = i64(kKeyNPast);
  const std::vector<int64_t>& tokens = *f.find(kKeyTokens)->as_int_array();
  info.tokens.reserve(tokens.size());
  for (int64_t t : tokens) info.tokens.push_back(static_cast<int32_t>(t));  // i32 elements: they fit
  info.file_bytes = bytes.size();
  if (Status st = check_identity(info.identity); !st.ok()) return corrupt("{}", st.message());
  if (Status st = check_positions(info.identity, info.n_past, info.tokens.size()); !st.ok())
    return corrupt("{}", st.message());

  const std::vector<int64_t>& checksums = *f.find(kKeyTensorChecksums)->as_int_array();
  if (checksums.size() != f.tensors().size())
    return corrupt("{} tensor checksums for {} tensors", checksums.size(), f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    if (Status st = check_tensor_name(t.name); !st.ok()) return corrupt("{}", st.message());
    if (t.type != DType::kF32) return corrupt("tensor '{}' is not f32", t.name);
    if (t.name == kSnapshotLogitsTensor && t.shape.size() != 1)
      return corrupt("tensor '{}' has {} dimensions, expected 1", t.name, t.shape.size());
    c.tensors.push_back({t.name, t.shape, static_cast<uint64_t>(checksums[i])});
  }
  const uint64_t stored = u64(kKeyHeaderChecksum);
  const uint64_t computed =
      header_checksum(static_cast<uint32_t>(version), info.identity, info.n_past, info.tokens, c.tensors);
  if (stored != computed)
    return corrupt("header checksum mismatch (stored {:016x}, computed {:016x})", stored, computed);

  // Layout: every byte of the file is a header field, zero padding, or tensor data at the offset the
  // writer gives it; nothing trails. (The parser consumed exactly this header, the types being known.)
  uint64_t header_end = 4 + 4 + 8 + 8;
  for (const auto& [key, v] : f.metadata()) header_end += 8 + key.size() + 4 + value_bytes(v);
  for (const auto& t : f.tensors()) header_end += 8 + t.name.size() + 4 + 8 * t.shape.size() + 4 + 8;
  if (f.data_offset() != align_up(header_end, kAlignment) || f.data_offset() > bytes.size())
    return corrupt("data section at offset {} does not follow the {}-byte header", f.data_offset(), header_end);
  if (!all_zero(bytes.subspan(header_end, f.data_offset() - header_end)))
    return corrupt("padding after the header is not zero");
  uint64_t end = 0;
  for (const auto& t : f.tensors()) {
    if (t.offset != end) return corrupt("tensor '{}' at data offset {}, expected {}", t.name, t.offset, end);
    end = align_up(t.offset + t.nbytes, kAlignment);  // in bounds: the parser checked offset + nbytes
  }
  if (bytes.size() != f.data_offset() + end)
    return corrupt("file is {} bytes, its header describes {}", bytes.size(), f.data_offset() + end);
  return c;
}

bool same_or_note(std::string& why, const char* field, const auto& got, const auto& want) {
  if (got == want) return true;
  if (why.empty()) why = fmt::format("{} is {}, expected {}", field, got, want);
  return false;
}

Status check_expected(const SnapshotIdentity& got, const SnapshotIdentity& want) {
  if (got == want) return Status();
  std::string why;
  if (got.model_id != want.model_id)
    why = fmt::format("model_id is '{}', expected '{}'", printable(got.model_id), printable(want.model_id));
  same_or_note(why, "model_bytes", got.model_bytes, want.model_bytes);
  same_or_note(why, "model_mtime", got.model_mtime, want.model_mtime);
  same_or_note(why, "layout_hash", got.layout_hash, want.layout_hash);
  same_or_note(why, "n_ctx", got.n_ctx, want.n_ctx);
  same_or_note(why, "template_hash", got.template_hash, want.template_hash);
  return not_found("snapshot belongs to another model or configuration: {}", why);
}

Result<Snapshot> read_bytes(std::span<const uint8_t> bytes, const SnapshotIdentity& expected) {
  DF_ASSIGN_OR_RETURN(Container c, parse_container(bytes));
  DF_RETURN_IF_ERROR(check_expected(c.info.identity, expected));
  const GgufFile& f = c.gguf;
  Snapshot snap;
  snap.tokens = std::move(c.info.tokens);
  snap.n_past = c.info.n_past;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    const uint64_t gap_begin = f.data_offset() + t.offset + t.nbytes;
    const uint64_t gap_end = f.data_offset() + align_up(t.offset + t.nbytes, kAlignment);
    if (!all_zero(bytes.subspan(gap_begin, gap_end - gap_begin)))
      return corrupt("padding after tensor '{}' is not zero", t.name);
    std::span<const uint8_t> data = f.tensor_data(t);
    const uint64_t sum = data_checksum(data.data(), data.size());
    if (sum != c.tensors[i].checksum)
      return corrupt("tensor '{}' checksum mismatch (stored {:016x}, computed {:016x})", t.name, c.tensors[i].checksum,
                     sum);
    std::vector<float> values(t.nbytes / sizeof(float));  // at most the file's size
    if (!data.empty()) std::memcpy(values.data(), data.data(), data.size());
    if (t.name == kSnapshotLogitsTensor) {
      snap.last_logits = std::move(values);
      continue;
    }
    SnapshotTensor st;
    st.name = t.name;
    st.shape.assign(t.shape.rbegin(), t.shape.rend());  // ggml order is innermost first
    st.data = std::move(values);
    snap.tensors.push_back(std::move(st));
  }
  return snap;
}

// Maps `path` for reading: kNotFound when it does not exist.
Result<MappedFile> map_snapshot(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return not_found("snapshot '{}' does not exist", path);
    return io_error("cannot stat snapshot '{}': {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return corrupt("snapshot '{}' is not a regular file", path);
  return MappedFile::open(path);
}

Status with_label(const Status& st, std::string_view label) {
  return st.with_context(fmt::format("snapshot '{}'", label));
}

Status fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open directory '{}' to fsync it: {}", dir, std::strerror(errno));
  Status st;
  if (::fsync(fd) != 0) st = io_error("cannot fsync directory '{}': {}", dir, std::strerror(errno));
  ::close(fd);
  return st;
}

// Builds the GGUF of a snapshot; the writer refers to `snap`'s data, which must outlive it.
Status build_writer(const Snapshot& snap, const SnapshotIdentity& id, GgufWriter& w) {
  DF_RETURN_IF_ERROR(check_identity(id));
  DF_RETURN_IF_ERROR(check_positions(id, snap.n_past, snap.tokens.size()));
  std::vector<TensorEntry> entries;
  entries.reserve(snap.tensors.size() + 1);
  auto add = [&](const std::string& name, std::vector<uint64_t> ggml_shape, const std::vector<float>& data) {
    std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
    entries.push_back({name, ggml_shape, data_checksum(bytes.data(), bytes.size())});
    return w.add_tensor(name, DType::kF32, std::move(ggml_shape), bytes);  // refuses duplicate names
  };
  for (const SnapshotTensor& t : snap.tensors) {
    DF_RETURN_IF_ERROR(check_tensor_name(t.name));
    if (t.name == kSnapshotLogitsTensor)
      return invalid_argument("tensor name '{}' is reserved for the logits", kSnapshotLogitsTensor);
    if (t.shape.empty() || t.shape.size() > kGgufMaxDims)
      return invalid_argument("tensor '{}' has {} dimensions (1 to {} allowed)", t.name, t.shape.size(), kGgufMaxDims);
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return invalid_argument("tensor '{}' has a negative dimension {}", t.name, d);
      auto p = checked_mul(n, static_cast<uint64_t>(d));
      if (!p) return invalid_argument("tensor '{}' element count overflows", t.name);
      n = *p;
    }
    if (n != t.data.size())
      return invalid_argument("tensor '{}' shape holds {} elements, its data {}", t.name, n, t.data.size());
    DF_RETURN_IF_ERROR(add(t.name, std::vector<uint64_t>(t.shape.rbegin(), t.shape.rend()), t.data));
  }
  if (!snap.last_logits.empty())
    DF_RETURN_IF_ERROR(add(std::string(kSnapshotLogitsTensor), {snap.last_logits.size()}, snap.last_logits));

  std::vector<int64_t> tokens(snap.tokens.begin(), snap.tokens.end());
  std::vector<int64_t> checksums;
  for (const auto& e : entries) checksums.push_back(static_cast<int64_t>(e.checksum));
  w.set(kKeyArchitecture, GgufValue::string(std::string(kArchitecture)));
  w.set(kKeyFormatVersion, GgufValue::u32(kSnapshotFormatVersion));
  w.set(kKeyModelId, GgufValue::string(id.model_id));
  w.set(kKeyModelBytes, GgufValue::u64(id.model_bytes));
  w.set(kKeyModelMtime, GgufValue::i64(id.model_mtime));
  w.set(kKeyLayoutHash, GgufValue::u64(id.layout_hash));
  w.set(kKeyNCtx, GgufValue::i64(id.n_ctx));
  w.set(kKeyTemplateHash, GgufValue::u64(id.template_hash));
  w.set(kKeyNPast, GgufValue::i64(snap.n_past));
  w.set(kKeyTokens, GgufValue::int_array(GgufType::kI32, std::move(tokens)));
  w.set(kKeyTensorChecksums, GgufValue::int_array(GgufType::kU64, std::move(checksums)));
  w.set(kKeyHeaderChecksum,
        GgufValue::u64(header_checksum(kSnapshotFormatVersion, id, snap.n_past, snap.tokens, entries)));
  return Status();
}

}  // namespace

Status check_snapshot_file_name(std::string_view name) {
  if (name.empty()) return invalid_argument("snapshot file name is empty");
  if (name.size() > kMaxSnapshotFileName)
    return invalid_argument("snapshot file name '{}' is longer than {} bytes", printable(name), kMaxSnapshotFileName);
  if (name.front() == '.')
    return invalid_argument("snapshot file name '{}' starts with '.' (reserved for temporary files)", printable(name));
  for (char c : name)
    if (!is_name_char(c))
      return invalid_argument("snapshot file name '{}' may hold only letters, digits, '.', '_' and '-' (not a path)",
                              printable(name));
  return Status();
}

bool is_snapshot_temp_name(std::string_view file_name) { return file_name.starts_with(kTempPrefix); }

Status write_snapshot_file(const std::string& dir, const std::string& name, const Snapshot& snap,
                           const SnapshotIdentity& id) {
  const std::string path = path_join(dir, name);
  DF_RETURN_IF_ERROR(check_snapshot_file_name(name));
  GgufWriter w;
  DF_RETURN_IF_ERROR(build_writer(snap, id, w).with_context(fmt::format("writing snapshot '{}'", path)));
  if (!is_directory(dir)) {
    if (!file_exists(dir)) return not_found("snapshot directory '{}' does not exist", dir);
    return invalid_argument("snapshot directory '{}' is not a directory", dir);
  }

  // GgufWriter::write is atomic within the private directory (0700: nobody else can open what is in it
  // before it gets mode 0600); the rename out of it is the atomic step that publishes the file.
  std::string tmpl = path_join(dir, std::string(kTempPrefix) + "XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr)
    return io_error("cannot create a temporary directory in '{}': {}", dir, std::strerror(errno));
  const std::string tmp_dir = tmpl;
  const std::string tmp_file = path_join(tmp_dir, name);
  Status st = w.write(tmp_file);
  if (st.ok() && ::chmod(tmp_file.c_str(), 0600) != 0)
    st = io_error("cannot chmod '{}': {}", tmp_file, std::strerror(errno));
  if (st.ok() && std::rename(tmp_file.c_str(), path.c_str()) != 0)
    st = io_error("cannot rename '{}' to '{}': {}", tmp_file, path, std::strerror(errno));
  if (st.ok()) st = fsync_directory(dir);
  std::error_code ec;
  std::filesystem::remove_all(tmp_dir, ec);  // empty after the rename; a partial file otherwise
  if (!st.ok()) return st.with_context(fmt::format("writing snapshot '{}'", path));
  return Status();
}

Result<SnapshotFileInfo> peek_snapshot_bytes(std::span<const uint8_t> bytes) {
  auto c = parse_container(bytes);
  if (!c.ok()) return with_label(c.status(), "<memory>");
  return std::move(c->info);
}

Result<Snapshot> read_snapshot_bytes(std::span<const uint8_t> bytes, const SnapshotIdentity& expected) {
  auto snap = read_bytes(bytes, expected);
  if (!snap.ok()) return with_label(snap.status(), "<memory>");
  return snap;
}

Result<SnapshotFileInfo> peek_snapshot_file(const std::string& path) {
  DF_ASSIGN_OR_RETURN(MappedFile map, map_snapshot(path));
  auto c = parse_container(map.bytes());
  if (!c.ok()) return with_label(c.status(), path);
  return std::move(c->info);
}

Result<Snapshot> read_snapshot_file(const std::string& path, const SnapshotIdentity& expected) {
  DF_ASSIGN_OR_RETURN(MappedFile map, map_snapshot(path));
  auto snap = read_bytes(map.bytes(), expected);
  if (!snap.ok()) return with_label(snap.status(), path);
  return snap;
}

Result<int> remove_stale_snapshot_temps(const std::string& dir, int64_t min_age_seconds) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> stale;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  fs::directory_iterator it(dir, ec);
  if (ec) return io_error("cannot list snapshot directory '{}': {}", dir, ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return io_error("cannot list snapshot directory '{}': {}", dir, ec.message());
    const fs::path p = it->path();
    if (!is_snapshot_temp_name(p.filename().string())) continue;
    // The newest mtime of the entry and what is in it: a live writer's file keeps changing.
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) continue;  // gone already
    int64_t newest = st.st_mtime;
    if (S_ISDIR(st.st_mode)) {
      fs::directory_iterator inner(p, ec);
      for (; !ec && inner != fs::directory_iterator(); inner.increment(ec)) {
        struct stat ist {};
        if (::lstat(inner->path().c_str(), &ist) == 0) newest = std::max<int64_t>(newest, ist.st_mtime);
      }
      ec.clear();
    }
    if (now - newest >= min_age_seconds) stale.push_back(p);
  }
  int removed = 0;
  for (const fs::path& p : stale) {
    fs::remove_all(p, ec);  // a symbolic link is removed, never followed
    if (ec) return io_error("cannot remove stale temporary '{}': {}", p.string(), ec.message());
    ++removed;
  }
  return removed;
}

}  // namespace dflash
