// Internal to mesh/node: the table of configuration keys shared by config.cpp and options.cpp.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "actors/base/result.hpp"
#include "mesh/node/config.hpp"

namespace tessera::mesh::detail {

enum class value_kind { text, port, count, boolean, list };

/// One setting: its key, flag, help, type, where it lives in node_config and how it is checked.
struct key_spec {
  std::string_view key;
  std::string_view flag;
  std::string_view help;
  value_kind kind = value_kind::text;
  std::string& (*text)(node_config&) = nullptr;
  std::uint16_t& (*port)(node_config&) = nullptr;
  std::uint32_t& (*count)(node_config&) = nullptr;
  bool& (*boolean)(node_config&) = nullptr;
  std::vector<std::string>& (*list)(node_config&) = nullptr;
  result<void> (*check)(std::string_view) = nullptr;  ///< per value / per list item
  std::uint32_t min = 0;
  std::uint32_t max = UINT32_MAX;
  std::size_t max_items = 0;
  std::vector<std::string_view> choices;
  bool in_file = true;  ///< false: flag and env only (one-shot actions like reset_identity)
};

const std::vector<key_spec>& keys();
result<void> apply_text(const key_spec& k, node_config& c, std::string_view text);

}  // namespace tessera::mesh::detail
