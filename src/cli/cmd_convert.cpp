// dflash convert HF_DIR -o OUT.gguf: an HF safetensors checkpoint (qwen3, qwen3_5, DFlash draft) to a GGUF
// file that llama.cpp loads, with the tokenizer and chat template carried over.
#include <filesystem>

#include "base/file_io.h"
#include "base/log.h"
#include "cli/commands.h"
#include "formats/safetensors.h"
#include "model/hf_to_gguf.h"
#include "model/model_spec.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/load_tokenizer.h"

namespace dflash::cli {
namespace {

struct ConvertOptions {
  std::string hf_dir;
  std::string out;
  std::string type = "auto";
  std::string name;
  int threads = 0;
};

Status run_convert(const ConvertOptions& opt) {
  if (!is_directory(opt.hf_dir)) return invalid_argument("'{}' is not a directory (an HF model directory)", opt.hf_dir);
  HfToGgufOptions conv;
  conv.threads = opt.threads;
  if (opt.type != "auto") {
    auto t = dtype_from_name(opt.type);
    if (!t || !(*t == DType::kF32 || *t == DType::kF16 || *t == DType::kBF16 || *t == DType::kQ8_0))
      return invalid_argument("--type {} is not one of auto, f32, f16, bf16, q8_0 (use `dflash quantize` for k-quants)",
                              opt.type);
    conv.weight_type = *t;
  }

  DF_ASSIGN_OR_RETURN(ModelSpec hf_spec, model_spec_from_hf_path(opt.hf_dir));
  DF_ASSIGN_OR_RETURN(SafetensorsModel weights, SafetensorsModel::open_dir(opt.hf_dir));
  DF_ASSIGN_OR_RETURN(ModelSpec gguf_spec, gguf_spec_for_checkpoint(hf_spec, weights));
  log::info("convert: {}", gguf_spec.summary());

  GgufWriter w;
  DF_RETURN_IF_ERROR(write_model_spec_to_gguf(gguf_spec, w));
  std::string name = opt.name;
  if (name.empty()) name = std::filesystem::path(opt.hf_dir).lexically_normal().filename().string();
  if (name.empty()) name = std::filesystem::absolute(opt.hf_dir).lexically_normal().parent_path().filename().string();
  w.set("general.name", GgufValue::string(name));

  // The file type llama.cpp reports: the declared weight type, or the checkpoint's precision.
  DType weight_type = conv.weight_type.value_or(DType::kF32);
  if (!conv.weight_type) {
    for (const auto& n : weights.tensor_names()) {
      auto t = safetensors_to_dtype(weights.find(n)->dtype);
      if (t.ok() && (*t == DType::kBF16 || *t == DType::kF16)) weight_type = *t;
    }
  }
  w.set("general.file_type", GgufValue::u32(static_cast<uint32_t>(llama_file_type(weight_type).value_or(0))));
  if (weight_type == DType::kQ8_0) w.set("general.quantization_version", GgufValue::u32(2));

  const bool has_tokenizer = file_exists(path_join(opt.hf_dir, "tokenizer.json"));
  if (gguf_spec.family == ModelFamily::kDFlashDraft) {
    log::info("convert: a DFlash draft uses its target's tokenizer; none is written");
  } else if (has_tokenizer) {
    DF_ASSIGN_OR_RETURN(Vocab vocab, load_vocab(opt.hf_dir));
    DF_RETURN_IF_ERROR(write_tokenizer_to_gguf(vocab, gguf_spec.vocab, w));
    auto tmpl = load_chat_template(opt.hf_dir);
    if (tmpl.ok()) {
      w.set("tokenizer.chat_template", GgufValue::string(tmpl->source));
      if (!tmpl->tool_use_source.empty())
        w.set("tokenizer.chat_template.tool_use", GgufValue::string(tmpl->tool_use_source));
    } else if (tmpl.status().code() == ErrorCode::kNotFound) {
      log::warn("convert: no chat template in {}", opt.hf_dir);
    } else {
      return tmpl.status();
    }
  } else {
    // llama.cpp accepts a model without a vocabulary when told so; ids are then fed directly.
    log::warn("convert: {} has no tokenizer.json; writing a model without a vocabulary", opt.hf_dir);
    w.set("tokenizer.ggml.model", GgufValue::string("none"));
  }

  DF_RETURN_IF_ERROR(add_hf_weights_to_gguf(hf_spec, weights, conv, w));
  log::info("convert: writing {} tensors to {}", w.tensor_count(), opt.out);
  DF_RETURN_IF_ERROR(w.write(opt.out));
  log::info("convert: done");
  return Status();
}

}  // namespace

void add_convert_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<ConvertOptions>();
  auto* cmd = app.add_subcommand("convert", "Convert an HF safetensors model directory to GGUF");
  cmd->add_option("hf_dir", opt->hf_dir, "HF model directory (config.json, *.safetensors, tokenizer.json)")->required();
  cmd->add_option("-o,--out", opt->out, "Output GGUF file")->required();
  cmd->add_option("--type", opt->type, "Weight type: auto (the checkpoint's), f32, f16, bf16 or q8_0")
      ->capture_default_str();
  cmd->add_option("--name", opt->name, "general.name (default: the directory name)");
  cmd->add_option("--threads", opt->threads, "Threads for type conversion (default: all cores)");
  cmd->callback([opt, &exit_code] {
    Status st = run_convert(*opt);
    exit_code = st.ok() ? 0 : report(st);
  });
}

}  // namespace dflash::cli
