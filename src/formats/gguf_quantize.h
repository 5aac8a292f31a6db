// GGUF quantization: llama.cpp's file types and per-tensor type mix, and the streaming rewrite of a file.
//
// The plan reproduces the tensor types llama.cpp's `llama_model_quantize` (src/llama-quant.cpp, pinned
// to the release in tests/oracle) picks when it has no importance matrix and no per-tensor overrides,
// so that `dflash quantize m.gguf out.gguf --type q4_k_m` writes the same types (and, with the
// bit-exact quantizers of tensor/quant.h, the same bytes) as `llama-quantize m.gguf out.gguf Q4_K_M`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "formats/gguf.h"
#include "tensor/dtype.h"

namespace dflash {

// llama.cpp's `enum llama_ftype`: what a file is "mostly" quantized to. Stored as general.file_type.
enum class FileType : uint32_t {
  kAllF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 7,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ2_K = 10,
  kQ3_K_S = 11,
  kQ3_K_M = 12,
  kQ3_K_L = 13,
  kQ4_K_S = 14,
  kQ4_K_M = 15,
  kQ5_K_S = 16,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kBF16 = 32,
};

struct FileTypeInfo {
  FileType type;
  std::string_view name;  // lower case, as `--type` takes it: "q4_k_m", "f16", "f32"
  DType default_type;     // the type of the tensors no special rule applies to
};

// Every file type `dflash quantize` writes (the llama.cpp types whose tensor types tensor/quant.h has).
std::span<const FileTypeInfo> file_types();
const FileTypeInfo& file_type_info(FileType t);
// Accepts the names in any case ("Q4_K_M", "q4_k_m"); "all_f32" is an alias of "f32".
std::optional<FileType> file_type_from_name(std::string_view name);
// "q8_0, q4_0, ..." for help and error messages.
std::string file_type_names();

// What the type rules need from the model beyond tensor names and shapes (read from GGUF metadata).
struct QuantModelFacts {
  std::string arch;        // general.architecture
  uint32_t n_layer = 0;    // <arch>.block_count, MTP/nextn layers included
  uint32_t n_head = 0;     // <arch>.attention.head_count of layer 0
  uint32_t n_head_kv = 0;  // <arch>.attention.head_count_kv of layer 0 (defaults to n_head)
  uint32_t n_expert = 0;   // <arch>.expert_count (0 for dense models)
};
Result<QuantModelFacts> quant_model_facts(const GgufFile& file);

struct QuantOptions {
  FileType file_type = FileType::kQ8_0;
  bool allow_requantize = false;  // allow inputs that are already block-quantized (quality loss)
  bool pure = false;              // every quantizable tensor gets the default type (row fallbacks still apply)
};

// One tensor of the output and how it is made from the input.
struct TensorQuant {
  size_t source = 0;             // index into the input's tensors()
  std::string name;
  std::vector<uint64_t> shape;   // ggml order, innermost first
  DType from = DType::kF32;
  DType to = DType::kF32;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  bool fallback = false;         // the row length ruled out the type the mix picked
  bool converts() const { return from != to; }
};

struct QuantPlan {
  FileType file_type = FileType::kQ8_0;
  // In llama.cpp's output order: tensors outside the layers by name, then blk.N.* by N, then by name.
  // The order matters beyond cosmetics: the per-layer schedules count tensors in this order.
  std::vector<TensorQuant> tensors;
  int n_fallback = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t n_elements = 0;
};

// Chooses each tensor's output type. Errors: a quantized input without allow_requantize, an input type
// this build cannot convert, an MoE tensor whose layer cannot be read from its name.
Result<QuantPlan> plan_quantization(const std::vector<GgufTensorInfo>& tensors, const QuantModelFacts& facts,
                                    const QuantOptions& options);
Result<QuantPlan> plan_quantization(const GgufFile& file, const QuantOptions& options);

// Called as each tensor is written: its plan entry, its 0-based position, and the tensor count.
using QuantProgress = std::function<void(const TensorQuant&, size_t index, size_t count)>;

// Writes `plan` applied to `in` to `out_path` (atomically): the input's metadata with general.file_type
// and general.quantization_version set as llama.cpp sets them, the tensors converted slab by slab so
// memory stays bounded whatever the model size. threads <= 0: one per hardware thread.
Status write_quantized_gguf(const GgufFile& in, const QuantPlan& plan, const std::string& out_path, int threads,
                            const QuantProgress& progress = {});

}  // namespace dflash
