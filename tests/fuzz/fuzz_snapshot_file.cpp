// libFuzzer target: snapshot files (state/snapshot_file.h) from arbitrary bytes: the header peek, then the
// full read bound to the identity the header claims, so the data checks run on whatever passes the peek.
#include <cstddef>
#include <cstdint>

#include "state/snapshot_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  auto info = dflash::peek_snapshot_bytes(bytes);
  if (!info.ok()) {
    (void)dflash::read_snapshot_bytes(bytes, dflash::SnapshotIdentity{});  // must fail without reading past the end
    return 0;
  }
  auto snap = dflash::read_snapshot_bytes(bytes, info->identity);
  if (!snap.ok()) return 0;
  size_t sum = snap->tokens.size() + snap->last_logits.size();
  for (const auto& t : snap->tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (static_cast<size_t>(n) != t.data.size()) __builtin_trap();  // shapes and data must agree
    if (!t.data.empty()) sum += static_cast<size_t>(t.data.back() == t.data.back());  // touches the last element
  }
  volatile size_t sink = sum;
  (void)sink;
  return 0;
}
