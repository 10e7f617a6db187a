#include "inference/kernels/pages.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

namespace tessera::inference {

result<page_buffer> page_buffer::create(std::size_t bytes) {
  constexpr std::size_t huge = std::size_t{2} << 20;
  if (bytes == 0) return page_buffer{};
  if (bytes > (std::size_t{1} << 46))
    return make_error(errc::invalid_argument, "a page buffer of {} B is beyond any machine", bytes);
  const std::size_t size = (bytes + huge - 1) / huge * huge;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return make_error(errc::io, "cannot map {} B for a buffer: {}", size, std::strerror(errno));
#ifdef MADV_HUGEPAGE
  ::madvise(p, size, MADV_HUGEPAGE);  // a hint: refused (THP off) it is 4 KiB pages
#endif
  page_buffer b;
  b.data_ = p;
  b.bytes_ = size;
  return b;
}

page_buffer::~page_buffer() { release(); }

void page_buffer::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace tessera::inference
