// libFuzzer entry for the GGUF parser: any byte string must parse or fail with an error, never
// crash, hang, leak or read out of bounds. Successful parses also exercise the lookups.
#include <cstddef>
#include <cstdint>
#include <span>

#include "inference/gguf/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::inference::gguf;
  auto f = file::parse(std::as_bytes(std::span(data, size)), "fuzz.gguf");
  if (!f) return 0;
  (void)f->get_string("general.architecture");
  (void)f->get_uint("general.alignment");
  (void)f->get_array("tokenizer.ggml.tokens", value_type::string);
  for (const auto& t : f->tensors()) {
    auto d = f->data(t);
    if (d && !d->empty()) {
      volatile std::byte sink = (*d)[d->size() - 1];
      (void)sink;
    }
    if (t.rows() > 0) (void)f->read_rows(t, t.rows() - 1, 1);
  }
  return 0;
}
