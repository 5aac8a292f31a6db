#include "formats/hf_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/file_io.h"
#include "formats/untrusted_json.h"

namespace dflash {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxConfigBytes = size_t{16} << 20;
constexpr int64_t kMaxDim = int64_t{1} << 24;        // sizes of one dimension (vocab, hidden, ffn)
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 65536;
constexpr int64_t kMaxContext = int64_t{1} << 40;
constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;
constexpr size_t kMaxListLen = 4096;

// Typed, range-checked access to one JSON object, with an optional fallback object for keys the
// first lacks (a nested text_config falls back to the wrapper). JSON null counts as absent.
class Fields {
 public:
  Fields(const json& obj, const json* fallback, std::string where)
      : obj_(obj), fallback_(fallback), where_(std::move(where)) {}

  const std::string& where() const { return where_; }

  const json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it != obj_.end() && !it->is_null()) return &*it;
    if (fallback_ != nullptr) {
      auto fit = fallback_->find(key);
      if (fit != fallback_->end() && !fit->is_null()) return &*fit;
    }
    return nullptr;
  }

  Result<int64_t> int_value(const json& v, std::string_view key, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_integer()) {  // signed or unsigned
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
        return corrupt("{}: \"{}\" = {} is out of range [{}, {}]", where_, key, v.dump(), lo, hi);
      x = v.get<int64_t>();
    } else if (v.is_number_float()) {
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi))
        return corrupt("{}: \"{}\" = {} is not an integer in [{}, {}]", where_, key, v.dump(), lo, hi);
      x = static_cast<int64_t>(d);
    } else {
      return corrupt("{}: \"{}\" must be an integer, got a JSON {}", where_, key, json_type_name(v));
    }
    if (x < lo || x > hi) return corrupt("{}: \"{}\" = {} is out of range [{}, {}]", where_, key, x, lo, hi);
    return x;
  }

  Result<std::optional<int64_t>> opt_int(const char* key, int64_t lo, int64_t hi) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<int64_t>();
    DF_ASSIGN_OR_RETURN(int64_t x, int_value(*v, key, lo, hi));
    return std::optional<int64_t>(x);
  }
  Result<int64_t> req_int(const char* key, int64_t lo, int64_t hi) const {
    DF_ASSIGN_OR_RETURN(auto x, opt_int(key, lo, hi));
    if (!x) return corrupt("{}: required field \"{}\" is missing", where_, key);
    return *x;
  }
  Result<int64_t> int_or(const char* key, int64_t def, int64_t lo, int64_t hi) const {
    DF_ASSIGN_OR_RETURN(auto x, opt_int(key, lo, hi));
    return x.value_or(def);
  }

  // Numbers in [lo, hi]; `lo_open` excludes lo itself.
  Result<std::optional<double>> opt_num(const char* key, double lo, double hi, bool lo_open = false) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return corrupt("{}: \"{}\" must be a number, got a JSON {}", where_, key, json_type_name(*v));
    double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
      return corrupt("{}: \"{}\" = {} is out of range {}{}, {}]", where_, key, v->dump(), lo_open ? "(" : "[", lo, hi);
    return std::optional<double>(d);
  }
  Result<double> num_or(const char* key, double def, double lo, double hi, bool lo_open = false) const {
    DF_ASSIGN_OR_RETURN(auto x, opt_num(key, lo, hi, lo_open));
    return x.value_or(def);
  }

  Result<bool> bool_or(const char* key, bool def) const {
    const json* v = get(key);
    if (v == nullptr) return def;
    if (!v->is_boolean()) return corrupt("{}: \"{}\" must be true or false, got a JSON {}", where_, key, json_type_name(*v));
    return v->get<bool>();
  }

  Result<std::optional<std::string>> opt_str(const char* key) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return corrupt("{}: \"{}\" must be a string, got a JSON {}", where_, key, json_type_name(*v));
    return std::optional<std::string>(v->get<std::string>());
  }

  // A list of integers (absent -> nullopt). A lone integer is accepted as a one-element list when
  // `scalar_ok` (eos_token_id may be either).
  Result<std::optional<std::vector<int64_t>>> opt_int_list(const char* key, int64_t lo, int64_t hi,
                                                           bool scalar_ok = false) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<std::vector<int64_t>>();
    std::vector<int64_t> out;
    if (scalar_ok && v->is_number()) {
      DF_ASSIGN_OR_RETURN(int64_t x, int_value(*v, key, lo, hi));
      out.push_back(x);
      return std::optional<std::vector<int64_t>>(std::move(out));
    }
    if (!v->is_array()) return corrupt("{}: \"{}\" must be a list of integers, got a JSON {}", where_, key, json_type_name(*v));
    if (v->size() > kMaxListLen) return corrupt("{}: \"{}\" has {} entries; at most {}", where_, key, v->size(), kMaxListLen);
    for (size_t i = 0; i < v->size(); ++i) {
      DF_ASSIGN_OR_RETURN(int64_t x, int_value((*v)[i], fmt::format("{}[{}]", key, i), lo, hi));
      out.push_back(x);
    }
    return std::optional<std::vector<int64_t>>(std::move(out));
  }

  Result<std::optional<std::vector<std::string>>> opt_str_list(const char* key) const {
    const json* v = get(key);
    if (v == nullptr) return std::optional<std::vector<std::string>>();
    if (!v->is_array()) return corrupt("{}: \"{}\" must be a list of strings, got a JSON {}", where_, key, json_type_name(*v));
    if (v->size() > kMaxListLen) return corrupt("{}: \"{}\" has {} entries; at most {}", where_, key, v->size(), kMaxListLen);
    std::vector<std::string> out;
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string())
        return corrupt("{}: \"{}\"[{}] must be a string, got a JSON {}", where_, key, i, json_type_name((*v)[i]));
      out.push_back((*v)[i].get<std::string>());
    }
    return std::optional<std::vector<std::string>>(std::move(out));
  }

  // A nested object (absent or null -> nullptr).
  Result<const json*> opt_object(const char* key) const {
    const json* v = get(key);
    if (v == nullptr) return static_cast<const json*>(nullptr);
    if (!v->is_object()) return corrupt("{}: \"{}\" must be an object, got a JSON {}", where_, key, json_type_name(*v));
    return v;
  }

 private:
  const json& obj_;
  const json* fallback_;
  std::string where_;
};

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// model_types we recognise but do not run yet, with what to say about them.
const char* unsupported_family(std::string_view model_type) {
  if (model_type == "qwen3_5_moe" || model_type == "qwen3_5_moe_text") return "Qwen3.5/3.6 MoE";
  if (model_type == "qwen3_next") return "Qwen3-Next";
  if (model_type == "qwen3_moe") return "Qwen3 MoE";
  if (model_type == "qwen3_vl" || model_type == "qwen3_vl_moe") return "Qwen3-VL";
  return nullptr;
}

Status parse_rope(const Fields& f, HfConfig& c, double default_partial) {
  DF_ASSIGN_OR_RETURN(const json* rp, f.opt_object("rope_parameters"));
  DF_ASSIGN_OR_RETURN(const json* rs, f.opt_object("rope_scaling"));
  DF_ASSIGN_OR_RETURN(double top_theta, f.num_or("rope_theta", 10000.0, 0.0, 1e12, true));
  DF_ASSIGN_OR_RETURN(auto top_partial, f.opt_num("partial_rotary_factor", 0.0, 1.0, true));
  c.rope_theta = top_theta;
  c.partial_rotary_factor = top_partial.value_or(default_partial);

  const json* scaling = rs;  // legacy: rope_theta at top level, rope_scaling beside it
  std::string scaling_where = f.where() + " rope_scaling";
  if (rp != nullptr) {  // transformers >= 5: everything inside rope_parameters
    Fields r(*rp, nullptr, f.where() + " rope_parameters");
    DF_ASSIGN_OR_RETURN(c.rope_theta, r.num_or("rope_theta", top_theta, 0.0, 1e12, true));
    DF_ASSIGN_OR_RETURN(auto partial, r.opt_num("partial_rotary_factor", 0.0, 1.0, true));
    if (partial) c.partial_rotary_factor = *partial;
    scaling = rp;
    scaling_where = r.where();
  }
  if (scaling == nullptr) return Status();

  Fields s(*scaling, nullptr, scaling_where);
  DF_ASSIGN_OR_RETURN(auto section, s.opt_int_list("mrope_section", 0, 1024));
  if (section) c.mrope_section = *section;
  DF_ASSIGN_OR_RETURN(c.mrope_interleaved, s.bool_or("mrope_interleaved", false));
  DF_ASSIGN_OR_RETURN(auto type, s.opt_str("rope_type"));
  if (!type) {
    DF_ASSIGN_OR_RETURN(type, s.opt_str("type"));
  }
  std::string t = type.value_or("default");
  if (t == "default" || t == "mrope") return Status();
  if (t != "linear" && t != "yarn")
    return unsupported("{}: rope scaling type '{}' is not supported (supported: default, linear, yarn)", s.where(),
                       t.substr(0, 64));
  c.rope_scaling.type = t;
  DF_ASSIGN_OR_RETURN(auto factor, s.opt_num("factor", 0.0, 1e6, true));
  if (!factor) return corrupt("{}: rope scaling '{}' has no \"factor\"", s.where(), t);
  c.rope_scaling.factor = *factor;
  if (t == "yarn") {
    DF_ASSIGN_OR_RETURN(auto orig, s.opt_int("original_max_position_embeddings", 1, kMaxContext));
    c.rope_scaling.original_max_position_embeddings = orig.value_or(0);  // filled from max_position later
    DF_ASSIGN_OR_RETURN(c.rope_scaling.attention_factor, s.opt_num("attention_factor", 0.0, 1e3, true));
    DF_ASSIGN_OR_RETURN(c.rope_scaling.beta_fast, s.opt_num("beta_fast", 0.0, 1e6, true));
    DF_ASSIGN_OR_RETURN(c.rope_scaling.beta_slow, s.opt_num("beta_slow", 0.0, 1e6, true));
  }
  return Status();
}

Status parse_layer_types(const Fields& f, HfConfig& c) {
  const int64_t n = c.num_hidden_layers;
  DF_ASSIGN_OR_RETURN(bool use_sliding, f.bool_or("use_sliding_window", false));
  DF_ASSIGN_OR_RETURN(auto window, f.opt_int("sliding_window", 1, kMaxContext));
  if (use_sliding) c.sliding_window = window;

  DF_ASSIGN_OR_RETURN(auto types, f.opt_str_list("layer_types"));
  if (types) {
    if (static_cast<int64_t>(types->size()) != n)
      return corrupt("{}: \"layer_types\" has {} entries but num_hidden_layers is {}", f.where(), types->size(), n);
    for (size_t i = 0; i < types->size(); ++i) {
      const std::string& t = (*types)[i];
      bool ok = c.kind == HfModelKind::kQwen35 ? (t == "full_attention" || t == "linear_attention")
                                               : (t == "full_attention" || t == "sliding_attention");
      if (!ok)
        return corrupt("{}: layer_types[{}] = '{}' is not a layer type of a {} model", f.where(), i, t.substr(0, 64),
                       hf_model_kind_name(c.kind));
    }
    c.layer_types = std::move(*types);
  } else if (c.kind == HfModelKind::kQwen35) {
    DF_ASSIGN_OR_RETURN(int64_t interval, f.int_or("full_attention_interval", 4, 1, kMaxLayers));
    for (int64_t i = 0; i < n; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
  } else {
    // Qwen3Config's rule: layers from max_window_layers on slide when sliding is on.
    DF_ASSIGN_OR_RETURN(int64_t max_window_layers, f.int_or("max_window_layers", 28, 0, kMaxLayers));
    for (int64_t i = 0; i < n; ++i)
      c.layer_types.push_back(c.sliding_window && i >= max_window_layers ? "sliding_attention" : "full_attention");
  }
  bool any_sliding = contains(c.layer_types, "sliding_attention");
  if (any_sliding && use_sliding && !c.sliding_window)
    return corrupt("{}: \"use_sliding_window\" is true but \"sliding_window\" is not set", f.where());
  return Status();
}

Status parse_draft_fields(const Fields& top, HfConfig& c) {
  DF_ASSIGN_OR_RETURN(const json* dc_obj, top.opt_object("dflash_config"));
  json empty = json::object();
  Fields d(dc_obj != nullptr ? *dc_obj : empty, nullptr, top.where() + " dflash_config");

  DF_ASSIGN_OR_RETURN(auto block, d.opt_int("block_size", 2, 1024));
  if (!block) {
    DF_ASSIGN_OR_RETURN(block, top.opt_int("block_size", 2, 1024));
  }
  c.block_size = block.value_or(16);

  DF_ASSIGN_OR_RETURN(c.mask_token_id, d.opt_int("mask_token_id", 0, kMaxTokenId));
  if (!c.mask_token_id) {
    DF_ASSIGN_OR_RETURN(c.mask_token_id, top.opt_int("mask_token_id", 0, kMaxTokenId));
  }
  DF_ASSIGN_OR_RETURN(c.num_target_layers, top.opt_int("num_target_layers", 1, kMaxLayers));

  DF_ASSIGN_OR_RETURN(auto ids, d.opt_int_list("target_layer_ids", 0, kMaxLayers - 1));
  if (!ids) {
    DF_ASSIGN_OR_RETURN(ids, top.opt_int_list("target_layer_ids", 0, kMaxLayers - 1));
  }
  if (ids) {
    c.target_layer_ids = std::move(*ids);
  } else if (c.num_target_layers) {
    c.target_layer_ids = default_target_layer_ids(*c.num_target_layers, c.num_hidden_layers);
  } else {
    return corrupt("{}: a DFlash draft needs dflash_config.target_layer_ids (or num_target_layers to derive them)",
                   top.where());
  }
  if (c.target_layer_ids.empty()) return corrupt("{}: dflash_config.target_layer_ids is empty", top.where());
  return Status();
}

}  // namespace

const char* hf_model_kind_name(HfModelKind k) {
  switch (k) {
    case HfModelKind::kQwen3: return "qwen3";
    case HfModelKind::kQwen35: return "qwen3_5";
    case HfModelKind::kDFlashDraft: return "DFlash draft";
  }
  return "unknown";
}

std::vector<int64_t> default_target_layer_ids(int64_t n_target_layers, int64_t n_draft_layers) {
  std::vector<int64_t> ids;
  if (n_draft_layers <= 0 || n_target_layers <= 0) return ids;
  if (n_draft_layers == 1) return {n_target_layers / 2};
  double step = static_cast<double>(n_target_layers - 4) / static_cast<double>(n_draft_layers - 1);
  for (int64_t i = 0; i < n_draft_layers; ++i)
    ids.push_back(static_cast<int64_t>(std::nearbyint(1.0 + static_cast<double>(i) * step)));  // Python round()
  return ids;
}

Result<HfConfig> parse_hf_config(const json& j) {
  if (!j.is_object()) return corrupt("config.json: top level is a JSON {}, not an object", json_type_name(j));
  HfConfig c;
  Fields top(j, nullptr, "config.json");

  DF_ASSIGN_OR_RETURN(auto archs, top.opt_str_list("architectures"));
  if (archs) c.architectures = std::move(*archs);
  DF_ASSIGN_OR_RETURN(auto model_type, top.opt_str("model_type"));
  DF_ASSIGN_OR_RETURN(const json* dflash_config, top.opt_object("dflash_config"));

  for (const char* other : {"DFlash2DraftModel", "DSparkDraftModel"})
    if (contains(c.architectures, other))
      return unsupported("config.json: architecture {} is not supported (only DFlashDraftModel drafts)", other);

  const json* text = &j;
  if (contains(c.architectures, "DFlashDraftModel") || dflash_config != nullptr) {
    c.kind = HfModelKind::kDFlashDraft;
    c.model_type = model_type.value_or("qwen3");
    if (c.model_type != "qwen3")
      return unsupported("config.json: DFlash drafts with model_type '{}' are not supported (only qwen3-style drafts)",
                         c.model_type.substr(0, 64));
  } else {
    if (!model_type) return corrupt("config.json has no \"model_type\"");
    const std::string& mt = *model_type;
    if (const char* family = unsupported_family(mt))
      return unsupported("config.json: {} (model_type '{}') is not supported yet", family, mt);
    if (mt == "qwen3") {
      c.kind = HfModelKind::kQwen3;
      c.model_type = mt;
    } else if (mt == "qwen3_5" || mt == "qwen3_5_text") {
      c.kind = HfModelKind::kQwen35;
      c.model_type = mt;
      DF_ASSIGN_OR_RETURN(const json* tc, top.opt_object("text_config"));
      if (tc != nullptr) {
        text = tc;
        c.nested_text_config = true;
        c.outer_model_type = mt;
        Fields inner(*tc, nullptr, "config.json text_config");
        DF_ASSIGN_OR_RETURN(auto inner_type, inner.opt_str("model_type"));
        c.model_type = inner_type.value_or("qwen3_5_text");
        if (const char* family = unsupported_family(c.model_type))
          return unsupported("config.json: {} (text_config model_type '{}') is not supported yet", family, c.model_type);
        if (c.model_type != "qwen3_5_text" && c.model_type != "qwen3_5")
          return unsupported("config.json: text_config model_type '{}' inside '{}' is not supported",
                             c.model_type.substr(0, 64), mt);
      }
    } else {
      return unsupported("config.json: model_type '{}' is not supported (supported: qwen3, qwen3_5, qwen3_5_text, "
                         "DFlash drafts)",
                         mt.substr(0, 64));
    }
  }

  Fields f(*text, c.nested_text_config ? &j : nullptr, c.nested_text_config ? "config.json text_config" : "config.json");
  DF_ASSIGN_OR_RETURN(c.vocab_size, f.req_int("vocab_size", 1, kMaxDim));
  DF_ASSIGN_OR_RETURN(c.hidden_size, f.req_int("hidden_size", 1, kMaxDim));
  DF_ASSIGN_OR_RETURN(c.intermediate_size, f.req_int("intermediate_size", 1, kMaxDim));
  DF_ASSIGN_OR_RETURN(c.num_hidden_layers, f.req_int("num_hidden_layers", 1, kMaxLayers));
  DF_ASSIGN_OR_RETURN(c.num_attention_heads, f.req_int("num_attention_heads", 1, kMaxHeads));
  DF_ASSIGN_OR_RETURN(c.num_key_value_heads, f.int_or("num_key_value_heads", c.num_attention_heads, 1, kMaxHeads));
  DF_ASSIGN_OR_RETURN(auto head_dim, f.opt_int("head_dim", 1, kMaxDim));
  if (head_dim) {
    c.head_dim = *head_dim;
    c.head_dim_explicit = true;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      return corrupt("{}: hidden size {} is not divisible by {} heads (and no head_dim is given)", f.where(),
                     c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  DF_ASSIGN_OR_RETURN(c.rms_norm_eps, f.num_or("rms_norm_eps", 1e-6, 0.0, 1.0, true));
  DF_ASSIGN_OR_RETURN(c.max_position_embeddings, f.int_or("max_position_embeddings", 32768, 1, kMaxContext));
  DF_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.bool_or("tie_word_embeddings", false));
  DF_ASSIGN_OR_RETURN(c.attention_bias, f.bool_or("attention_bias", false));
  DF_ASSIGN_OR_RETURN(auto act, f.opt_str("hidden_act"));
  if (act) c.hidden_act = *act;
  DF_ASSIGN_OR_RETURN(auto dtype, f.opt_str("torch_dtype"));
  if (!dtype) {
    DF_ASSIGN_OR_RETURN(dtype, f.opt_str("dtype"));
  }
  c.dtype = dtype.value_or("");

  DF_RETURN_IF_ERROR(parse_rope(f, c, c.kind == HfModelKind::kQwen35 ? 0.25 : 1.0));
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.original_max_position_embeddings == 0)
    c.rope_scaling.original_max_position_embeddings = c.max_position_embeddings;
  if (c.kind == HfModelKind::kQwen35 && c.mrope_section.empty()) c.mrope_section = {11, 11, 10};
  DF_RETURN_IF_ERROR(parse_layer_types(f, c));

  // Token ids: the text config's, then the wrapper's.
  DF_ASSIGN_OR_RETURN(c.bos_token_id, f.opt_int("bos_token_id", 0, kMaxTokenId));
  DF_ASSIGN_OR_RETURN(auto eos, f.opt_int_list("eos_token_id", 0, kMaxTokenId, true));
  if (eos) c.eos_token_ids = *eos;
  if (c.nested_text_config) {
    DF_ASSIGN_OR_RETURN(auto outer_eos, top.opt_int_list("eos_token_id", 0, kMaxTokenId, true));
    if (outer_eos)
      for (int64_t id : *outer_eos)
        if (!std::count(c.eos_token_ids.begin(), c.eos_token_ids.end(), id)) c.eos_token_ids.push_back(id);
  }

  if (c.kind == HfModelKind::kQwen35) {
    DF_ASSIGN_OR_RETURN(c.linear_conv_kernel_dim, f.int_or("linear_conv_kernel_dim", 4, 1, 64));
    DF_ASSIGN_OR_RETURN(c.linear_key_head_dim, f.int_or("linear_key_head_dim", 128, 1, kMaxDim));
    DF_ASSIGN_OR_RETURN(c.linear_value_head_dim, f.int_or("linear_value_head_dim", 128, 1, kMaxDim));
    DF_ASSIGN_OR_RETURN(c.linear_num_key_heads, f.int_or("linear_num_key_heads", 16, 1, kMaxHeads));
    DF_ASSIGN_OR_RETURN(c.linear_num_value_heads, f.int_or("linear_num_value_heads", 32, 1, kMaxHeads));
    DF_ASSIGN_OR_RETURN(c.attn_output_gate, f.bool_or("attn_output_gate", true));
    DF_ASSIGN_OR_RETURN(c.mtp_num_hidden_layers, f.int_or("mtp_num_hidden_layers", 0, 0, 64));
    DF_ASSIGN_OR_RETURN(auto experts, f.opt_int("num_experts", 0, kMaxDim));
    if (experts && *experts > 0)
      return unsupported("{}: a qwen3_5 config with num_experts = {} is a MoE model, which is not supported yet",
                         f.where(), *experts);
  }
  if (c.kind == HfModelKind::kDFlashDraft) DF_RETURN_IF_ERROR(parse_draft_fields(top, c));
  return c;
}

Result<HfConfig> parse_hf_config_text(std::string_view text, std::string_view what) {
  DF_ASSIGN_OR_RETURN(json j, parse_untrusted_json(text, what));
  auto c = parse_hf_config(j);
  if (!c.ok() && what != "config.json") return c.status().with_context(what);
  return c;
}

Result<HfConfig> load_hf_config(const std::string& path) {
  std::string file = is_directory(path) ? path_join(path, "config.json") : path;
  DF_ASSIGN_OR_RETURN(std::string text, read_text_file(file, kMaxConfigBytes));
  return parse_hf_config_text(text, file);
}

}  // namespace dflash
