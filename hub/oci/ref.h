// Package references, one syntax across the project: org/name[@TAG|@sha256:HEX].
// The default tag is v1. (KernelConfig adds an optional ":Layer" suffix in registry/.)
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "hub/base/digest.h"

namespace kh {

inline constexpr std::string_view kDefaultTag = "v1";

struct Ref {
  std::string repo;              // "org/name", OCI repository name rules, at least two parts
  std::string tag;               // "v1", "1.4.2"; empty when pinned by digest
  std::optional<Digest> digest;  // pinned content

  // Throws kInvalidInput naming the text and the rule it broke.
  static Ref parse(std::string_view text);
  // "org/name@v1" or "org/name@sha256:..."
  std::string str() const;
  // What goes into /manifests/<reference>: the digest when pinned, else the tag.
  std::string reference() const { return digest ? digest->str() : tag; }
  bool operator==(const Ref&) const = default;
};

bool is_valid_repo_name(std::string_view name);
bool is_valid_tag(std::string_view tag);

}  // namespace kh
