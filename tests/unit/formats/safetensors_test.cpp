// safetensors reader/writer: valid files, sharded directories, and hostile input.
#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/file_io.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

// Raw file bytes: u64 LE length of `header`, the header, then `data_bytes` bytes (or a forced length).
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes = 0,
                              std::optional<uint64_t> forced_len = std::nullopt) {
  uint64_t n = forced_len.value_or(header.size());
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<uint8_t>(i);
  return out;
}

Status parse_status(const std::vector<uint8_t>& bytes) { return SafetensorsFile::parse(bytes).status(); }

void expect_error(const std::vector<uint8_t>& bytes, ErrorCode code, const std::string& needle) {
  Status st = parse_status(bytes);
  ASSERT_FALSE(st.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  ASSERT_TRUE(write_file_atomic(path, bytes).ok());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A one-tensor file named `name` holding `n` floats of value `v`.
void write_single(const std::string& path, const std::string& name, size_t n, float v) {
  std::vector<float> vals(n, v);
  auto b = bytes_of(vals);
  ASSERT_TRUE(write_safetensors(path, {{name, SafetensorsDType::kF32, {n}, b}}).ok());
}

TEST(Safetensors, written_file_reads_back_with_shapes_dtypes_data_and_metadata) {
  std::string dir = test::scratch_dir();
  std::string path = dir + "/t.safetensors";
  auto a = bytes_of({1, 2, 3, 4, 5, 6});
  std::vector<uint8_t> b = {0x80, 0x3f, 0x00, 0x40};  // two bf16 values
  std::vector<uint8_t> s = {7, 0, 0, 0, 0, 0, 0, 0};  // i64 scalar
  ASSERT_TRUE(write_safetensors(path,
                                {{"model.a", SafetensorsDType::kF32, {2, 3}, a},
                                 {"model.b", SafetensorsDType::kBF16, {2}, b},
                                 {"scalar", SafetensorsDType::kI64, {}, s}},
                                {{"format", "pt"}})
                  .ok());

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->data_offset() % 8, 0u);
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");

  const SafetensorsTensor* ta = f->find("model.a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, SafetensorsDType::kF32);
  EXPECT_EQ(ta->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(ta->n_elements(), 6u);
  EXPECT_EQ(ta->nbytes, 24u);
  ASSERT_EQ(ta->data.size(), 24u);
  EXPECT_EQ(std::memcmp(ta->data.data(), a.data(), 24), 0);
  EXPECT_EQ(ta->offset, f->data_offset());  // first in file order

  const SafetensorsTensor* tb = f->find("model.b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, SafetensorsDType::kBF16);
  EXPECT_EQ(std::vector<uint8_t>(tb->data.begin(), tb->data.end()), b);
  EXPECT_EQ(safetensors_to_dtype(tb->dtype).value(), DType::kBF16);

  const SafetensorsTensor* ts = f->find("scalar");
  ASSERT_NE(ts, nullptr);
  EXPECT_TRUE(ts->shape.empty());
  EXPECT_EQ(ts->n_elements(), 1u);
  EXPECT_EQ(ts->data[0], 7);
  EXPECT_EQ(f->find("missing"), nullptr);

  // Tensors come back in data-offset order.
  for (size_t i = 1; i < f->tensors().size(); ++i) EXPECT_LT(f->tensors()[i - 1].offset, f->tensors()[i].offset);
}

TEST(Safetensors, in_memory_parse_accepts_a_minimal_file_and_an_empty_header) {
  auto ok = raw_file(R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4);
  auto f = SafetensorsFile::parse(ok);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->tensors()[0].data.size(), 4u);
  EXPECT_TRUE(SafetensorsFile::parse(raw_file("{}")).ok());
  EXPECT_TRUE(SafetensorsFile::parse(raw_file("{}     ")).ok());  // space padding
}

TEST(Safetensors, zero_size_tensors_are_allowed_and_overlap_nothing) {
  auto bytes = raw_file(
      R"({"e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      8);
  auto f = SafetensorsFile::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->find("e")->nbytes, 0u);
}

TEST(Safetensors, short_files_and_bad_header_lengths_are_rejected) {
  expect_error({}, ErrorCode::kCorrupt, "8-byte header length");
  expect_error({1, 2, 3, 4, 5, 6, 7}, ErrorCode::kCorrupt, "8-byte header length");
  expect_error(raw_file("{}", 0, uint64_t{1} << 40), ErrorCode::kCorrupt, "exceeds");
  expect_error(raw_file("{}", 0, ~uint64_t{0}), ErrorCode::kCorrupt, "exceeds");
  expect_error(raw_file("{}", 0, 1000), ErrorCode::kCorrupt, "runs past the end");
  expect_error(raw_file("{}", 0, 0), ErrorCode::kCorrupt, "too small");
}

TEST(Safetensors, invalid_json_headers_are_rejected) {
  expect_error(raw_file("{\"x\": "), ErrorCode::kCorrupt, "invalid JSON");
  expect_error(raw_file("{\"x\":1}garbage"), ErrorCode::kCorrupt, "invalid JSON");
  expect_error(raw_file("[1,2]"), ErrorCode::kCorrupt, "does not start with");
  expect_error(raw_file(std::string("{\"a\":\"\xff\xfe\"}")), ErrorCode::kCorrupt, "invalid JSON");  // bad UTF-8
  std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_error(raw_file(deep), ErrorCode::kCorrupt, "nests deeper");
}

TEST(Safetensors, tensor_entries_are_checked_field_by_field) {
  expect_error(raw_file(R"({"x":5})"), ErrorCode::kCorrupt, "not an object");
  expect_error(raw_file(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt, "no \"dtype\"");
  expect_error(raw_file(R"({"x":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt, "not a string");
  expect_error(raw_file(R"({"x":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", 1), ErrorCode::kUnsupported,
               "unknown dtype 'F4'");
  expect_error(raw_file(R"({"x":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4), ErrorCode::kUnsupported,
               "unknown dtype");
  expect_error(raw_file(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt, "no \"shape\"");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":5,"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               "not an array");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               "non-negative integer");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               "non-negative integer");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               "non-negative integer");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
               ErrorCode::kCorrupt, "dimensions");
  expect_error(raw_file(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               "empty name");
}

TEST(Safetensors, shape_overflow_is_rejected) {
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4),
               ErrorCode::kCorrupt, "overflows the element count");
  expect_error(raw_file(R"({"x":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4),
               ErrorCode::kCorrupt, "overflows the byte size");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}})", 4),
               ErrorCode::kCorrupt, "non-negative integer");  // > u64: parsed as a float
}

TEST(Safetensors, data_offsets_must_be_in_range_and_match_the_shape) {
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1]}})", 4), ErrorCode::kCorrupt, "no \"data_offsets\"");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), ErrorCode::kCorrupt,
               "pair of non-negative integers");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4), ErrorCode::kCorrupt,
               "pair of non-negative integers");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4), ErrorCode::kCorrupt,
               "pair of non-negative integers");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8), ErrorCode::kCorrupt,
               "end before they begin");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 3), ErrorCode::kCorrupt,
               "run past");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})", 4),
               ErrorCode::kCorrupt, "run past");
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8), ErrorCode::kCorrupt,
               "needs 8");
}

TEST(Safetensors, overlapping_tensors_are_rejected) {
  expect_error(raw_file(
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   12),
               ErrorCode::kCorrupt, "overlap");
  expect_error(raw_file(
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                   8),
               ErrorCode::kCorrupt, "overlap");
}

TEST(Safetensors, metadata_must_be_a_map_of_strings) {
  expect_error(raw_file(R"({"__metadata__":{"format":1}})"), ErrorCode::kCorrupt, "not a string");
  expect_error(raw_file(R"({"__metadata__":["pt"]})"), ErrorCode::kCorrupt, "not an object of strings");
  auto f = SafetensorsFile::parse(raw_file(R"({"__metadata__":{"format":"pt","x":"y"}})"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->metadata().size(), 2u);
}

TEST(Safetensors, fp8_and_integer_types_are_recorded_but_not_computed_with) {
  auto f = SafetensorsFile::parse(raw_file(
      R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]},"m":{"dtype":"BOOL","shape":[2],"data_offsets":[4,6]}})",
      6));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto d = safetensors_to_dtype(f->find("w")->dtype);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(d.status().message().find("F8_E4M3"), std::string::npos);
  EXPECT_FALSE(safetensors_to_dtype(f->find("m")->dtype).ok());
  EXPECT_EQ(safetensors_to_dtype(SafetensorsDType::kI64).value(), DType::kI64);
  EXPECT_EQ(safetensors_from_dtype(DType::kF16).value(), SafetensorsDType::kF16);
  EXPECT_FALSE(safetensors_from_dtype(DType::kQ4_K).ok());
}

TEST(Safetensors, every_truncation_and_byte_flip_of_a_valid_file_parses_or_fails_cleanly) {
  std::string dir = test::scratch_dir();
  std::string path = dir + "/t.safetensors";
  auto a = bytes_of({1, 2, 3, 4});
  ASSERT_TRUE(write_safetensors(path, {{"a", SafetensorsDType::kF32, {2, 2}, a}, {"b", SafetensorsDType::kF32, {4}, a}},
                                {{"format", "pt"}})
                  .ok());
  auto full = read_text_file(path).value();
  std::vector<uint8_t> bytes(full.begin(), full.end());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    EXPECT_FALSE(SafetensorsFile::parse(prefix).ok()) << "prefix of " << n << " bytes";
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t x : {0x01, 0x80, 0xff}) {
      auto copy = bytes;
      copy[i] ^= x;
      auto r = SafetensorsFile::parse(copy);  // must not crash; either outcome is fine
      if (r.ok()) {
        for (const auto& t : r->tensors()) EXPECT_LE(t.offset + t.nbytes, copy.size());
      }
    }
  }
}

TEST(Safetensors, writer_rejects_bad_input) {
  std::string dir = test::scratch_dir();
  auto a = bytes_of({1, 2});
  EXPECT_EQ(write_safetensors(dir + "/x", {{"a", SafetensorsDType::kF32, {3}, a}}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(write_safetensors(dir + "/x", {{"a", SafetensorsDType::kF32, {2}, a}, {"a", SafetensorsDType::kF32, {2}, a}})
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(write_safetensors(dir + "/x", {{"", SafetensorsDType::kF32, {2}, a}}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(write_safetensors(dir + "/x", {{"__metadata__", SafetensorsDType::kF32, {2}, a}}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(file_exists(dir + "/x"));
}

// ---- directories

TEST(SafetensorsModel, single_file_directory) {
  std::string dir = test::scratch_dir();
  write_single(dir + "/model.safetensors", "model.norm.weight", 4, 1.0f);
  auto m = SafetensorsModel::open_dir(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE(m->sharded());
  EXPECT_EQ(m->tensor_count(), 1u);
  ASSERT_NE(m->find("model.norm.weight"), nullptr);
  EXPECT_EQ(m->total_bytes(), 16u);
  EXPECT_EQ(m->find("nope"), nullptr);
}

void make_sharded(const std::string& dir) {
  std::vector<float> v1(4, 1.0f), v2(8, 2.0f), v3(2, 3.0f);
  auto b1 = bytes_of(v1), b2 = bytes_of(v2), b3 = bytes_of(v3);
  ASSERT_TRUE(write_safetensors(dir + "/model-00001-of-00002.safetensors",
                                {{"model.embed_tokens.weight", SafetensorsDType::kF32, {2, 2}, b1},
                                 {"model.layers.0.mlp.up_proj.weight", SafetensorsDType::kF32, {2, 4}, b2}})
                  .ok());
  ASSERT_TRUE(
      write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"lm_head.weight", SafetensorsDType::kF32, {2}, b3}})
          .ok());
  ASSERT_TRUE(write_safetensors_index(dir + "/model.safetensors.index.json",
                                      {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                                       {"model.layers.0.mlp.up_proj.weight", "model-00001-of-00002.safetensors"},
                                       {"lm_head.weight", "model-00002-of-00002.safetensors"}},
                                      56)
                  .ok());
}

TEST(SafetensorsModel, sharded_directory_finds_tensors_across_shards) {
  std::string dir = test::scratch_dir();
  make_sharded(dir);
  auto m = SafetensorsModel::open_dir(dir);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->sharded());
  EXPECT_EQ(m->files().size(), 2u);
  EXPECT_EQ(m->tensor_count(), 3u);
  const SafetensorsTensor* head = m->find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  float x = 0;
  std::memcpy(&x, head->data.data(), 4);
  EXPECT_EQ(x, 3.0f);
  EXPECT_NE(m->file_of("lm_head.weight")->path().find("00002"), std::string::npos);
  EXPECT_EQ(m->tensor_names(),
            (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"}));
  EXPECT_EQ(m->total_bytes(), 56u);

  // open() takes the directory, the index or a single shard.
  EXPECT_TRUE(SafetensorsModel::open(dir).ok());
  EXPECT_EQ(SafetensorsModel::open(dir + "/model.safetensors.index.json")->tensor_count(), 3u);
  EXPECT_EQ(SafetensorsModel::open(dir + "/model-00002-of-00002.safetensors")->tensor_count(), 1u);
}

TEST(SafetensorsModel, index_shard_names_cannot_leave_the_directory) {
  std::string dir = test::scratch_dir();
  fs::create_directories(dir + "/model");
  write_single(dir + "/outside.safetensors", "x", 1, 1.0f);
  for (const char* bad : {"../outside.safetensors", "/etc/passwd", "./x.safetensors", "a//b.safetensors", "",
                          "sub/../../outside.safetensors", "..", "a\\\\b"}) {
    write_text(dir + "/model/model.safetensors.index.json",
               std::string(R"({"weight_map":{"x":")") + bad + R"("}})");
    auto m = SafetensorsModel::open_dir(dir + "/model");
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), ErrorCode::kCorrupt) << m.status().to_string();
    EXPECT_NE(m.status().message().find("not a relative path"), std::string::npos) << m.status().to_string();
  }
}

TEST(SafetensorsModel, symlinked_shards_are_followed) {
  // The HF hub cache keeps snapshots as symlinks into a blobs directory.
  std::string dir = test::scratch_dir();
  fs::create_directories(dir + "/blobs");
  fs::create_directories(dir + "/snap");
  write_single(dir + "/blobs/abc123", "w", 2, 5.0f);
  fs::create_symlink("../blobs/abc123", dir + "/snap/model.safetensors");
  auto m = SafetensorsModel::open_dir(dir + "/snap");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_NE(m->find("w"), nullptr);
}

TEST(SafetensorsModel, broken_indexes_give_clear_errors) {
  std::string dir = test::scratch_dir();
  make_sharded(dir);
  std::string index = dir + "/model.safetensors.index.json";
  auto check = [&](const std::string& text, ErrorCode code, const std::string& needle) {
    write_text(index, text);
    auto m = SafetensorsModel::open_dir(dir);
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), code) << m.status().to_string();
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().to_string();
  };
  check("{", ErrorCode::kCorrupt, "invalid JSON");
  check("[]", ErrorCode::kCorrupt, "not an object");
  check(R"({"metadata":{}})", ErrorCode::kCorrupt, "no \"weight_map\"");
  check(R"({"weight_map":[]})", ErrorCode::kCorrupt, "not an object");
  check(R"({"weight_map":{}})", ErrorCode::kCorrupt, "empty");
  check(R"({"weight_map":{"x":3}})", ErrorCode::kCorrupt, "not a file name");
  check(R"({"weight_map":{"x":"model-00003-of-00003.safetensors"}})", ErrorCode::kNotFound, "does not exist");
  check(R"({"weight_map":{"lm_head.weight":"model-00001-of-00002.safetensors"}})", ErrorCode::kCorrupt,
        "has no such tensor");

  // The same tensor in two shards.
  std::vector<float> v(2, 1.0f);
  auto b = bytes_of(v);
  ASSERT_TRUE(write_safetensors(dir + "/dup.safetensors", {{"lm_head.weight", SafetensorsDType::kF32, {2}, b}}).ok());
  check(R"({"weight_map":{"lm_head.weight":"model-00002-of-00002.safetensors","x":"dup.safetensors"}})",
        ErrorCode::kCorrupt, "appears in both");

  // A corrupt shard reports the shard's path.
  write_bytes(dir + "/bad.safetensors", {1, 2, 3});
  check(R"({"weight_map":{"x":"bad.safetensors"}})", ErrorCode::kCorrupt, "bad.safetensors");
}

TEST(SafetensorsModel, directories_without_weights_are_not_found) {
  std::string dir = test::scratch_dir();
  auto m = SafetensorsModel::open_dir(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(m.status().message().find("model.safetensors"), std::string::npos);
  EXPECT_EQ(SafetensorsModel::open_dir(dir + "/nope").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace dflash
