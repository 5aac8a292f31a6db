#include "model/weights.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "base/file_io.h"
#include "base/log.h"
#include "model/hf_to_gguf.h"
#include "model/tensor_shapes.h"
#include "tensor/quant.h"

namespace dflash {
namespace {

// Vectors and the DeltaNet conv kernel are read as f32 by every kernel.
bool needs_f32(const std::string& canonical, const std::vector<int64_t>& shape) {
  return shape.size() == 1 || canonical.find("gdn.conv") != std::string::npos;
}

}  // namespace

Status Weights::add(const std::string& canonical, cpu::WeightView view) {
  DF_ASSIGN_OR_RETURN(std::vector<int64_t> shape, canonical_tensor_shape(spec_, canonical));
  const int64_t rows = shape.size() == 2 ? shape[0] : 1;
  const int64_t cols = shape.back();
  if (view.rows != rows || view.cols != cols)
    return corrupt("tensor '{}' is [{}, {}] but the model needs {}", canonical, view.rows, view.cols,
                   fmt::join(shape, "x"));
  if (needs_f32(canonical, shape) && view.type != DType::kF32) {
    std::vector<uint8_t> buf(static_cast<size_t>(rows * cols) * 4);
    DF_RETURN_IF_ERROR(convert_rows(view.type, view.data, DType::kF32, buf.data(), rows, cols, 1));
    view.type = DType::kF32;
    view.data = buf.data();
    owned_.push_back(std::move(buf));
  }
  bytes_ += *row_bytes(view.type, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(rows);
  tensors_[canonical] = view;
  return Status();
}

Result<Weights> Weights::load(const std::string& path, int threads) {
  Weights w;
  w.path_ = path;
  if (is_directory(path)) {
    DF_ASSIGN_OR_RETURN(ModelSpec hf_spec, model_spec_from_hf_path(path));
    DF_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::open_dir(path));
    DF_ASSIGN_OR_RETURN(w.spec_, gguf_spec_for_checkpoint(hf_spec, st));
    DF_ASSIGN_OR_RETURN(std::vector<HfTensorPlan> plans, plan_hf_tensors(hf_spec, st, HfToGgufOptions{}));
    for (const HfTensorPlan& p : plans) {
      std::vector<uint8_t> buf;
      buf.reserve(*row_bytes(p.dst_type, static_cast<uint64_t>(p.cols)) * static_cast<uint64_t>(p.rows));
      DF_RETURN_IF_ERROR(produce_hf_tensor(p, threads, [&](const void* data, size_t n) {
        buf.insert(buf.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
        return Status();
      }));
      w.owned_.push_back(std::move(buf));
      DF_RETURN_IF_ERROR(w.add(p.canonical, {p.dst_type, p.rows, p.cols, w.owned_.back().data()}));
    }
    return w;
  }
  DF_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  w.gguf_ = std::make_shared<const GgufFile>(std::move(file));
  DF_ASSIGN_OR_RETURN(w.spec_, model_spec_from_gguf(*w.gguf_));
  TensorNameMap names(w.spec_.name_layout());
  for (const TensorNameEntry& e : names.entries()) {
    if (e.gguf.empty()) continue;
    const GgufTensorInfo* t = w.gguf_->find_tensor(e.gguf);
    if (t == nullptr) {
      if (e.canonical == "output" && w.spec_.tied_embeddings) continue;
      return not_found("{}: no tensor '{}'", path, e.gguf);
    }
    if (!row_conversion_supported(t->type))
      return unsupported("{}: tensor '{}' has type {}, which the CPU engine does not compute with", path, e.gguf,
                         dtype_name(t->type));
    int64_t rows = 1;
    for (size_t d = 1; d < t->shape.size(); ++d) rows *= static_cast<int64_t>(t->shape[d]);
    DF_RETURN_IF_ERROR(w.add(e.canonical, {t->type, rows, static_cast<int64_t>(t->shape[0]),
                                           w.gguf_->tensor_data(*t).data()})
                           .with_context(path));
  }
  return w;
}

Result<Weights> Weights::to_backend(Backend& be, std::span<const std::string_view> only) const {
  return to_backend_if(be, [&](std::string_view name) {
    return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
  });
}

bool Weights::shard_needs(std::string_view canonical, int64_t begin, int64_t end) const {
  const int64_t n_layers = spec_.n_layers;
  if (canonical.rfind("layers.", 0) == 0) {
    const std::string_view rest = canonical.substr(7);
    int64_t layer = 0;
    size_t i = 0;
    for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i) layer = layer * 10 + (rest[i] - '0');
    return i > 0 && layer >= begin && layer < end;
  }
  const bool first = begin == 0, last = end == n_layers;
  if (canonical == "token_embd") return first || (last && find("output") == nullptr);
  if (canonical == "output" || canonical == "output_norm") return last;
  return true;
}

uint64_t Weights::shard_bytes(int64_t begin, int64_t end) const {
  uint64_t b = 0;
  for (const auto& [name, view] : tensors_)
    if (shard_needs(name, begin, end))
      b += *row_bytes(view.type, static_cast<uint64_t>(view.cols)) * static_cast<uint64_t>(view.rows);
  return b;
}

uint64_t Weights::layer_matmul_elements() const {
  uint64_t e = 0;
  for (const auto& [name, view] : tensors_)
    if (name.starts_with("layers.") && view.rows > 1 && !name.ends_with(".gdn.conv"))
      e += static_cast<uint64_t>(view.rows) * static_cast<uint64_t>(view.cols);
  return e;
}

Result<Weights> Weights::to_backend_if(Backend& be, const std::function<bool(std::string_view)>& keep) const {
  const auto wanted = [&](const std::string& name) { return keep(name); };
  Weights out;
  out.spec_ = spec_;
  out.path_ = path_;
  out.bytes_ = 0;
  for (const auto& [name, view] : tensors_) {
    if (!wanted(name)) continue;
    const Result<uint64_t> b = be.weight_bytes(view);
    if (!b.ok()) return b.status().with_context(name);
    out.bytes_ += *b;
  }
  const uint64_t total_bytes = out.bytes_;
  std::vector<float> staging;
  // Progress in tenths of the bytes, for big models on slow links (one log line each).
  uint64_t copied = 0;
  int reported = 0;
  const double total = std::max<double>(1.0, static_cast<double>(total_bytes));
  for (const auto& [name, view] : tensors_) {
    if (!wanted(name)) continue;
    const uint64_t bytes = *be.weight_bytes(view);
    const int64_t floats = static_cast<int64_t>((bytes + 3) / 4);
    staging.assign(static_cast<size_t>(floats), 0.0f);  // padded to whole floats
    DF_RETURN_IF_ERROR(be.pack_weight(view, staging.data()).with_context(name));
    DF_ASSIGN_OR_RETURN(Buffer buf, be.alloc(floats));
    DF_RETURN_IF_ERROR(be.upload(buf.data(), staging.data(), floats).with_context(name));
    cpu::WeightView v = view;
    v.data = buf.data();
    out.tensors_[name] = v;
    out.on_backend_.push_back(std::move(buf));
    copied += bytes;
    const int tenth = static_cast<int>(10.0 * static_cast<double>(copied) / total);
    if (tenth > reported && total_bytes > (uint64_t{256} << 20)) {
      reported = tenth;
      log::info("loading weights onto {}: {}% ({:.0f} of {:.0f} MiB)", be.name(), std::min(100, 10 * tenth),
                static_cast<double>(copied) / 1048576.0, total / 1048576.0);
    }
  }
  return out;
}

const cpu::WeightView* Weights::find(std::string_view canonical) const {
  auto it = tensors_.find(canonical);
  return it == tensors_.end() ? nullptr : &it->second;
}

const float* Weights::f32(std::string_view canonical) const {
  const cpu::WeightView* v = find(canonical);
  return v != nullptr && v->type == DType::kF32 ? static_cast<const float*>(v->data) : nullptr;
}

}  // namespace dflash
