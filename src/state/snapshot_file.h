// Snapshot files: a Snapshot on disk as a GGUF file (dflash.snapshot.* metadata, f32 tensors), bound to
// the model it came from, checksummed, written atomically and read back with every check made.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "state/sequence_state.h"

namespace dflash {

// Version of the layout below; a file of another version is refused (kUnsupported).
inline constexpr uint32_t kSnapshotFormatVersion = 1;
// The tensor that holds Snapshot::last_logits ([V]); absent when the snapshot has no logits.
inline constexpr std::string_view kSnapshotLogitsTensor = "snap_prefill_logits";
// File names: [A-Za-z0-9._-], not starting with '.', at most this many bytes.
inline constexpr size_t kMaxSnapshotFileName = 200;
// Tensor names: [A-Za-z0-9._-], at most 63 bytes (ggml's GGML_MAX_NAME less its NUL).
inline constexpr size_t kMaxSnapshotTensorName = 63;

// What a snapshot file is bound to: a file from another model, layout, context size or chat template is
// a miss.
struct SnapshotIdentity {
  std::string model_id;        // e.g. the model file's name
  uint64_t model_bytes = 0;    // model file size
  int64_t model_mtime = 0;     // model file mtime (seconds)
  uint64_t layout_hash = 0;    // hash of the tensor layout / ModelSpec summary (the caller computes it)
  int64_t n_ctx = 0;           // context size (0: unbounded; else n_past <= n_ctx)
  uint64_t template_hash = 0;  // hash of the chat template source (0: none)
  bool operator==(const SnapshotIdentity&) const = default;
};

// Writes `snap` to dir/name atomically. The file is built in a private temporary directory inside `dir`
// (".dflash-snapshot-tmp.XXXXXX", mode 0700, made with mkdtemp), fsync'ed, given mode 0600, renamed over
// dir/name, and `dir` is fsync'ed; the temporary directory is removed on success and on every error.
// `name` must pass check_snapshot_file_name (never a path). Requires tokens.size() == n_past, every
// tensor 1 to 4 dims with shape product == data.size(), sane unique tensor names, none called
// kSnapshotLogitsTensor. `dir` must exist (the caller creates the cache directory).
Status write_snapshot_file(const std::string& dir, const std::string& name, const Snapshot& snap,
                           const SnapshotIdentity& id);

// The header only (for the start-up scan and lookups): identity, tokens, n_past, total bytes. Cheap: the
// tensor data is neither read nor checksummed, but every byte before it is checked (container layout,
// key set and types, header checksum over identity, tokens and the tensor list), so a flipped token id or
// identity field is an error here too.
struct SnapshotFileInfo {
  SnapshotIdentity identity;
  std::vector<int32_t> tokens;
  int64_t n_past = 0;
  uint64_t file_bytes = 0;
};
Result<SnapshotFileInfo> peek_snapshot_file(const std::string& path);

// The whole snapshot, every check made: container layout (every byte of the file accounted for:
// canonical offsets, zero padding, exact size), format version, header checksum, identity == expected,
// tokens.size() == n_past, tensor names and shapes, per-tensor xxh64 checksums. Tensors come back in file
// order with Snapshot shapes (outermost first), logits from kSnapshotLogitsTensor.
// Errors (never half a snapshot): kNotFound when the file does not exist or belongs to another identity
// (the message names the field), kUnsupported for another format version, kCorrupt for anything damaged,
// kIo when the OS refuses. Sizes are bounded by the file size: hostile input never over-allocates.
Result<Snapshot> read_snapshot_file(const std::string& path, const SnapshotIdentity& expected);

// The same on bytes in memory (fuzzing; snapshots received over a socket). Messages say "<memory>".
Result<SnapshotFileInfo> peek_snapshot_bytes(std::span<const uint8_t> bytes);
Result<Snapshot> read_snapshot_bytes(std::span<const uint8_t> bytes, const SnapshotIdentity& expected);

// Whether `name` may be a snapshot file name (see kMaxSnapshotFileName): an error saying why not.
Status check_snapshot_file_name(std::string_view name);

// Temporary entries of writers in a snapshot directory. A writer that was killed leaves one behind
// (a directory holding a partial file); it is never a snapshot, and no valid snapshot name matches it.
bool is_snapshot_temp_name(std::string_view file_name);
// Removes temporary entries of `dir` whose newest mtime (the entry or a file in it) is at least
// `min_age_seconds` old: the start-up scan calls it before peeking the snapshots. A live writer keeps its
// entry fresh; removing a live writer's entry only makes that write fail cleanly. Returns how many went.
Result<int> remove_stale_snapshot_temps(const std::string& dir, int64_t min_age_seconds = 60);

}  // namespace dflash
