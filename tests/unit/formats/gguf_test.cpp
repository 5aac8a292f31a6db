// GGUF reader and writer: round trips, ggml's own reader and writer as oracle, and hostile files.
#include "formats/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "base/file_io.h"
#include "support/ggml_oracle.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::read_bytes;

GgufWriter sample_writer() {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("qwen3"));
  w.set("general.name", GgufValue::string("tiny ünïcode ✓"));
  w.set("k.u8", GgufValue::u8(250));
  w.set("k.i8", GgufValue::i8(-7));
  w.set("k.u16", GgufValue::u16(65000));
  w.set("k.i16", GgufValue::i16(-30000));
  w.set("k.u32", GgufValue::u32(4000000000u));
  w.set("k.i32", GgufValue::i32(-2000000000));
  w.set("k.u64", GgufValue::u64(18000000000000000000ull));
  w.set("k.i64", GgufValue::i64(-9000000000000000000ll));
  w.set("k.f32", GgufValue::f32(0.15625f));
  w.set("k.f64", GgufValue::f64(-1e300));
  w.set("k.bool", GgufValue::boolean(true));
  w.set("k.strs", GgufValue::string_array({"a", "", "bc d", "\xe4\xb8\xad"}));
  w.set("k.i32s", GgufValue::int_array(GgufType::kI32, {1, -2, 3}));
  w.set("k.bools", GgufValue::int_array(GgufType::kBool, {1, 0, 1}));
  w.set("k.f32s", GgufValue::float_array(GgufType::kF32, {0.5, -2.25}));
  w.set("k.nested", GgufValue::nested_array({GgufValue::int_array(GgufType::kU8, {1, 2}),
                                             GgufValue::string_array({"x"})}));
  return w;
}

TEST(Gguf, RoundTripKeepsEveryValueTypeAndTensorBytes) {
  GgufWriter w = sample_writer();
  std::vector<float> a(64);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  std::vector<uint8_t> q(2 * sizeof(BlockQ8_0), 0x11);
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {16, 4}, {reinterpret_cast<uint8_t*>(a.data()), a.size() * 4}).ok());
  ASSERT_TRUE(w.add_tensor("q", DType::kQ8_0, {64}, q).ok());
  std::string path = test::scratch_dir() + "/rt.gguf";
  ASSERT_TRUE(w.write(path).ok());

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), 18u);
  EXPECT_EQ(f->metadata()[0].first, "general.architecture");  // file order kept
  EXPECT_EQ(*f->find("general.name")->as_string(), "tiny ünïcode ✓");
  EXPECT_EQ(*f->find("k.u8")->as_int(), 250);
  EXPECT_EQ(*f->find("k.i8")->as_int(), -7);
  EXPECT_EQ(*f->find("k.u16")->as_int(), 65000);
  EXPECT_EQ(*f->find("k.i16")->as_int(), -30000);
  EXPECT_EQ(*f->find("k.u32")->as_int(), 4000000000ll);
  EXPECT_EQ(*f->find("k.i32")->as_int(), -2000000000);
  EXPECT_EQ(*f->find("k.u64")->as_uint(), 18000000000000000000ull);
  EXPECT_FALSE(f->find("k.u64")->as_int().has_value());  // does not fit an int64
  EXPECT_EQ(*f->find("k.i64")->as_int(), -9000000000000000000ll);
  EXPECT_EQ(*f->find("k.f32")->as_float(), 0.15625);
  EXPECT_EQ(*f->find("k.f64")->as_float(), -1e300);
  EXPECT_EQ(*f->find("k.bool")->as_bool(), true);
  EXPECT_EQ(*f->find("k.strs")->as_string_array(), (std::vector<std::string>{"a", "", "bc d", "\xe4\xb8\xad"}));
  EXPECT_EQ(*f->find("k.i32s")->as_int_array(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->find("k.bools")->array_type(), GgufType::kBool);
  EXPECT_EQ(*f->find("k.f32s")->as_float_array(), (std::vector<double>{0.5, -2.25}));
  ASSERT_NE(f->find("k.nested")->as_nested_array(), nullptr);
  EXPECT_EQ(*f->find("k.nested")->as_nested_array()->at(1).as_string_array(), std::vector<std::string>{"x"});
  GgufWriter expected = sample_writer();
  for (const auto& [key, value] : f->metadata()) EXPECT_EQ(value, *expected.find(key)) << key;

  ASSERT_EQ(f->tensors().size(), 2u);
  const auto* ta = f->find_tensor("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<uint64_t>{16, 4}));
  EXPECT_EQ(ta->nbytes, 256u);
  auto da = f->tensor_data(*ta);
  EXPECT_EQ(std::memcmp(da.data(), a.data(), 256), 0);
  const auto* tq = f->find_tensor("q");
  ASSERT_NE(tq, nullptr);
  EXPECT_EQ(tq->type, DType::kQ8_0);
  EXPECT_EQ(tq->offset % 32, 0u);
  EXPECT_EQ(f->tensor_data(*tq)[5], 0x11);
}

TEST(Gguf, WriterRejectsImpossibleTensors) {
  GgufWriter w;
  std::vector<uint8_t> d(34);
  EXPECT_FALSE(w.add_tensor("x", DType::kQ8_0, {33}, d).ok());         // not a whole block
  EXPECT_FALSE(w.add_tensor("x", DType::kQ8_0, {64}, d).ok());         // wrong byte count
  EXPECT_FALSE(w.add_tensor("", DType::kF32, {1}, std::span<const uint8_t>()).ok());
  EXPECT_FALSE(w.add_tensor("x", DType::kF32, {1, 1, 1, 1, 1}, std::span<const uint8_t>()).ok());
  ASSERT_TRUE(w.add_tensor("x", DType::kQ8_0, {32}, d).ok());
  EXPECT_FALSE(w.add_tensor("x", DType::kQ8_0, {32}, d).ok());         // duplicate
  GgufWriter bad;
  bad.set("v", GgufValue::int_array(GgufType::kU8, {300}));
  EXPECT_FALSE(bad.write(test::scratch_dir() + "/bad.gguf").ok());
}

TEST(Gguf, CustomAlignmentIsWrittenAndHonoured) {
  GgufWriter w;
  w.set_alignment(64);
  std::vector<uint8_t> d(4 * 3, 1);
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {3}, d).ok());
  ASSERT_TRUE(w.add_tensor("b", DType::kF32, {3}, d).ok());
  std::string path = test::scratch_dir() + "/al.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->find_tensor("b")->offset, 64u);
}

// ---- hostile files: every mutation yields an error Status, never a crash

std::vector<uint8_t> sample_bytes() {
  GgufWriter w = sample_writer();
  std::vector<uint8_t> d(4 * 8, 7);
  EXPECT_TRUE(w.add_tensor("t", DType::kF32, {8}, d).ok());
  std::string path = test::scratch_dir() + "/s.gguf";
  EXPECT_TRUE(w.write(path).ok());
  return read_bytes(path);
}

TEST(GgufHostile, EveryTruncationIsAnErrorNamingTheProblem) {
  auto bytes = sample_bytes();
  ASSERT_TRUE(GgufFile::parse(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = GgufFile::parse(std::span<const uint8_t>(bytes.data(), n));
    ASSERT_FALSE(r.ok()) << "truncated to " << n << " bytes parsed";
    EXPECT_FALSE(r.status().message().empty());
  }
}

TEST(GgufHostile, BadMagicVersionAndCounts) {
  auto bytes = sample_bytes();
  auto mutate = [&](size_t off, const void* v, size_t n) {
    auto b = bytes;
    std::memcpy(b.data() + off, v, n);
    return GgufFile::parse(b);
  };
  uint32_t x = 0x46554746;
  EXPECT_NE(mutate(0, &x, 4).status().message().find("not a GGUF"), std::string::npos);
  x = 1;
  EXPECT_NE(mutate(4, &x, 4).status().message().find("version 1"), std::string::npos);
  x = 0x03000000;
  EXPECT_NE(mutate(4, &x, 4).status().message().find("big-endian"), std::string::npos);
  uint64_t big = 1ull << 60;
  EXPECT_NE(mutate(8, &big, 8).status().message().find("tensor count"), std::string::npos);
  EXPECT_NE(mutate(16, &big, 8).status().message().find("metadata count"), std::string::npos);
  // A key length that runs past the end.
  EXPECT_FALSE(mutate(24, &big, 8).ok());
}

TEST(GgufHostile, RandomByteFlipsNeverCrash) {
  auto bytes = sample_bytes();
  std::mt19937_64 rng(std::random_device{}());
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = bytes;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    auto r = GgufFile::parse(b);
    if (r.ok()) {
      for (const auto& t : r->tensors()) {
        auto d = r->tensor_data(t);
        ASSERT_LE(d.data() + d.size(), b.data() + b.size());
      }
    }
  }
}

TEST(GgufHostile, TensorPastEndAndMisalignedOffsets) {
  GgufWriter w;
  std::vector<uint8_t> d(16, 0);
  ASSERT_TRUE(w.add_tensor("t", DType::kF32, {4}, d).ok());
  std::string path = test::scratch_dir() + "/t.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto bytes = read_bytes(path);
  // The tensor's offset field is the last 8 bytes before the padded data section; find it by value 0 after type.
  ASSERT_TRUE(GgufFile::parse(bytes).ok());
  // Layout: header(24), no metadata, name(8+1), n_dims(4), dims(8), type(4), offset(8).
  size_t offset_field = 24 + 8 + 1 + 4 + 8 + 4;
  uint64_t misaligned = 4;
  auto b = bytes;
  std::memcpy(b.data() + offset_field, &misaligned, 8);
  EXPECT_NE(GgufFile::parse(b).status().message().find("not aligned"), std::string::npos);
  uint64_t far = 1ull << 40;
  std::memcpy(b.data() + offset_field, &far, 8);
  EXPECT_NE(GgufFile::parse(b).status().message().find("past the end"), std::string::npos);
  uint32_t unknown_type = 99;
  b = bytes;
  std::memcpy(b.data() + offset_field - 4, &unknown_type, 4);
  EXPECT_NE(GgufFile::parse(b).status().message().find("type id 99"), std::string::npos);
}

TEST(GgufHostile, OpenReportsMissingFileAndDirectory) {
  EXPECT_EQ(GgufFile::open("/nonexistent/x.gguf").status().code(), ErrorCode::kIo);
  EXPECT_FALSE(GgufFile::open(test::scratch_dir()).ok());
}

// ---- ggml's own GGUF implementation as the oracle

struct GgufInitParams {
  bool no_alloc;
  void** ctx;
};

TEST(GgufOracle, GgmlReadsWhatWeWrite) {
  std::string why;
  auto* o = test::GgmlOracle::get(&why);
  if (!o) DF_SKIP_LOUDLY(why);
  auto init = o->fn<void* (*)(const char*, GgufInitParams)>("gguf_init_from_file");
  auto n_kv = o->fn<int64_t (*)(void*)>("gguf_get_n_kv");
  auto get_key = o->fn<const char* (*)(void*, int64_t)>("gguf_get_key");
  auto find_key = o->fn<int64_t (*)(void*, const char*)>("gguf_find_key");
  auto get_str = o->fn<const char* (*)(void*, int64_t)>("gguf_get_val_str");
  auto get_u64 = o->fn<uint64_t (*)(void*, int64_t)>("gguf_get_val_u64");
  auto arr_n = o->fn<size_t (*)(void*, int64_t)>("gguf_get_arr_n");
  auto arr_str = o->fn<const char* (*)(void*, int64_t, size_t)>("gguf_get_arr_str");
  auto n_tensors = o->fn<int64_t (*)(void*)>("gguf_get_n_tensors");
  auto tensor_offset = o->fn<size_t (*)(void*, int64_t)>("gguf_get_tensor_offset");
  auto data_offset = o->fn<size_t (*)(void*)>("gguf_get_data_offset");
  auto gfree = o->fn<void (*)(void*)>("gguf_free");
  ASSERT_TRUE(init && n_kv && get_key && find_key && get_str && get_u64 && arr_n && arr_str && n_tensors &&
              tensor_offset && data_offset && gfree);

  GgufWriter w = sample_writer();
  w.remove("k.nested");  // ggml rejects nested arrays; our reader accepts them
  std::vector<uint8_t> d1(4 * 5, 1), d2(sizeof(BlockQ4_K), 2);
  ASSERT_TRUE(w.add_tensor("t1", DType::kF32, {5}, d1).ok());
  ASSERT_TRUE(w.add_tensor("t2", DType::kQ4_K, {256}, d2).ok());
  std::string path = test::scratch_dir() + "/o.gguf";
  ASSERT_TRUE(w.write(path).ok());

  void* ctx = init(path.c_str(), GgufInitParams{true, nullptr});
  ASSERT_NE(ctx, nullptr) << "ggml refused a file we wrote";
  auto ours = GgufFile::open(path);
  ASSERT_TRUE(ours.ok());
  ASSERT_EQ(n_kv(ctx), static_cast<int64_t>(ours->metadata().size()));
  for (int64_t i = 0; i < n_kv(ctx); ++i) EXPECT_EQ(get_key(ctx, i), ours->metadata()[i].first);
  EXPECT_STREQ(get_str(ctx, find_key(ctx, "general.name")), "tiny ünïcode ✓");
  EXPECT_EQ(get_u64(ctx, find_key(ctx, "k.u64")), 18000000000000000000ull);
  int64_t strs = find_key(ctx, "k.strs");
  ASSERT_EQ(arr_n(ctx, strs), 4u);
  EXPECT_STREQ(arr_str(ctx, strs, 3), "\xe4\xb8\xad");
  ASSERT_EQ(n_tensors(ctx), 2);
  EXPECT_EQ(data_offset(ctx), ours->data_offset());
  EXPECT_EQ(tensor_offset(ctx, 1), ours->find_tensor("t2")->offset);
  gfree(ctx);
}

TEST(GgufOracle, WeReadWhatGgmlWrites) {
  std::string why;
  auto* o = test::GgmlOracle::get(&why);
  if (!o) DF_SKIP_LOUDLY(why);
  auto init_empty = o->fn<void* (*)()>("gguf_init_empty");
  auto set_str = o->fn<void (*)(void*, const char*, const char*)>("gguf_set_val_str");
  auto set_u32 = o->fn<void (*)(void*, const char*, uint32_t)>("gguf_set_val_u32");
  auto set_f32 = o->fn<void (*)(void*, const char*, float)>("gguf_set_val_f32");
  auto set_bool = o->fn<void (*)(void*, const char*, bool)>("gguf_set_val_bool");
  auto set_arr_str = o->fn<void (*)(void*, const char*, const char**, size_t)>("gguf_set_arr_str");
  auto set_arr_data = o->fn<void (*)(void*, const char*, int, const void*, size_t)>("gguf_set_arr_data");
  auto write = o->fn<bool (*)(void*, const char*, bool)>("gguf_write_to_file");
  auto gfree = o->fn<void (*)(void*)>("gguf_free");
  ASSERT_TRUE(init_empty && set_str && set_u32 && set_f32 && set_bool && set_arr_str && set_arr_data && write && gfree);
  void* ctx = init_empty();
  set_str(ctx, "general.architecture", "qwen35");
  set_u32(ctx, "qwen35.block_count", 64);
  set_f32(ctx, "qwen35.rope.freq_base", 1e7f);
  set_bool(ctx, "flag", true);
  const char* toks[] = {"<|im_start|>", "Ġhello", ""};
  set_arr_str(ctx, "tokenizer.ggml.tokens", toks, 3);
  int32_t sections[] = {11, 11, 10, 0};
  set_arr_data(ctx, "qwen35.rope.dimension_sections", 5 /* GGUF_TYPE_INT32 */, sections, 4);
  std::string path = test::scratch_dir() + "/g.gguf";
  ASSERT_TRUE(write(ctx, path.c_str(), false));
  gfree(ctx);

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_string("general.architecture").value(), "qwen35");
  EXPECT_EQ(*f->get_int("qwen35.block_count").value(), 64);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->get_float("qwen35.rope.freq_base").value()), 1e7f);
  EXPECT_EQ(*f->get_bool("flag").value(), true);
  EXPECT_EQ(*f->find("tokenizer.ggml.tokens")->as_string_array(),
            (std::vector<std::string>{"<|im_start|>", "Ġhello", ""}));
  EXPECT_EQ(*f->find("qwen35.rope.dimension_sections")->as_int_array(), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_FALSE(f->get_int("general.architecture").ok());  // present with the wrong type: an error, not "absent"
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

TEST(Gguf, ReadsVersion2Files) {
  // v2 and v3 share the layout (v3 only added the big-endian marker): a v3 file relabelled v2 must load.
  auto bytes = sample_bytes();
  uint32_t v2 = 2;
  std::memcpy(bytes.data() + 4, &v2, 4);
  auto f = GgufFile::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(*f->find("k.i64")->as_int(), -9000000000000000000ll);
  EXPECT_EQ(f->tensor_data(*f->find_tensor("t"))[0], 7);
}

}  // namespace
}  // namespace dflash
