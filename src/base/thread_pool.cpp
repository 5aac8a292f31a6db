#include "base/thread_pool.h"

#include <algorithm>

namespace dflash {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

// Thread `index` takes chunks index, index + n_threads, ... of the current job.
void ThreadPool::run_share(int index) {
  for (int64_t c = index; c < job_chunks_; c += n_threads_) {
    int64_t begin = c * job_chunk_;
    int64_t end = std::min(job_n_, begin + job_chunk_);
    (*job_)(begin, end);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_share(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  if (n_threads_ == 1 || max_chunks == 1) {
    fn(0, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(max_chunks, n_threads_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = (n + chunks - 1) / chunks;
    job_chunks_ = (n + job_chunk_ - 1) / job_chunk_;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  run_share(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

}  // namespace dflash
