// The file-system rules of every command (kiln/files.hpp).
#include "kiln/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include "kiln/error.hpp"

namespace kiln {

namespace fs = std::filesystem;

std::string regular_file_problem(const std::string& path) {
  if (path.empty()) return "no file name given";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) {
      struct stat l {};
      return ::lstat(path.c_str(), &l) == 0 ? "is a symbolic link to a file that does not exist" : std::strerror(e);
    }
    return std::string("cannot be read: ") + std::strerror(e);
  }
  if (S_ISREG(st.st_mode)) return {};
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, not a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, not a regular file";
  return "is not a regular file";
}

void require_regular_file(const std::string& path, const std::string& what) {
  if (std::string why = regular_file_problem(path); !why.empty())
    throw DataError(path + ": " + why + "; expected " + what);
}

bool is_run_file_name(const std::string& name) {
  static const std::regex re(
      R"((checkpoint[^/]*\.kiln|config\.toml|run\.json|metrics\.jsonl|vocab\.json|\.kiln\.lock|events\.out\.tfevents\..*)(\.tmp(\.[0-9]+)?)?)");
  return std::regex_match(name, re);
}

namespace {

// The directory that holds `p` ("." for a bare name).
fs::path parent_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !b.empty() && fs::equivalent(a, b, ec) && !ec;
}

}  // namespace

void check_output_file(const std::string& path, const std::string& option, bool overwrite,
                       const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (path.empty()) throw ConfigError(option + " is empty; give a file name");
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) throw ConfigError(option + " " + path + " is a directory; give a file name");
  const fs::path dir = parent_of(p);
  if (!fs::is_directory(dir, ec))
    throw ConfigError(option + " " + path + ": the directory '" + dir.string() + "' " +
                      (fs::exists(dir, ec) ? "is not a directory" : "does not exist") + "; create it first");
  for (const auto& [in, from] : inputs)
    if (same_file(path, in))
      throw ConfigError(option + " " + path + " is " +
                        (in == path ? from : "the same file as " + in + " (" + from + ")") +
                        ", which this command reads; write to another file");
  // Through a link or not, the file written lands in the directory of the path's target.
  const fs::path target = fs::weakly_canonical(p, ec);
  const fs::path tdir = ec ? dir : parent_of(target);
  const std::string name = ec ? p.filename().string() : target.filename().string();
  const bool run_dir = fs::exists(tdir / ".kiln.lock", ec) || fs::exists(tdir / "checkpoint.kiln", ec);
  if (run_dir && is_run_file_name(name))
    throw ConfigError(option + " " + path + " is a file of the run in " + tdir.string() +
                      " (kiln train writes and reads it there); write to another file name or directory");
  if (fs::exists(p, ec) && !overwrite)
    throw ConfigError(
        option + " " + path +
        " already exists; it is not overwritten silently: pass --overwrite to replace it, or choose another name");
}

int open_no_follow(const std::string& path, int flags, unsigned mode) {
  return ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, static_cast<mode_t>(mode));
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  // Exclusive: a name already there (a link planted in its place, or a file left by a killed writer of the same pid)
  // is removed and the creation tried once more; a link is never written through.
  int fd = open_no_follow(tmp, O_WRONLY | O_CREAT | O_EXCL);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) fd = open_no_follow(tmp, O_WRONLY | O_CREAT | O_EXCL);
  if (fd < 0) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(tmp + ": write failed: " + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);  // best effort: some file systems have no fsync, and the rename below is what readers see
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot put the file in place (renaming " + tmp + "): " + std::strerror(e));
  }
}

}  // namespace kiln
