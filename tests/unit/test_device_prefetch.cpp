// Device prefetch: the next batch is copied into a second input buffer while the current step runs. The copy
// path changes where and when bytes move, never which values a step sees.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "kiln/single_runner.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

const char* kMlp = R"(
[model]
input_shape = [1, 6, 6]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 16
activation = "relu"
[[model.layers]]
type = "dense"
units = 4
)";

ModelSpec mlp() { return test::model_from(kMlp, 5); }

Element batch_of(const ModelSpec& m, int64_t n, uint32_t seed) { return test::random_batch(n, m.input_shape, 4, seed); }

std::unique_ptr<Device> cpu_device() { return test::registry().backend("cpu")(BackendOptions{})->open(0); }

void require_same_state(const std::map<std::string, HostTensor>& a, const std::map<std::string, HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name));
    CHECK(t.data == b.at(name).data);  // bit for bit
  }
}

}  // namespace

TEST_CASE("the CPU device's uploads complete in ticket order on its transfer thread", "[prefetch]") {
  auto dev = cpu_device();
  Block* blk = dev->allocate_block(3 * 4096);
  REQUIRE(blk);
  std::vector<std::vector<unsigned char>> src(3);
  std::vector<uint64_t> tickets;
  for (size_t i = 0; i < 3; ++i) {
    src[i].assign(4096, static_cast<unsigned char>(17 * (i + 1)));
    tickets.push_back(dev->upload_async(src[i].data(), BufferView{blk, i * 4096, 4096}));
  }
  CHECK(tickets[0] < tickets[1]);
  CHECK(tickets[1] < tickets[2]);
  dev->wait_upload(tickets[2]);  // in order: the earlier two are done as well
  const auto* bytes = static_cast<const unsigned char*>(blk->ptr);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(bytes[i * 4096] == 17 * (i + 1));
    CHECK(bytes[i * 4096 + 4095] == 17 * (i + 1));
  }
  dev->wait_upload(tickets[0]);  // waiting again on a finished ticket returns at once
  CHECK_THROWS_AS(dev->wait_upload(tickets[2] + 5), DeviceError);
  CHECK_THROWS_AS(dev->upload_async(src[0].data(), BufferView{blk, 3 * 4096 - 100, 4096}), DeviceError);
  // synchronize() covers uploads too
  std::vector<unsigned char> big(3 * 4096, 99);
  dev->upload_async(big.data(), BufferView{blk, 0, big.size()});
  dev->synchronize();
  CHECK(bytes[3 * 4096 - 1] == 99);
  dev->free_block(blk);
}

TEST_CASE("a double-buffered executor trains bit for bit like a single-buffered one", "[prefetch]") {
  ModelSpec m = mlp();
  OptimizerSpec adam;
  adam.lr = 0.01;
  GraphOptions go;
  go.batch = 8;
  go.optimizer = &adam;
  std::vector<Element> batches;
  for (uint32_t k = 0; k < 5; ++k) batches.push_back(batch_of(m, 8, 100 + k));

  auto dev1 = cpu_device();
  Allocator a1(*dev1, AllocatorOptions{});
  DeviceState s1(DeviceContext{dev1.get(), &a1}, 3);
  Executor single(build_graph(m, go), s1);
  std::vector<float> l1;
  for (size_t k = 0; k < batches.size(); ++k) {
    single.load_batch(batches[k]);
    single.run({int64_t(k), 0.01f});
    l1.push_back(single.read_scalar(single.graph().losses[0]));
  }

  auto dev2 = cpu_device();
  Allocator a2(*dev2, AllocatorOptions{});
  DeviceState s2(DeviceContext{dev2.get(), &a2}, 3);
  PlanOptions po;
  po.input_slots = 2;
  Executor dbl(build_graph(m, go), s2, po);
  CHECK(dbl.plan().input == 2 * dbl.plan().input_slot);
  CHECK(dbl.plan().input_slot == single.plan().input);
  CHECK(a2.stats().in_use_by_tag[static_cast<size_t>(MemoryTag::input_data)] == dbl.plan().input);
  std::vector<float> l2;
  auto pending = dbl.upload_batch(batches[0], 0);
  for (size_t k = 0; k < batches.size(); ++k) {
    for (auto t : pending) dev2->wait_upload(t);
    pending.clear();
    const int slot = static_cast<int>(k % 2);
    if (k + 1 < batches.size()) pending = dbl.upload_batch(batches[k + 1], 1 - slot);  // overlaps this step
    dbl.run({int64_t(k), 0.01f}, slot);
    l2.push_back(dbl.read_scalar(dbl.graph().losses[0]));
  }
  CHECK(l1 == l2);
  require_same_state(s1.read_all(), s2.read_all());

  CHECK_THROWS_WITH(dbl.run({0, 0.01f}, 2), Catch::Contains("input slot 2 does not exist"));
  CHECK_THROWS_WITH(single.upload_batch(batches[0], 1), Catch::Contains("input slot 1 does not exist"));
  Element wrong = batch_of(m, 4, 1);
  wrong.batch = 8;
  CHECK_THROWS_AS(dbl.upload_batch(wrong, 0), DataError);
}

TEST_CASE("the single runner's prefetch gives the same steps as copying each batch in the step", "[prefetch]") {
  // Every backend of this build that has a device: CPU (transfer thread), Vulkan (in-stream staging copies, the
  // default upload_async), CUDA (copy stream) where a GPU is present.
  std::vector<std::string> backends;
  for (const char* name : {"cpu", "vulkan", "cuda"}) {
    if (!test::registry().has_backend(name)) {
      WARN("prefetch on backend " << name << ": skipped, this build has no such backend");
      continue;
    }
    auto b = test::registry().backend(name)(BackendOptions{});
    if (b->enumerate().empty()) {
      WARN("prefetch on backend " << name << ": skipped, no device: " << b->unavailable_reason());
      continue;
    }
    backends.push_back(name);
  }
  REQUIRE_FALSE(backends.empty());
  const std::string backend = GENERATE_COPY(from_range(backends));
  INFO("backend " << backend);
  ModelSpec m = mlp();
  OptimizerSpec adam;
  adam.lr = 0.01;
  // A smaller last batch runs on another executor sharing the input region; 6 or 7 full batches before it put the
  // last full batch in either slot while the small one uploads.
  const int full = GENERATE(6, 7);
  INFO(full << " full batches, then two of 5");
  std::vector<Element> batches;
  for (int k = 0; k < full; ++k) batches.push_back(batch_of(m, 8, 200 + uint32_t(k)));
  batches.push_back(batch_of(m, 5, 300));
  batches.push_back(batch_of(m, 5, 301));

  auto run = [&](int slots, bool prefetch, std::map<std::string, HostTensor>& state) {
    auto be = test::registry().backend(backend)(BackendOptions{});
    auto dev = be->open(0);
    Allocator alloc(*dev, AllocatorOptions{});
    RunnerContext ctx;
    ctx.model = &m;
    ctx.optimizer = &adam;
    ctx.devices = {DeviceContext{dev.get(), &alloc}};
    ctx.global_batch = 8;
    ctx.seed = 9;
    ctx.input_slots = slots;
    std::vector<float> losses;
    {
      SingleDeviceRunner r(ctx, 0);
      r.prepare(8);
      for (size_t k = 0; k < batches.size(); ++k) {
        // step 3's batch is not prefetched (the runner copies it itself), step 4's is prefetched twice
        if (prefetch && k + 1 < batches.size() && k != 2) r.prefetch(batches[k + 1]);
        if (prefetch && k == 3) r.prefetch(batches[k + 1]);
        losses.push_back(r.train_step(batches[k], {int64_t(k), 0.01f}).total_loss);
      }
      state = r.save_state();
      if (prefetch) r.prefetch(batches[0]);  // left pending: the runner waits for it when it is destroyed
    }
    return losses;
  };
  std::map<std::string, HostTensor> plain_state, pf_state;
  auto plain = run(1, false, plain_state);
  auto pf = run(2, true, pf_state);
  CHECK(plain == pf);
  require_same_state(plain_state, pf_state);
}

TEST_CASE("cuda uploads on the copy stream are ordered before later ops and copies (skipped without a CUDA device)",
          "[prefetch][cuda]") {
  if (!test::registry().has_backend("cuda")) {
    KILN_SKIP("this build has no CUDA backend");
  }
  auto b = test::registry().backend("cuda")(BackendOptions{});
  if (b->enumerate().empty()) {
    KILN_SKIP("no CUDA device: " << b->unavailable_reason());
  }
  auto dev = b->open(0);
  const size_t n = (size_t{20} << 20) / sizeof(float);  // 20 MiB: several pinned chunks
  Block* blk = dev->allocate_block(n * sizeof(float));
  REQUIRE(blk);
  std::vector<float> a(n), c(n);
  for (size_t i = 0; i < n; ++i) a[i] = float(i % 1000);
  uint64_t t1 = dev->upload_async(a.data(), BufferView{blk, 0, n * sizeof(float)});
  dev->wait_upload(t1);
  dev->copy_to_host(BufferView{blk, 0, n * sizeof(float)}, c.data());  // on the op stream, after the wait
  CHECK(a == c);
  CHECK_THROWS_WITH(dev->wait_upload(t1), Catch::Contains("not pending"));
  dev->free_block(blk);
}
