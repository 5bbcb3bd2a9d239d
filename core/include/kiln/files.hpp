// The file-system rules every command follows: a path it reads is a regular file (a directory, FIFO or device never
// reaches a reader, where it would mean a hang or an allocation of its "size"), a file it writes is never one of the
// files it reads nor a file of a run directory, and a file it creates never follows a symbolic link planted in its
// place.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// Why `path` cannot be read as a file: "no such file", "is a directory", "is a FIFO (named pipe)", ...; empty when
// it is a regular file (or a link to one) that exists.
std::string regular_file_problem(const std::string& path);

// Throws DataError "<path>: <problem>; expected <what>" when `path` is not a regular file.
void require_regular_file(const std::string& path, const std::string& what);

// The names of the files a run directory holds (checkpoint*.kiln, config.toml, run.json, metrics.jsonl, vocab.json,
// .kiln.lock, TensorBoard's event files and the temporaries of each): `name` is one of them.
bool is_run_file_name(const std::string& name);

// A file a command is about to write. `inputs` are the files the command reads, each with the option or key it came
// from ("--checkpoint", "the config file"). Refused with ConfigError (a usage error, exit 2), the message naming
// `option`: an empty path; a directory; a path whose directory does not exist; the same file as one of `inputs`
// (also through a link); a file of a run directory (a directory holding .kiln.lock, or a name of is_run_file_name
// next to a checkpoint.kiln); an existing file unless `overwrite`.
void check_output_file(const std::string& path, const std::string& option, bool overwrite,
                       const std::vector<std::pair<std::string, std::string>>& inputs);

// open(2) for a file Kiln creates or rewrites, never through a symbolic link at `path` (O_NOFOLLOW) and with
// O_CLOEXEC; `flags` as for open (O_WRONLY | O_CREAT | ...). Returns the descriptor, or -1 with errno set (ELOOP
// for a link).
int open_no_follow(const std::string& path, int flags, unsigned mode = 0644);

// Writes `text` to `path` through a new temporary file beside it (created exclusively, never through a link), synced
// to disk and renamed over `path`. Throws Error naming the file.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kiln
