// The cache root ($KERNEL_HUB_CACHE, default $XDG_CACHE_HOME/kernel-hub or ~/.cache/kernel-hub)
// and every subdirectory in it, with the one component that writes it. Nothing else writes under
// the root; readers go through the owner's API.
//
//   blobs/sha256/<hex>           hub/store (Store): immutable, verified blobs
//   tmp/<hex>.<pid>.<rand>.part  hub/store (Store): in-flight downloads, swept when stale
//   refs/<hub-id>/<repo>/<tag>   hub/store (Store::write_ref), called by the hub facade for what
//                                it resolves (Hub::record_ref, from Hub::pull and Hub::info:
//                                kernelize and the CLI ask the hub, never the store) and by
//                                hub/mirror's import for what a mirror brought (under the
//                                mirror's and the source hub's ids)
//   unpacked/<layer-hex>/        hub/store (Store): extracted packages, read-only
//   signatures/<index-hex>.json  hub/store (Store), for hub/trust: signature sets seen
//   trust/<hub-id>/<repo>/...    hub/trust (TrustState): rollback serials
//   locks/<name>.lock            hub/store (Store): single-flight locks
//   jit/<key>.cubin              loader (JitCache): NVRTC output, keyed by its inputs (not signed)
//   jit/u<uid>/<key>.cubin       the same in the shared mode: one directory per user, 0700 and
//                                owned by that user, checked through its descriptor on every read
//                                (a group member can rename it, not write into it); an entry is
//                                used only when that user owns it
//   CACHEDIR.TAG                 hub/store (Store)
#pragma once

#include <filesystem>

namespace kh::cache_layout {

inline constexpr const char* kBlobs = "blobs/sha256";
inline constexpr const char* kTmp = "tmp";
inline constexpr const char* kRefs = "refs";
inline constexpr const char* kUnpacked = "unpacked";
inline constexpr const char* kSignatures = "signatures";
inline constexpr const char* kTrust = "trust";
inline constexpr const char* kLocks = "locks";
inline constexpr const char* kJit = "jit";
inline constexpr const char* kCacheDirTag = "CACHEDIR.TAG";

// $KERNEL_HUB_CACHE, else $XDG_CACHE_HOME/kernel-hub (absolute only), else
// $HOME/.cache/kernel-hub. Throws kh::Error kInvalidInput when none can be found.
std::filesystem::path default_root();

}  // namespace kh::cache_layout
