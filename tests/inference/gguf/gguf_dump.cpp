// tessera_gguf_dump MODEL OUTDIR: the C++ reader's view of a GGUF file for the python reference to
// compare against: OUTDIR/index.json (scalar metadata, tensor names, types, dims, offsets) and
// OUTDIR/<tensor>.f32 (the tensor dequantized by the kernels' scalar reference, float32).
#include <cstdio>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "inference/gguf/gguf.hpp"
#include "inference/kernels/quant.hpp"

int main(int argc, char** argv) {
  using namespace tessera::inference;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf OUTDIR\n", argv[0]);
    return 2;
  }
  auto f = gguf::file::open(argv[1], {gguf::load_mode::anonymous});
  if (!f) {
    std::fprintf(stderr, "%s\n", f.error().message.c_str());
    return 1;
  }
  nlohmann::json idx;
  idx["version"] = f->version();
  idx["data_offset"] = f->data_offset();
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : f->metadata()) {
    if (auto* u = std::get_if<std::uint64_t>(&v.data)) meta[k] = *u;
    else if (auto* i = std::get_if<std::int64_t>(&v.data)) meta[k] = *i;
    else if (auto* d = std::get_if<double>(&v.data)) meta[k] = *d;
    else if (auto* b = std::get_if<bool>(&v.data)) meta[k] = *b;
    else if (auto* s = std::get_if<std::string>(&v.data)) meta[k] = *s;
    else meta[k] = {{"array_len", std::get<gguf::array>(v.data).size()}};
  }
  idx["metadata"] = meta;
  nlohmann::json tensors = nlohmann::json::array();
  std::string dir = argv[2];
  for (const auto& t : f->tensors()) {
    tensors.push_back({{"name", t.name}, {"type", std::string(to_string(t.type))}, {"dims", t.dims},
                       {"offset", t.offset}, {"size", t.size}});
    auto data = f->data(t);
    std::vector<float> out(static_cast<std::size_t>(t.elements));
    auto r = dequantize_row(t.type, data->data(), out.data(), static_cast<std::int64_t>(t.elements));
    if (!r) {
      std::fprintf(stderr, "%s: %s\n", t.name.c_str(), r.error().message.c_str());
      return 1;
    }
    std::ofstream o(dir + "/" + t.name + ".f32", std::ios::binary);
    o.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
    if (!o) {
      std::fprintf(stderr, "cannot write %s/%s.f32\n", dir.c_str(), t.name.c_str());
      return 1;
    }
  }
  idx["tensors"] = tensors;
  std::ofstream(dir + "/index.json") << idx.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
