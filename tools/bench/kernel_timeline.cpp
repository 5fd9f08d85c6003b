// kernel_timeline: a CUPTI injection library that records every kernel a process runs on the GPU,
// CUDA-graph nodes included, with its start and end on the GPU's clock, and writes them at exit
// as tab-separated rows to $KH_TIMELINE_OUT (default kernel_timeline.tsv). Concurrent-kernel
// activity keeps kernels as they ran: PDL overlap and parallel branches show as overlapping
// intervals. tools/bench/kernel_timeline.py turns a decode step's rows into its breakdown.
//
//   CUDA_INJECTION64_PATH=.../libkh_kernel_timeline.so KH_TIMELINE_OUT=/tmp/t.tsv kernel-hub demo ...
//
// The driver loads the library named by CUDA_INJECTION64_PATH when the process initialises CUDA
// and calls InitializeInjection; nothing in kernel-hub links it.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end;  // ns, GPU timestamps
  uint32_t stream, correlation, graph;
  uint64_t graph_node;
  int32_t grid[3], block[3];
  std::string name;
};

std::mutex records_mutex;
std::vector<KernelRecord> records;
constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    // The name is CUPTI's, valid only while the buffer is: copied.
    records.push_back({k->start,
                       k->end,
                       k->streamId,
                       k->correlationId,
                       k->graphId,
                       k->graphNodeId,
                       {k->gridX, k->gridY, k->gridZ},
                       {k->blockX, k->blockY, k->blockZ},
                       k->name ? k->name : "?"});
  }
  std::free(buffer);
}

void write_records() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("KH_TIMELINE_OUT");
  if (!path || !*path) path = "kernel_timeline.tsv";
  std::FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path);
    return;
  }
  std::fprintf(f, "start_ns\tend_ns\tstream\tcorrelation\tgraph\tgraph_node\tgrid\tblock\tname\n");
  std::lock_guard<std::mutex> lock(records_mutex);
  for (const KernelRecord& k : records)
    std::fprintf(f, "%llu\t%llu\t%u\t%u\t%u\t%llu\t%d,%d,%d\t%d,%d,%d\t%s\n",
                 static_cast<unsigned long long>(k.start), static_cast<unsigned long long>(k.end),
                 k.stream, k.correlation, k.graph, static_cast<unsigned long long>(k.graph_node),
                 k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
                 k.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_timeline: %zu kernels written to %s\n", records.size(), path);
}

}  // namespace

extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_timeline: CUPTI refused kernel activity tracing\n");
    return 0;
  }
  std::atexit(write_records);
  return 1;
}
