// Gloo peer for bench/allreduce.c: Debian's libgloo-dev over TCP on loopback, timing
// gloo::AllreduceRing (impl gloo-ring) and gloo::allreduce with default AllreduceOptions
// (impl gloo-default) with the same method as bench/allreduce.c (warm-up, adaptive
// iteration count, barrier, per-iteration times averaged over ranks, median, result
// checked after the timing) and the same JSON lines, printed by rank 0.
//
// Usage: gloo_allreduce --ranks N [--sizes 4KiB,1MiB] [--target-ms T] [--timeout-s S]
//          [--netns NS0,NS1,.. --hosts ADDR0,ADDR1,..]   (rank i in namespace NSi, at ADDRi)
// It is its own launcher: it makes a rendezvous directory (gloo::rendezvous::FileStore)
// under $TMPDIR, forks N ranks, and waits for all of them. If one fails, or the whole run
// takes longer than --timeout-s (default 300), the others are killed by pid; every child
// is reaped and the directory removed before it exits.
//
// Differences from keel's benchmark, because of gloo's interfaces:
// - AllreduceRing works in place: it is built once per size and run on a buffer of
//   zeros (which stays zeros, so the floats never grow to inf); the pattern is then
//   loaded and one more run is checked.
// - Each of the two runs on its own context (see Bench::context_).
// - gloo::allreduce is out of place, and its options (and their unbound buffers) are
//   built for every call, as PyTorch's ProcessGroupGloo does.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../bench_stats.h"

#include "gloo/allreduce.h"
#include "gloo/allreduce_ring.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

constexpr int kMaxSizes = 16;
constexpr int64_t kMinIterations = 10;
constexpr int64_t kMaxIterations = 20000;

struct Options {
  int ranks = 0;
  double target_ns = 1e9;
  int timeout_s = 300;
  std::vector<uint64_t> sizes{4 << 10, 1 << 20, 64 << 20};
  // --netns: rank i runs in network namespace netns[i] (a name under /run/netns) and
  // listens on hosts[i] (--hosts), instead of 127.0.0.1 on this host.
  std::vector<std::string> netns, hosts;
};

std::vector<std::string> split_commas(const std::string &list) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    items.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

double now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

bool parse_size(const char *text, uint64_t *bytes) {
  char *end;
  unsigned long long value = strtoull(text, &end, 10);
  if (end == text) return false;
  uint64_t unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1ull << 10;
  if (*end == 'M' || *end == 'm') unit = 1ull << 20;
  if (*end == 'G' || *end == 'g') unit = 1ull << 30;
  if (unit != 1) end++;
  if (strcmp(end, "") != 0 && strcmp(end, "iB") != 0 && strcmp(end, "B") != 0) return false;
  *bytes = (uint64_t)value * unit;
  *bytes -= *bytes % sizeof(float);
  return *bytes >= sizeof(float) && *bytes / sizeof(float) <= INT32_MAX;
}

bool parse_options(int argc, char **argv, Options *opts) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return false;
    std::string flag = argv[i];
    const char *value = argv[i + 1];
    if (flag == "--ranks") {
      opts->ranks = atoi(value);
      if (opts->ranks < 1 || opts->ranks > 64) return false;
    } else if (flag == "--target-ms") {
      opts->target_ns = atof(value) * 1e6;
      if (opts->target_ns <= 0) return false;
    } else if (flag == "--timeout-s") {
      opts->timeout_s = atoi(value);
      if (opts->timeout_s < 1) return false;
    } else if (flag == "--sizes") {
      opts->sizes.clear();
      std::string list = value;
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        uint64_t bytes;
        if ((int)opts->sizes.size() == kMaxSizes ||
            !parse_size(list.substr(start, comma - start).c_str(), &bytes))
          return false;
        opts->sizes.push_back(bytes);
        start = comma + 1;
      }
    } else if (flag == "--netns") {
      opts->netns = split_commas(value);
    } else if (flag == "--hosts") {
      opts->hosts = split_commas(value);
    } else {
      return false;
    }
  }
  if (opts->netns.size() != opts->hosts.size()) return false;
  if (!opts->netns.empty() && (int)opts->netns.size() != opts->ranks) return false;
  return opts->ranks > 0;
}

// Moves the calling process (a rank, before its device exists) into namespace name.
bool enter_netns(const std::string &name) {
  std::string path = "/run/netns/" + name;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    fprintf(stderr, "gloo_allreduce: cannot enter %s: %s\n", path.c_str(), strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  close(fd);
  return true;
}

// The statistic shared with keel's own benchmark and the MPI harness.
void summarize(std::vector<double> &times, double *median_us, double *mean_us) {
  bench_summarize(times.data(), (int64_t)times.size(), median_us, mean_us);
}

int64_t warmup_iterations(uint64_t bytes) {
  if (bytes >= (8u << 20)) return 2;
  if (bytes >= (256u << 10)) return 10;
  return 50;
}

void fill_send(float *send, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) send[i] = (float)(i % 7) + (float)rank;
}

bool result_correct(const char *impl, const float *recv, size_t count, int size) {
  for (size_t i = 0; i < count; i++) {
    float expected = (float)size * (float)(i % 7) + (float)(size * (size - 1) / 2);
    if (recv[i] != expected) {
      fprintf(stderr, "gloo_allreduce: %s: wrong result at element %zu: %g, expected %g\n",
              impl, i, (double)recv[i], (double)expected);
      return false;
    }
  }
  return true;
}

// One rank's side of the benchmark, over a connected context.
class Bench {
 public:
  using Connect = std::function<std::shared_ptr<gloo::Context>(const std::string &)>;

  Bench(const Connect &connect, const Options &opts)
      : context_(connect("control")),
        ring_context_(connect("gloo-ring")),
        default_context_(connect("gloo-default")),
        opts_(opts) {
    uint64_t largest = *std::max_element(opts.sizes.begin(), opts.sizes.end());
    send_.resize(largest / sizeof(float));
    recv_.resize(largest / sizeof(float));
    times_.resize(kMaxIterations);
  }

  void run() {
    for (uint64_t bytes : opts_.sizes) measure_ring(bytes);
    for (uint64_t bytes : opts_.sizes) measure_default(bytes);
  }

 private:
  // Every collective gets its own tag, as PyTorch's ProcessGroupGloo does.
  uint32_t next_tag() { return tag_++; }

  // gloo::allreduce of n doubles with fn (sum or max); its own tag.
  void allreduce_doubles(double *data, size_t n, void (*fn)(void *, const void *,
                                                            const void *, size_t)) {
    gloo::AllreduceOptions options(context_);
    options.setOutput(data, n);
    options.setReduceFunction(fn);
    options.setTag(next_tag());
    gloo::allreduce(options);
  }

  void barrier() {
    gloo::BarrierOptions options(context_);
    options.setTag(next_tag());
    gloo::barrier(options);
  }

  // Every rank runs the count that fills the target at the slowest rank's warm-up pace.
  int64_t choose_iterations(double warmup_per_op_ns) {
    allreduce_doubles(&warmup_per_op_ns, 1, &gloo::max<double>);
    double wanted = warmup_per_op_ns > 0 ? opts_.target_ns / warmup_per_op_ns : kMaxIterations;
    if (wanted < kMinIterations) return kMinIterations;
    return wanted > kMaxIterations ? kMaxIterations : (int64_t)wanted;
  }

  template <typename Op>
  void timed(const char *impl, uint64_t bytes, Op op) {
    int64_t warmup = warmup_iterations(bytes);
    double start = now_ns();
    for (int64_t i = 0; i < warmup; i++) op();
    int64_t iterations = choose_iterations((now_ns() - start) / (double)warmup);
    barrier();
    for (int64_t i = 0; i < iterations; i++) {
      start = now_ns();
      op();
      times_[i] = now_ns() - start;
    }
    allreduce_doubles(times_.data(), (size_t)iterations, &gloo::sum<double>);
    if (context_->rank != 0) return;
    std::vector<double> average(times_.begin(), times_.begin() + iterations);
    for (double &t : average) t /= context_->size;
    double median_us, mean_us;
    summarize(average, &median_us, &mean_us);
    int size = context_->size;
    double factor = size > 1 ? 2.0 * (size - 1) / size : 1.0;
    printf(
        "{\"bench\":\"allreduce\",\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%llu,"
        "\"time_us\":%.3f,\"mean_us\":%.3f,\"busbw_gbps\":%.4f,\"iterations\":%lld}\n",
        impl, size, (unsigned long long)bytes, median_us, mean_us,
        factor * (double)bytes / (median_us * 1e3), (long long)iterations);
    fflush(stdout);
  }

  void measure_ring(uint64_t bytes) {
    size_t count = bytes / sizeof(float);
    std::fill(recv_.begin(), recv_.begin() + count, 0.0f);
    std::vector<float *> ptrs{recv_.data()};
    gloo::AllreduceRing<float> ring(ring_context_, ptrs, (int)count);
    timed("gloo-ring", bytes, [&] { ring.run(); });
    fill_send(recv_.data(), count, context_->rank);
    ring.run();
    if (!result_correct("gloo-ring", recv_.data(), count, context_->size)) exit(3);
  }

  void measure_default(uint64_t bytes) {
    size_t count = bytes / sizeof(float);
    fill_send(send_.data(), count, context_->rank);
    timed("gloo-default", bytes, [&] {
      gloo::AllreduceOptions options(default_context_);
      options.setInput(send_.data(), count);
      options.setOutput(recv_.data(), count);
      options.setReduceFunction(
          static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
      options.setTag(next_tag());
      gloo::allreduce(options);
    });
    if (!result_correct("gloo-default", recv_.data(), count, context_->size)) exit(3);
  }

  // Three contexts (full meshes of their own connections): one for the benchmark's own
  // collectives (barrier, warm-up maximum, times), one per measured allreduce. With
  // AllreduceRing and gloo::allreduce on one context, gloo::allreduce hangs after the ring
  // has run (4 ranks, 16 MiB: every rank waits in UnboundBuffer::waitRecv, past the
  // context's timeout); on separate contexts, as PyTorch never mixes them, neither does.
  std::shared_ptr<gloo::Context> context_, ring_context_, default_context_;
  const Options &opts_;
  std::vector<float> send_, recv_;
  std::vector<double> times_;
  uint32_t tag_ = 1;
};

int run_rank(int rank, const Options &opts, const std::string &dir) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    if (!opts.netns.empty()) {
      if (!enter_netns(opts.netns[rank])) return 1;
      attr.hostname = opts.hosts[rank];
    }
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    auto connect = [&](const std::string &name) {
      gloo::rendezvous::PrefixStore prefixed(name, store);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, opts.ranks);
      context->setTimeout(std::chrono::seconds(opts.timeout_s));
      context->connectFullMesh(prefixed, device);
      return std::shared_ptr<gloo::Context>(context);
    };
    Bench bench(connect, opts);
    bench.run();
    return 0;
  } catch (const std::exception &error) {
    fprintf(stderr, "gloo_allreduce: rank %d: %s\n", rank, error.what());
    return 1;
  }
}

// The launcher stops on SIGALRM (--timeout-s) and on SIGTERM or SIGINT (an outer timeout,
// ^C): it kills its ranks and reaps them rather than leaving them behind.
volatile sig_atomic_t stop_signal = 0;
void on_stop(int signal) { stop_signal = signal; }

void remove_dir(const std::string &dir) {
  // FileStore leaves one file per key, and no subdirectories.
  if (DIR *handle = opendir(dir.c_str())) {
    while (struct dirent *entry = readdir(handle)) {
      std::string name = entry->d_name;
      if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
    }
    closedir(handle);
  }
  if (rmdir(dir.c_str()) != 0) fprintf(stderr, "gloo_allreduce: cannot remove %s\n", dir.c_str());
}

}  // namespace

int main(int argc, char **argv) {
  Options opts;
  if (!parse_options(argc, argv, &opts)) {
    fprintf(stderr, "gloo_allreduce: bad flags (see the file's header)\n");
    return 2;
  }
  const char *tmp = getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/gloo-rdv-XXXXXX";
  std::vector<char> dir_buf(pattern.begin(), pattern.end());
  dir_buf.push_back('\0');
  if (!mkdtemp(dir_buf.data())) {
    perror("gloo_allreduce: mkdtemp");
    return 1;
  }
  std::string dir = dir_buf.data();
  fflush(stdout);

  struct sigaction action = {};
  action.sa_handler = on_stop;  // no SA_RESTART: waitpid returns EINTR on these signals
  for (int signal : {SIGALRM, SIGTERM, SIGINT}) sigaction(signal, &action, nullptr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < opts.ranks && !stop_signal; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("gloo_allreduce: fork");
      break;
    }
    if (pid == 0) {
      struct sigaction fallback = {};
      fallback.sa_handler = SIG_DFL;
      for (int signal : {SIGALRM, SIGTERM, SIGINT}) sigaction(signal, &fallback, nullptr);
      int code = run_rank(rank, opts, dir);
      fflush(stdout);
      _exit(code);  // no atexit handlers of the parent's, no double flush
    }
    pids.push_back(pid);
  }

  alarm((unsigned)opts.timeout_s);
  bool failed = (int)pids.size() != opts.ranks;
  size_t live = pids.size();
  auto kill_all = [&] {
    for (pid_t pid : pids)
      if (pid > 0) kill(pid, SIGKILL);
  };
  if (failed) kill_all();
  while (live > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno != EINTR) break;  // no children left: cannot happen while live > 0
      if (stop_signal && !failed) {
        if (stop_signal == SIGALRM)
          fprintf(stderr, "gloo_allreduce: timed out after %d s; killing the ranks\n",
                  opts.timeout_s);
        else
          fprintf(stderr, "gloo_allreduce: %s; killing the ranks\n", strsignal(stop_signal));
        failed = true;
        kill_all();
      }
      continue;
    }
    for (pid_t &known : pids) {
      if (known != pid) continue;
      known = 0;
      live--;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !failed) {
        fprintf(stderr, "gloo_allreduce: a rank failed (%s %d); killing the others\n",
                WIFEXITED(status) ? "exit" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        failed = true;
        kill_all();
      }
    }
  }
  alarm(0);
  remove_dir(dir);
  return failed ? 1 : 0;
}
