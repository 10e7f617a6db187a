// template_program's entry points: a source parsed into the tree, the tree rendered, and the
// template_error thrown inside either turned into a result<> error. The engine's parts are the
// jinja_*.cpp files beside this one (jinja_impl.hpp says which holds what).
#include "inference/tokenizer/jinja.hpp"

#include "inference/tokenizer/jinja_impl.hpp"

namespace tessera::inference::tokenizer::jinja {

// ------------------------------------------------------------------ entry points

template_program::template_program() = default;
template_program::template_program(template_program&&) noexcept = default;
template_program& template_program::operator=(template_program&&) noexcept = default;
template_program::~template_program() = default;

result<template_program> template_program::parse(std::string_view source) {
  if (source.size() > detail::kMaxSource)
    return make_error(errc::invalid_argument, "chat template: {} bytes, more than the {} allowed",
                      source.size(), detail::kMaxSource);
  try {
    auto root = std::make_shared<node>();
    root->body = detail::parse_segments(detail::split(source));
    template_program t;
    t.root_ = std::move(root);
    return t;
  } catch (const detail::template_error& e) {
    return make_error(errc::invalid_argument, "{}", e.message);
  }
}

result<std::string> template_program::render(const object& globals) const {
  try {
    detail::renderer r(globals);
    return r.run(root_->body);
  } catch (const detail::template_error& e) {
    return make_error(e.code, "{}", e.message);
  }
}

}  // namespace tessera::inference::tokenizer::jinja
