#include "transport/control/fault_adapter.hpp"

#include <exception>

#include <msgpack.hpp>

#include "actors/base/msgpack_bounded.hpp"

namespace tessera::transport::control {

std::string encode_fault_command(const faults::fault_command& command) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, command);
  return std::string(buf.data(), buf.size());
}

result<faults::fault_command> decode_fault_command(std::span<const std::byte> body) {
  try {
    auto handle = tessera::bounded_unpack(reinterpret_cast<const char*>(body.data()), body.size());
    return handle.get().as<faults::fault_command>();
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "fault.set body is not a fault command: {}",
                      e.what());
  }
}

fault_hooks make_fault_hooks(std::shared_ptr<faults::fault_injector> injector, std::string self) {
  TESSERA_ASSERT(injector != nullptr, "make_fault_hooks without an injector");
  fault_hooks h;
  h.decide = [injector, self](std::string_view to, std::int64_t now_ns,
                              std::array<std::int64_t, 2>& due_ns) -> std::uint8_t {
    const auto d = injector->decide(self, to, faults::nanoseconds(now_ns));
    for (std::uint8_t i = 0; i < d.copies && i < 2; ++i) due_ns[i] = d.deliver_at[i].count();
    return d.copies;
  };
  h.on_command = [injector](msg_type type, std::span<const std::byte> body) -> result<void> {
    if (type == msg_type::fault_clear) {
      faults::fault_command clear;
      clear.what = faults::fault_command::verb::clear;
      return injector->apply(clear);
    }
    auto command = decode_fault_command(body);
    if (!command) return std::move(command).error();
    return injector->apply(*command);
  };
  return h;
}

}  // namespace tessera::transport::control
