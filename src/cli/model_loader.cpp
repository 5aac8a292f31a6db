#include "cli/model_loader.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "base/log.h"

#ifdef DFLASH_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace dflash::cli {

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(threads));
  if (device.rfind("cuda:", 0) != 0) return invalid_argument("--device {} is not 'cpu' or 'cuda:N'", device);
  int index = -1;
  const std::string num = device.substr(5);
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
  if (ec != std::errc() || p != num.data() + num.size() || index < 0)
    return invalid_argument("--device {}: '{}' is not a device index", device, num);
#ifdef DFLASH_HAVE_CUDA
  DF_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, CudaBackend::create(index));
  return std::unique_ptr<Backend>(std::move(be));
#else
  return unsupported("--device {}: this dflash was built without CUDA", device);
#endif
}

void add_placement_flags(CLI::App* cmd, PlacementFlags* flags) {
  auto* device = cmd->add_option("--device", flags->device, "cpu or cuda:N")->capture_default_str();
  cmd->add_option("--target-devices", flags->target_devices,
                  "split the target's layers across these devices, in order (e.g. cuda:0,cuda:1,cpu)")
      ->excludes(device)
      ->check([](const std::string& v) { return v.empty() ? std::string("--target-devices is empty") : std::string(); });
  cmd->add_option("--target-layer-split", flags->target_layer_split,
                  "positive weights of the devices' layer shares, one per device (default equal)");
  cmd->add_option("--kv-type", flags->kv_type,
                  "attention KV elements: f32, f16 (half the memory), or auto (f16 when every shard is a GPU, "
                  "else f32)")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", flags->prefill_chunk,
                  "prompt tokens a prefill step (default 2048 when every shard is a GPU, else 512: longer steps "
                  "prefill faster, shorter ones let other requests' tokens in sooner)");
}

Status check_placement_flags(const PlacementFlags& where) {
  if (const Result<bool> kv = resolve_kv_f16(where.kv_type, {}); !kv.ok()) return kv.status();
  if (where.prefill_chunk < 0 || where.prefill_chunk > (int64_t{1} << 20))
    return invalid_argument("--prefill-chunk takes 1 to {} tokens (0: the default), not {}", int64_t{1} << 20,
                            where.prefill_chunk);
  if (!where.target_devices.empty() && where.device != "cpu")
    return invalid_argument("--device and --target-devices exclude each other (name the devices in --target-devices)");
  if (where.target_devices.empty()) {
    if (!where.target_layer_split.empty()) return invalid_argument("--target-layer-split needs --target-devices");
    return Status();
  }
  // Everything but what needs the model's layer count (checked again at load).
  return plan_target_split(where.target_devices, where.target_layer_split, int64_t{1} << 40).status();
}

namespace {

// --kv-type (resolve_kv_f16 of the placement, checked before) on every shard's backend.
void set_kv_type(LoadedModel& m, const PlacementFlags& where) {
  const Result<bool> f16 = resolve_kv_f16(where.kv_type, m.placement);
  const cpu::KvType t = f16.ok() && *f16 ? cpu::KvType::kF16 : cpu::KvType::kF32;
  for (const RunnerShard& sh : m.runner->shards())
    if (auto* cpu_be = dynamic_cast<CpuBackend*>(sh.backend)) cpu_be->set_kv_type(t);
#ifdef DFLASH_HAVE_CUDA
    else if (auto* cuda_be = dynamic_cast<CudaBackend*>(sh.backend)) cuda_be->set_kv_type(t);
#endif
}

}  // namespace

Result<LoadedModel> load_model(const std::string& path, const PlacementFlags& where, int threads) {
  DF_RETURN_IF_ERROR(check_placement_flags(where));
  LoadedModel m;
  DF_ASSIGN_OR_RETURN(Weights w, Weights::load(path, threads));
  m.host = std::make_unique<Weights>(std::move(w));
  const ModelSpec& spec = m.host->spec();
  if (where.target_devices.empty()) {
    m.placement.push_back(ShardPlan{where.device.empty() ? "cpu" : where.device, 0, spec.n_layers});
  } else {
    DF_ASSIGN_OR_RETURN(m.placement, plan_target_split(where.target_devices, where.target_layer_split, spec.n_layers));
  }
  if (!m.split() && m.device_name() == "cpu") {
    m.runner = std::make_unique<Runner>(*m.host, threads);
    m.runner->set_prefill_chunk(where.prefill_chunk);
    m.device.emplace_back();
    set_kv_type(m, where);
    return m;
  }
  std::vector<RunnerShard> shards;
  for (const ShardPlan& p : m.placement) {
    DF_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, make_backend(p.device, threads));
    const Weights* on = m.host.get();
    if (be->device_memory()) {
      DF_ASSIGN_OR_RETURN(Weights dev, m.host->to_backend_if(*be, [&](std::string_view name) {
        return m.host->shard_needs(name, p.layer_begin, p.layer_end);
      }));
      m.device.push_back(std::make_unique<Weights>(std::move(dev)));
      on = m.device.back().get();
    } else {
      m.device.emplace_back();
    }
    shards.push_back(RunnerShard{on, be.get(), p.layer_begin, p.layer_end});
    m.backends.push_back(std::move(be));
  }
  if (m.split()) {
    DF_ASSIGN_OR_RETURN(m.runner, Runner::create(std::move(shards)));
  } else {
    m.runner = std::make_unique<Runner>(*shards[0].weights, *shards[0].backend);
  }
  m.runner->set_prefill_chunk(where.prefill_chunk);
  set_kv_type(m, where);
  return m;
}

Result<std::string> default_model_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("DFLASH_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    if (!fs::exists(env)) return not_found("DFLASH_DEFAULT_MODEL names '{}', which does not exist", env);
    return std::string(env);
  }
  std::vector<fs::path> dirs;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bin = exe.parent_path();
    dirs = {bin / "../share/dflash/models", bin / "../../models", bin / "models"};
  }
#ifdef DFLASH_SOURCE_MODELS
  dirs.emplace_back(DFLASH_SOURCE_MODELS);
#endif
  for (const auto& d : dirs) {
    const fs::path p = d / kDefaultModelFile;
    if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
  }
  return not_found("no model given, and the bundled default model ({}) is not beside this binary or in the "
                   "source tree's models/; pass a GGUF file or an HF model directory",
                   kDefaultModelFile);
}

Status model_or_default(const char* command, std::string& model) {
  if (!model.empty()) return Status();
  DF_ASSIGN_OR_RETURN(model, default_model_path());
  log::info("{}: no model given: the bundled default model {}", command, model);
  return Status();
}

std::string model_option_help() {
  return std::string("GGUF file or HF model directory (default: the bundled model, models/") + kDefaultModelFile + ")";
}

}  // namespace dflash::cli
