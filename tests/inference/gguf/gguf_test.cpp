// GGUF reader and writer: round trips, load modes, row ranges, typed getters, and a table of
// corrupt files that must each fail with the named error (never a crash).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "inference/gguf/gguf.hpp"
#include "inference/gguf/writer.hpp"

namespace tessera::inference::gguf {
namespace {

// Raw little-endian GGUF bytes, built by hand so a test can break exactly one field.
struct raw {
  std::vector<std::byte> b;
  template <class T>
  raw& put(T v) {
    auto o = b.size();
    b.resize(o + sizeof v);
    std::memcpy(b.data() + o, &v, sizeof v);
    return *this;
  }
  raw& str(std::string_view s) {
    put<std::uint64_t>(s.size());
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    return *this;
  }
  raw& pad_to(std::size_t align) {
    while (b.size() % align) b.push_back(std::byte{0});
    return *this;
  }
  raw& zeros(std::size_t n) {
    b.resize(b.size() + n);
    return *this;
  }
};

struct raw_tensor {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type;
  std::uint64_t offset;
};

// A header with one u32 key and the given tensors, padded, followed by `data_bytes` of data.
raw make_raw(const std::vector<raw_tensor>& tensors, std::size_t data_bytes,
             std::uint32_t version = 3) {
  raw r;
  r.put<std::uint32_t>(magic).put<std::uint32_t>(version);
  r.put<std::uint64_t>(tensors.size()).put<std::uint64_t>(1);
  r.str("general.architecture").put<std::uint32_t>(8).str("llama");
  for (const auto& t : tensors) {
    r.str(t.name).put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) r.put<std::uint64_t>(d);
    r.put<std::uint32_t>(t.type).put<std::uint64_t>(t.offset);
  }
  r.pad_to(32).zeros(data_bytes);
  return r;
}

result<file> parse_raw(const raw& r) { return file::parse(r.b, "model.gguf"); }

::testing::AssertionResult fails_with(const result<file>& f, errc code, std::string_view needle) {
  if (f) return ::testing::AssertionFailure() << "parsed fine, expected: " << needle;
  if (f.error().code != code)
    return ::testing::AssertionFailure() << "code " << to_string(f.error().code) << ": "
                                         << f.error().message;
  if (f.error().message.find(needle) == std::string::npos)
    return ::testing::AssertionFailure() << "message '" << f.error().message << "' lacks '"
                                         << needle << "'";
  if (f.error().message.rfind("model.gguf: ", 0) != 0)
    return ::testing::AssertionFailure() << "message does not name the file: " << f.error().message;
  return ::testing::AssertionSuccess();
}

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& x : v) x = static_cast<std::byte>(rng() & 0xff);
  return v;
}

// A writer with every value type and one tensor of every supported type.
writer full_writer(std::uint32_t alignment = default_alignment) {
  writer w(alignment);
  w.set("general.architecture", value::str("llama"));
  w.set("k.u8", {value_type::u8, std::uint64_t{200}});
  w.set("k.i8", {value_type::i8, std::int64_t{-100}});
  w.set("k.u16", {value_type::u16, std::uint64_t{60000}});
  w.set("k.i16", {value_type::i16, std::int64_t{-30000}});
  w.set("k.u32", value::u32(4000000000u));
  w.set("k.i32", value::i32(-2000000000));
  w.set("k.u64", value::u64(1ull << 60));
  w.set("k.i64", {value_type::i64, std::int64_t{-(1ll << 60)}});
  w.set("k.f32", value::f32(0.5f));
  w.set("k.f64", value::f64(1e-300));
  w.set("k.bool", value::boolean(true));
  w.set("k.str", value::str("héllo ▁wörld"));
  w.set("k.strs", value::arr(string_array({"a", "", "<0x0A>", "▁the"})));
  w.set("k.f32s", value::arr(f32_array({1.5f, -2.25f})));
  w.set("k.i32s", value::arr(i32_array({-1, 7})));
  array nested;
  nested.elem_type = value_type::array;
  nested.arrays.push_back(value::arr(i32_array({1, 2, 3})));
  nested.arrays.push_back(value::arr(string_array({"x"})));
  w.set("k.nested", value::arr(std::move(nested)));
  unsigned seed = 1;
  for (auto [name, type, cols, rows] :
       std::vector<std::tuple<std::string, tensor_type, std::uint64_t, std::uint64_t>>{
           {"t.f32", tensor_type::f32, 7, 3},   {"t.f16", tensor_type::f16, 5, 2},
           {"t.bf16", tensor_type::bf16, 3, 1}, {"t.q8_0", tensor_type::q8_0, 64, 3},
           {"t.q4_0", tensor_type::q4_0, 32, 2}, {"t.q4_k", tensor_type::q4_k, 256, 2},
           {"t.q6_k", tensor_type::q6_k, 512, 1}}) {
    auto rb = bytes_of(type, cols);
    auto bytes = random_bytes(*rb * rows, seed++);
    EXPECT_TRUE(w.add_tensor(name, type, {cols, rows}, bytes));
  }
  return w;
}

std::string temp_path(std::string_view tag) {
  auto dir = std::filesystem::temp_directory_path();
  return (dir / fmt::format("tessera_gguf_{}_{}.gguf", tag, ::getpid())).string();
}

// ---- failure paths -----------------------------------------------------------------------------

TEST(GgufCorrupt, TruncatedAtEverySectionBoundary) {
  writer w = full_writer();
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes);
  auto good = file::parse(*bytes, "model.gguf");
  ASSERT_TRUE(good) << good.error().message;
  // Boundaries: inside the fixed header, after it, inside metadata, at the end of the tensor
  // infos, at the data start and inside/at the end of every tensor. All must fail, naming why.
  std::vector<std::size_t> cuts = {0, 3, 4, 8, 16, 23, 24, 40, 100, 300};
  cuts.push_back(good->data_offset() - 1);
  for (const auto& t : good->tensors()) {
    cuts.push_back(t.offset);
    cuts.push_back(t.offset + t.size / 2);
    cuts.push_back(t.offset + t.size - 1);
  }
  for (std::size_t cut : cuts) {
    ASSERT_LT(cut, bytes->size());
    auto f = file::parse(std::span(bytes->data(), cut), "model.gguf");
    ASSERT_FALSE(f) << "cut at " << cut;
    EXPECT_EQ(f.error().code, errc::corrupt) << f.error().message;
    const auto& m = f.error().message;
    EXPECT_TRUE(m.find("truncated") != std::string::npos ||
                m.find("extends past end of file") != std::string::npos ||
                m.find("too small") != std::string::npos)
        << "cut at " << cut << ": " << m;
  }
}

TEST(GgufCorrupt, BadMagicAndVersion) {
  auto r = make_raw({}, 0);
  std::memcpy(r.b.data(), "GGML", 4);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "not a GGUF file"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({}, 0, 4)), errc::unsupported, "unsupported GGUF version 4"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({}, 0, 1)), errc::unsupported, "unsupported GGUF version 1"));
}

TEST(GgufCorrupt, AbsurdCounts) {
  auto r = make_raw({}, 0);
  std::uint64_t huge = 1ull << 40;
  std::memcpy(r.b.data() + 8, &huge, 8);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "absurd tensor count"));
  r = make_raw({}, 0);
  std::memcpy(r.b.data() + 16, &huge, 8);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "absurd metadata count"));
  // A plausible metadata count with too few bytes behind it: truncated, not an allocation.
  r = raw{};
  r.put<std::uint32_t>(magic).put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(60000);
  r.str("a").put<std::uint32_t>(4).put<std::uint32_t>(1);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "truncated"));
  // Key length (at offset 24) absurd.
  r = make_raw({}, 0);
  std::memcpy(r.b.data() + 24, &huge, 8);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "absurd length"));
}

TEST(GgufCorrupt, MetadataValues) {
  auto header = [](std::uint64_t n_kv) {
    raw r;
    r.put<std::uint32_t>(magic).put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(n_kv);
    return r;
  };
  raw r = header(1);
  r.str("k").put<std::uint32_t>(13).put<std::uint32_t>(0);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "metadata key k has unknown value type 13"));
  r = header(1);
  r.str("k").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(1ull << 40);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "absurd array length"));
  r = header(1);
  r.str("k").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(1000).put<std::uint32_t>(1);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "truncated while reading array of metadata key k"));
  r = header(1);
  r.str("k").put<std::uint32_t>(8).put<std::uint64_t>(1ull << 62);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "absurd length"));
  r = header(1);
  r.str("k").put<std::uint32_t>(7).put<std::uint8_t>(2);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "boolean byte 2"));
  r = header(2);
  r.str("k").put<std::uint32_t>(4).put<std::uint32_t>(1).str("k").put<std::uint32_t>(4).put<std::uint32_t>(2);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "duplicate metadata key k"));
  r = header(1);  // arrays nested deeper than the limit
  r.str("deep").put<std::uint32_t>(9);
  for (int i = 0; i < 6; ++i) r.put<std::uint32_t>(9).put<std::uint64_t>(1);
  r.put<std::uint32_t>(4).put<std::uint64_t>(0);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "nests arrays deeper"));
  r = header(1);
  r.str("general.alignment").put<std::uint32_t>(4).put<std::uint32_t>(48);
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "general.alignment 48 is not a power of two"));
  r = header(1);
  r.str("general.alignment").put<std::uint32_t>(8).str("32");
  EXPECT_TRUE(fails_with(parse_raw(r), errc::corrupt, "general.alignment has type string"));
}

TEST(GgufCorrupt, TensorInfos) {
  const std::uint32_t f32 = 0, q8 = 8;
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"blk.0.attn_q.weight", {4, 4}, 13, 0}}, 64)),
                         errc::unsupported, "tensor blk.0.attn_q.weight has type q5_K (ggml type 13), not supported"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {4, 4}, 999, 0}}, 64)), errc::unsupported,
                         "type 999"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"blk.3.attn_q.weight", {64, 64}, f32, 0}}, 64)),
                         errc::corrupt, "tensor blk.3.attn_q.weight extends past end of file"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {4}, f32, 1ull << 63}}, 64)), errc::corrupt,
                         "tensor w extends past end of file (offset 8 EiB"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {4}, f32, ~std::uint64_t{31}}}, 64)),
                         errc::corrupt, "tensor w offset 18446744073709551584 overflows"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {4}, f32, 8}}, 64)), errc::corrupt,
                         "not a multiple of the alignment"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"a", {16}, f32, 0}, {"b", {4}, f32, 32}}, 128)),
                         errc::corrupt, "tensors a and b overlap"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"a", {4}, f32, 0}, {"a", {4}, f32, 32}}, 128)),
                         errc::corrupt, "duplicate tensor name a"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {1ull << 40, 1ull << 40}, f32, 0}}, 64)),
                         errc::corrupt, "tensor w element count overflows"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {1, 1, 1, 1, 1}, f32, 0}}, 64)), errc::corrupt,
                         "tensor w has 5 dimensions"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {4, 0}, f32, 0}}, 64)), errc::corrupt,
                         "tensor w has dimension 1 of size 0"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"w", {48}, q8, 0}}, 64)), errc::corrupt,
                         "tensor w row length 48 is not a multiple of the q8_0 block size 32"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{std::string(80, 'n'), {4}, f32, 0}}, 64)),
                         errc::corrupt, "absurd length 80"));
  EXPECT_TRUE(fails_with(parse_raw(make_raw({{"", {4}, f32, 0}}, 64)), errc::corrupt, "empty name"));
  // The message gives sizes in human units.
  auto big = parse_raw(make_raw({{"blk.3.attn_q.weight", {1024, 1024 * 24}, f32, 0}}, 1 << 20));
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("(offset 128 B, size 96 MiB, file 1.0 MiB)"), std::string::npos)
      << big.error().message;
}

TEST(GgufCorrupt, RandomByteFlipsNeverCrash) {
  writer w = full_writer();
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes);
  auto good = file::parse(*bytes, "model.gguf");
  ASSERT_TRUE(good);
  std::mt19937 rng(42);
  int failures = 0;
  for (int i = 0; i < 3000; ++i) {
    auto copy = *bytes;
    std::size_t at = rng() % good->data_offset();
    copy[at] = static_cast<std::byte>(rng() & 0xff);
    auto f = file::parse(copy, "model.gguf");
    if (!f) {
      ++failures;
      EXPECT_EQ(f.error().message.rfind("model.gguf: ", 0), 0u) << f.error().message;
    }
  }
  EXPECT_GT(failures, 100);  // most header flips are detected
}

TEST(GgufOpen, MissingFileAndDirectory) {
  auto f = file::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, errc::not_found);
  EXPECT_NE(f.error().message.find("/nonexistent/model.gguf: cannot open"), std::string::npos);
  auto d = file::open("/tmp");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("not a regular file"), std::string::npos);
}

TEST(GgufGetters, MissingAndWrongType) {
  auto bytes = full_writer().to_bytes();
  auto f = file::parse(*bytes, "m.gguf");
  ASSERT_TRUE(f);
  auto missing = f->get_uint("llama.block_count");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::not_found);
  EXPECT_EQ(missing.error().message, "m.gguf: metadata key llama.block_count missing");
  auto wrong = f->get_uint("k.str");
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().message, "m.gguf: metadata key k.str has type string, expected an unsigned integer");
  EXPECT_FALSE(f->get_uint("k.i8"));  // negative
  EXPECT_FALSE(f->get_string("k.u32"));
  EXPECT_FALSE(f->get_float("k.u32"));
  EXPECT_FALSE(f->get_bool("k.u8"));
  auto arr = f->get_array("k.strs", value_type::i32);
  ASSERT_FALSE(arr);
  EXPECT_NE(arr.error().message.find("is an array of string, expected i32"), std::string::npos);
  auto t = f->tensor("output.weight");
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().message, "m.gguf: tensor output.weight not found");
  auto* q = f->find_tensor("t.q8_0");
  ASSERT_NE(q, nullptr);
  EXPECT_FALSE(f->row_range(*q, 2, 2));
  EXPECT_FALSE(f->read_rows(*q, 4, 0));
}

TEST(GgufWriter, RejectsBadTensors) {
  writer w;
  std::vector<std::byte> b(40);
  EXPECT_FALSE(w.add_tensor("x", tensor_type::q8_0, {48}, b));  // not a block multiple
  EXPECT_FALSE(w.add_tensor("x", tensor_type::f32, {4}, b));    // 16 bytes expected, 40 given
  EXPECT_TRUE(w.add_tensor("x", tensor_type::f32, {10}, b));
  EXPECT_FALSE(w.add_tensor("x", tensor_type::f32, {10}, b));  // duplicate
  EXPECT_FALSE(w.add_tensor(std::string(64, 'a'), tensor_type::f32, {10}, b));
  EXPECT_FALSE(w.add_tensor("y", tensor_type::f32, {}, b));
  EXPECT_FALSE(w.add_tensor("y", tensor_type::f32, {0}, b));
  EXPECT_EQ(w.tensor_count(), 1u);
  EXPECT_FALSE(w.write("/nonexistent/dir/m.gguf"));
}

// ---- round trips -------------------------------------------------------------------------------

void expect_same(const file& f, const writer& /*unused*/) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(*f.get_string("general.architecture"), "llama");
  EXPECT_EQ(*f.get_uint("k.u8"), 200u);
  EXPECT_EQ(*f.get_int("k.i8"), -100);
  EXPECT_EQ(*f.get_uint("k.u16"), 60000u);
  EXPECT_EQ(*f.get_int("k.i16"), -30000);
  EXPECT_EQ(*f.get_uint("k.u32"), 4000000000u);
  EXPECT_EQ(*f.get_int("k.i32"), -2000000000);
  EXPECT_EQ(*f.get_uint("k.u64"), 1ull << 60);
  EXPECT_EQ(*f.get_int("k.i64"), -(1ll << 60));
  EXPECT_EQ(*f.get_float("k.f32"), 0.5);
  EXPECT_EQ(*f.get_float("k.f64"), 1e-300);
  EXPECT_EQ(*f.get_bool("k.bool"), true);
  EXPECT_EQ(*f.get_string("k.str"), "héllo ▁wörld");
  auto strs = f.get_array("k.strs", value_type::string);
  ASSERT_TRUE(strs);
  EXPECT_EQ((*strs)->strings, (std::vector<std::string>{"a", "", "<0x0A>", "▁the"}));
  EXPECT_EQ((*f.get_array("k.f32s", value_type::f32))->floats, (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ((*f.get_array("k.i32s", value_type::i32))->ints, (std::vector<std::int64_t>{-1, 7}));
  auto nested = f.get_array("k.nested", value_type::array);
  ASSERT_TRUE(nested);
  ASSERT_EQ((*nested)->arrays.size(), 2u);
  EXPECT_EQ(std::get<array>((*nested)->arrays[0].data).ints, (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(std::get<array>((*nested)->arrays[1].data).strings, (std::vector<std::string>{"x"}));
  ASSERT_EQ(f.tensors().size(), 7u);
  unsigned seed = 1;
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
    auto expect = random_bytes(t.size, seed++);
    auto d = f.read_rows(t, 0, t.rows());
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_TRUE(std::equal(expect.begin(), expect.end(), d->bytes().begin())) << t.name;
    if (f.mode() != load_mode::headers_only) {
      auto span = f.data(t);
      ASSERT_TRUE(span);
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), span->begin())) << t.name;
    }
  }
}

TEST(GgufRoundTrip, InMemoryEveryValueAndTensorType) {
  for (std::uint32_t align : {32u, 64u, 4096u}) {
    writer w = full_writer(align);
    auto bytes = w.to_bytes();
    ASSERT_TRUE(bytes);
    auto f = file::parse(*bytes, "mem.gguf");
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ(f->alignment(), align);
    EXPECT_EQ(f->data_offset() % align, 0u);
    expect_same(*f, w);
    EXPECT_EQ(f->find_tensor("t.q4_k")->type, tensor_type::q4_k);
    EXPECT_EQ(f->find_tensor("t.q4_k")->dims, (std::vector<std::uint64_t>{256, 2}));
    EXPECT_EQ(f->find_tensor("t.q6_k")->size, 420u);
  }
}

TEST(GgufRoundTrip, EveryLoadModeFromDisk) {
  writer w = full_writer();
  auto path = temp_path("modes");
  ASSERT_TRUE(w.write(path));
  for (auto mode : {load_mode::mmap, load_mode::mmap_populate, load_mode::mmap_locked,
                    load_mode::anonymous, load_mode::headers_only}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    auto f = file::open(path, {mode});
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ(f->mode(), mode);
    expect_same(*f, w);
    if (mode == load_mode::headers_only) {
      auto d = f->data(*f->find_tensor("t.f32"));
      ASSERT_FALSE(d);
      EXPECT_NE(d.error().message.find("use read_rows()"), std::string::npos);
    }
  }
  std::filesystem::remove(path);
}

bool mapped_in_this_process(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(path) != std::string::npos) return true;
  }
  return false;
}

TEST(GgufRoundTrip, OnlyMmapModesMapTheFile) {
  writer w = full_writer();
  auto path = temp_path("maps");
  ASSERT_TRUE(w.write(path));
  for (auto mode : {load_mode::mmap, load_mode::mmap_populate, load_mode::mmap_locked,
                    load_mode::anonymous, load_mode::headers_only}) {
    auto f = file::open(path, {mode});
    ASSERT_TRUE(f);
    bool want = mode == load_mode::mmap || mode == load_mode::mmap_populate ||
                mode == load_mode::mmap_locked;
    EXPECT_EQ(mapped_in_this_process(path), want) << to_string(mode);
    auto rows = f->read_rows(*f->find_tensor("t.q8_0"), 1, 2);
    ASSERT_TRUE(rows);
    EXPECT_EQ(mapped_in_this_process(path), want) << to_string(mode);
  }
  EXPECT_FALSE(mapped_in_this_process(path));  // closed files unmap
  std::filesystem::remove(path);
}

TEST(GgufRoundTrip, ReadRowsReadsOnlyTheRangeAsked) {
  writer w;
  std::vector<float> data(64 * 100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  ASSERT_TRUE(w.add_tensor("m", tensor_type::f32, {64, 100},
                           std::as_bytes(std::span<const float>(data))));
  // A fill callback tensor: produced while writing.
  ASSERT_TRUE(w.add_tensor("g", tensor_type::q8_0, {32, 3}, [](std::span<std::byte> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i);
    return ok();
  }));
  auto path = temp_path("rows");
  ASSERT_TRUE(w.write(path));
  auto f = file::open(path, {load_mode::headers_only});
  ASSERT_TRUE(f);
  const auto* m = f->find_tensor("m");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rows(), 100u);
  EXPECT_EQ(m->row_size(), 256u);
  auto range = f->row_range(*m, 10, 5);
  ASSERT_TRUE(range);
  EXPECT_EQ(range->offset, m->offset + 10 * 256);
  EXPECT_EQ(range->size, 5u * 256);
  auto rows = f->read_rows(*m, 10, 5);
  ASSERT_TRUE(rows);
  EXPECT_EQ(rows->first_row(), 10u);
  EXPECT_EQ(rows->row_count(), 5u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(rows->bytes().data()) % 64, 0u);
  const float* fl = reinterpret_cast<const float*>(rows->bytes().data());
  for (int i = 0; i < 5 * 64; ++i) ASSERT_EQ(fl[i], static_cast<float>(640 + i));
  auto g = f->read_rows(*f->find_tensor("g"), 1, 2);
  ASSERT_TRUE(g);
  EXPECT_EQ(static_cast<int>(g->bytes()[0]), 34);
  // The file is truncated under the reader: pread reports it instead of returning garbage.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(m->offset + 100)), 0);
  auto cut = f->read_rows(*m, 50, 1);
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().message.find("shrank"), std::string::npos) << cut.error().message;
  std::filesystem::remove(path);
}

TEST(GgufTypes, GeometryAgreesWithKernels) {
  for (std::uint32_t id = 0; id < 64; ++id) {
    auto g = geometry_of(id);
    auto k = tensor_type_from_ggml(id);
    ASSERT_EQ(g.has_value(), k.has_value()) << id;
    if (!g) continue;
    EXPECT_EQ(g->name, to_string(*k));
    EXPECT_EQ(g->block_elems, static_cast<std::uint32_t>(block_elements(*k)));
    EXPECT_EQ(g->block_bytes, block_bytes(*k));
  }
}

TEST(GgufTypes, NamesAndParsing) {
  EXPECT_EQ(*parse_tensor_type("Q4_K"), tensor_type::q4_k);
  EXPECT_EQ(*parse_tensor_type("q6_k"), tensor_type::q6_k);
  EXPECT_EQ(*parse_tensor_type("bf16"), tensor_type::bf16);
  EXPECT_FALSE(parse_tensor_type("q5_k"));
  EXPECT_EQ(ggml_type_name(13), "q5_K");
  EXPECT_EQ(ggml_type_name(1000), "type 1000");
  EXPECT_EQ(human_bytes(91ull << 20), "91 MiB");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(*parse_load_mode("anonymous"), load_mode::anonymous);
  EXPECT_FALSE(parse_load_mode("swap"));
}

}  // namespace
}  // namespace tessera::inference::gguf
