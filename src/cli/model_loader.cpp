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

Result<LoadedModel> load_model(const std::string& path, const std::string& device, int threads) {
  LoadedModel m;
  m.device_name = device.empty() ? "cpu" : device;
  DF_ASSIGN_OR_RETURN(Weights w, Weights::load(path, threads));
  m.host = std::make_unique<Weights>(std::move(w));
  if (m.device_name == "cpu") {
    m.runner = std::make_unique<Runner>(*m.host, threads);
    return m;
  }
  DF_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, make_backend(m.device_name, threads));
  DF_ASSIGN_OR_RETURN(Weights dev, m.host->to_backend(*be));
  m.device = std::make_unique<Weights>(std::move(dev));
  m.runner = std::make_unique<Runner>(*m.device, *be);
  m.backend = std::move(be);
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
