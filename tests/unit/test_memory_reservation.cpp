// Cooperative reservations: lock files per device, refusal naming the holders, stale files cleaned up.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kiln/error.hpp"
#include "kiln/reservation.hpp"
#include "test_support.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

DeviceInfo fake_gpu() {
  DeviceInfo d;
  d.backend = "cuda";
  d.index = 1;
  d.name = "Test GPU";
  d.hardware_id = "GPU-1234/abcd";  // the slash must not escape the reservation directory
  d.total_memory = size_t(8) << 30;
  return d;
}

size_t json_files(const fs::path& dir) {
  size_t n = 0;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".json";
  return n;
}

}  // namespace

TEST_CASE("a reservation is recorded, seen by others, and removed when released", "[memory]") {
  const std::string root = test::temp_dir("resv").string();
  const DeviceInfo d = fake_gpu();
  const size_t GiB = size_t(1) << 30;
  CHECK(live_reservations(d.hardware_id, root).empty());
  {
    auto r = Reservation::acquire(d, 3 * GiB, d.total_memory, root);
    REQUIRE(r);
    CHECK(fs::path(r->file()).parent_path().parent_path() == fs::path(root));  // one directory per device
    auto live = live_reservations(d.hardware_id, root);
    REQUIRE(live.size() == 1);
    CHECK(live[0].pid == ::getpid());
    CHECK(live[0].bytes == 3 * GiB);
    CHECK(live[0].device == "cuda:1");
    CHECK_FALSE(live[0].user.empty());
    CHECK_THAT(live[0].command, Catch::Contains("kiln_unit_tests"));
    // A second job that would overcommit the device refuses and names the holder.
    try {
      Reservation::acquire(d, 6 * GiB, d.total_memory, root);
      FAIL("an overcommitting reservation was granted");
    } catch (const DeviceError& e) {
      std::string m = e.what();
      CHECK_THAT(m, Catch::Contains("pid " + std::to_string(::getpid())));
      CHECK_THAT(m, Catch::Contains("kiln_unit_tests"));
      CHECK_THAT(m, Catch::Contains("3.00 GiB"));
      CHECK_THAT(m, Catch::Contains("at most 5.00 GiB"));
    }
    // One that fits beside it is granted.
    auto r2 = Reservation::acquire(d, 5 * GiB, d.total_memory, root);
    REQUIRE(r2);
    CHECK(total_bytes(live_reservations(d.hardware_id, root)) == 8 * GiB);
  }
  CHECK(live_reservations(d.hardware_id, root).empty());
  CHECK(json_files(fs::path(root) / "GPU-1234_abcd") == 0);
}

TEST_CASE("a reservation file nobody holds is stale and removed", "[memory]") {
  const std::string root = test::temp_dir("resv-stale").string();
  const DeviceInfo d = fake_gpu();
  fs::path dir = fs::path(root) / "GPU-1234_abcd";
  fs::create_directories(dir);
  // What a killed process leaves behind: the file, without its lock.
  std::ofstream(dir / "999999-0.json")
      << "{\"pid\": 999999, \"user\": \"ghost\", \"command\": \"kiln train x.toml\", \"bytes\": 8589934592}\n";
  CHECK(live_reservations(d.hardware_id, root).empty());
  CHECK_FALSE(fs::exists(dir / "999999-0.json"));
  // And so the whole device can be reserved again.
  CHECK(Reservation::acquire(d, d.total_memory, d.total_memory, root));
}

TEST_CASE("a held reservation stays live even when its content is unreadable, and requests above capacity are refused",
          "[memory]") {
  const std::string root = test::temp_dir("resv-held").string();
  const DeviceInfo d = fake_gpu();
  fs::path dir = fs::path(root) / "GPU-1234_abcd";
  fs::create_directories(dir);
  int fd = ::open((dir / "1-0.json").c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  CHECK(live_reservations(d.hardware_id, root).size() == 1);
  ::close(fd);
  CHECK(live_reservations(d.hardware_id, root).empty());
  CHECK_THROWS_AS(Reservation::acquire(d, d.total_memory + 1, d.total_memory, root), DeviceError);
}

TEST_CASE("KILN_RESERVATION_DIR chooses the directory and \"off\" disables reservations", "[memory]") {
  const char* old = std::getenv("KILN_RESERVATION_DIR");
  std::string saved = old ? old : "";
  ::setenv("KILN_RESERVATION_DIR", "off", 1);
  CHECK(reservation_root().empty());
  CHECK_FALSE(Reservation::acquire(fake_gpu(), 1, 2));
  ::setenv("KILN_RESERVATION_DIR", "/tmp/somewhere", 1);
  CHECK(reservation_root() == "/tmp/somewhere");
  ::unsetenv("KILN_RESERVATION_DIR");
  CHECK(reservation_root() == "/tmp/kiln-reservations");
  if (old) ::setenv("KILN_RESERVATION_DIR", saved.c_str(), 1);
}
