// Cooperative reservations: flock()ed JSON files under <root>/<hardware id>/, one per reserving process.
#include "kiln/reservation.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "kiln/allocator.hpp"
#include "kiln/error.hpp"

namespace kiln {

namespace {

std::string sanitize(const std::string& id) {
  std::string s;
  for (char c : id)
    s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':') ? c : '_';
  if (s.empty() || s[0] == '.') s = "_" + s;
  return s;
}

// Creates `path` shared by every user of the host (sticky, world-writable like /tmp). False if it cannot exist.
bool ensure_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 01777) == 0) {
    ::chmod(path.c_str(), 01777);  // umask may have narrowed it
    return true;
  }
  struct stat st {};
  return errno == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The directory-wide lock that makes check-then-record atomic across processes.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    fd_ = ::open((dir + "/.lock").c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      o += ' ';
    else
      o += c;
  }
  return o;
}

// Reads "key": value from a flat JSON object written by to_json (strings and integers only).
bool json_field(const std::string& js, const std::string& key, std::string& out) {
  auto k = js.find("\"" + key + "\"");
  if (k == std::string::npos) return false;
  auto p = js.find(':', k);
  if (p == std::string::npos) return false;
  ++p;
  while (p < js.size() && js[p] == ' ') ++p;
  out.clear();
  if (p < js.size() && js[p] == '"') {
    for (++p; p < js.size() && js[p] != '"'; ++p) {
      if (js[p] == '\\' && p + 1 < js.size()) ++p;
      out += js[p];
    }
    return p < js.size();
  }
  while (p < js.size() && (std::isdigit(static_cast<unsigned char>(js[p])) || js[p] == '-')) out += js[p++];
  return !out.empty();
}

int64_t to_i64(const std::string& s) {
  try {
    return std::stoll(s);
  } catch (...) {
    return 0;
  }
}

std::string to_json(const ReservationHolder& h, const std::string& hardware_id) {
  std::ostringstream os;
  os << "{\"pid\": " << h.pid << ", \"user\": \"" << json_escape(h.user) << "\", \"command\": \""
     << json_escape(h.command) << "\", \"run\": \"" << json_escape(h.run) << "\", \"device\": \""
     << json_escape(h.device) << "\", \"hardware_id\": \"" << json_escape(hardware_id) << "\", \"bytes\": " << h.bytes
     << ", \"start_time\": " << h.start_time << "}\n";
  return os.str();
}

ReservationHolder from_json(const std::string& js) {
  ReservationHolder h;
  std::string v;
  if (json_field(js, "pid", v)) h.pid = to_i64(v);
  if (json_field(js, "user", v)) h.user = v;
  if (json_field(js, "command", v)) h.command = v;
  if (json_field(js, "run", v)) h.run = v;
  if (json_field(js, "device", v)) h.device = v;
  if (json_field(js, "bytes", v)) h.bytes = static_cast<size_t>(std::max<int64_t>(0, to_i64(v)));
  if (json_field(js, "start_time", v)) h.start_time = to_i64(v);
  return h;
}

std::string current_user() {
  struct passwd pw {};
  struct passwd* res = nullptr;
  char buf[1024];
  if (::getpwuid_r(::geteuid(), &pw, buf, sizeof buf, &res) == 0 && res) return pw.pw_name;
  if (const char* u = std::getenv("USER")) return u;
  return "uid " + std::to_string(::geteuid());
}

std::string current_command() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), cmd;
  for (char c : raw) cmd += c == '\0' ? ' ' : c;
  while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
  // "kiln train x.toml" rather than the full path of the binary.
  const size_t first_end = std::min(cmd.find(' '), cmd.size());
  const size_t slash = cmd.rfind('/', first_end == 0 ? 0 : first_end - 1);
  if (slash != std::string::npos && slash < first_end) cmd = cmd.substr(slash + 1);
  if (cmd.size() > 160) cmd = cmd.substr(0, 157) + "...";
  return cmd.empty() ? "unknown command" : cmd;
}

std::vector<ReservationHolder> scan(const std::string& dir) {
  std::vector<ReservationHolder> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0) names.push_back(n);
  }
  ::closedir(d);
  for (const auto& n : names) {
    const std::string path = dir + "/" + n;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // nobody holds it: its process is gone
      ::unlink(path.c_str());
      ::close(fd);
      continue;
    }
    std::string js;
    char buf[1024];
    ssize_t r;
    while ((r = ::read(fd, buf, sizeof buf)) > 0) js.append(buf, static_cast<size_t>(r));
    ::close(fd);
    out.push_back(from_json(js));
  }
  return out;
}

std::atomic<int> g_counter{0};

}  // namespace

std::string ReservationHolder::describe() const {
  char when[64] = "?";
  std::time_t t = static_cast<std::time_t>(start_time);
  std::tm tm{};
  if (start_time > 0 && ::localtime_r(&t, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  std::ostringstream os;
  os << "pid " << pid << " (" << (user.empty() ? "unknown user" : user) << (run.empty() ? "" : ", run \"" + run + "\"")
     << ", `" << command << "`, " << format_bytes(bytes) << (device.empty() ? "" : " of " + device) << " since " << when
     << ")";
  return os.str();
}

std::string reservation_root() {
  const char* env = std::getenv("KILN_RESERVATION_DIR");
  if (env && *env) {
    std::string v = env;
    if (v == "off" || v == "none" || v == "0") return {};
    return v;
  }
  return "/tmp/kiln-reservations";
}

std::vector<ReservationHolder> live_reservations(const std::string& hardware_id, const std::string& root) {
  if (root.empty()) return {};
  const std::string dir = root + "/" + sanitize(hardware_id);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return {};
  DirLock lock(dir);
  return scan(dir);
}

size_t total_bytes(const std::vector<ReservationHolder>& holders) {
  size_t s = 0;
  for (const auto& h : holders) s += h.bytes;
  return s;
}

std::string format_holders(const std::vector<ReservationHolder>& holders) {
  std::string s;
  for (const auto& h : holders) s += "    " + h.describe() + "\n";
  return s;
}

std::unique_ptr<Reservation> Reservation::acquire(const DeviceInfo& device, size_t bytes, size_t capacity,
                                                  const std::string& root, const std::string& run) {
  if (root.empty()) return nullptr;
  const std::string dir = root + "/" + sanitize(device.hardware_id);
  if (!ensure_dir(root) || !ensure_dir(dir))
    throw DeviceError(
        "cannot record the memory reservation for " + device.label() + " in " + dir + ": " + std::strerror(errno) +
        ". Set KILN_RESERVATION_DIR to a writable directory shared by the host's Kiln jobs (or to \"off\").");
  DirLock lock(dir);
  auto others = scan(dir);
  const size_t promised = total_bytes(others);
  if (bytes > capacity || promised > capacity - bytes) {
    std::ostringstream os;
    os << "cannot reserve " << format_bytes(bytes) << " on " << device.label() << " (" << device.name
       << ", hardware id " << device.hardware_id << "): other Kiln jobs have reserved " << format_bytes(promised)
       << " of its " << format_bytes(capacity) << ", leaving "
       << format_bytes(promised < capacity ? capacity - promised : 0) << ". Holders:\n"
       << format_holders(others) << "Lower [device] memory_limit to at most "
       << format_bytes(promised < capacity ? capacity - promised : 0)
       << ", choose another device ([device] visible, or select = \"most_free_memory\"), or wait for a holder to "
          "finish.";
    throw DeviceError(os.str());
  }
  std::unique_ptr<Reservation> r(new Reservation());
  r->dir_ = dir;
  r->holder_.pid = ::getpid();
  r->holder_.user = current_user();
  r->holder_.command = current_command();
  r->holder_.run = run;
  r->holder_.device = device.label();
  r->holder_.bytes = bytes;
  r->holder_.start_time = static_cast<int64_t>(std::time(nullptr));
  r->file_ = dir + "/" + std::to_string(::getpid()) + "-" + std::to_string(g_counter.fetch_add(1)) + ".json";
  // The directory is shared by every user of the machine: never write through a link planted under this name.
  r->fd_ = ::open(r->file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (r->fd_ < 0 || ::flock(r->fd_, LOCK_EX | LOCK_NB) != 0)
    throw DeviceError("cannot create the reservation file " + r->file_ + ": " + std::strerror(errno));
  const std::string js = to_json(r->holder_, device.hardware_id);
  if (::write(r->fd_, js.data(), js.size()) != static_cast<ssize_t>(js.size()))
    throw DeviceError("cannot write the reservation file " + r->file_ + ": " + std::strerror(errno));
  return r;
}

Reservation::~Reservation() {
  if (fd_ < 0) return;
  DirLock lock(dir_);
  ::unlink(file_.c_str());
  ::close(fd_);
}

}  // namespace kiln
