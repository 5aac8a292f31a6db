#include "cli/model_loader.h"

#include <charconv>

#ifdef DFLASH_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace dflash::cli {

Result<LoadedModel> load_model(const std::string& path, const std::string& device, int threads) {
  LoadedModel m;
  m.device_name = device.empty() ? "cpu" : device;
  DF_ASSIGN_OR_RETURN(Weights w, Weights::load(path, threads));
  m.host = std::make_unique<Weights>(std::move(w));
  if (m.device_name == "cpu") {
    m.runner = std::make_unique<Runner>(*m.host, threads);
    return m;
  }
  if (m.device_name.rfind("cuda:", 0) != 0)
    return invalid_argument("--device {} is not 'cpu' or 'cuda:N'", m.device_name);
  int index = -1;
  const std::string num = m.device_name.substr(5);
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
  if (ec != std::errc() || p != num.data() + num.size() || index < 0)
    return invalid_argument("--device {}: '{}' is not a device index", m.device_name, num);
#ifdef DFLASH_HAVE_CUDA
  DF_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, CudaBackend::create(index));
  DF_ASSIGN_OR_RETURN(Weights dev, m.host->to_backend(*be));
  m.device = std::make_unique<Weights>(std::move(dev));
  m.runner = std::make_unique<Runner>(*m.device, *be);
  m.backend = std::move(be);
  return m;
#else
  return unsupported("--device {}: this dflash was built without CUDA", m.device_name);
#endif
}

}  // namespace dflash::cli
