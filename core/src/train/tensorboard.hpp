// TensorBoard event files for a run's scalars ([log] tensorboard = true): TFRecord framing (length, masked CRC-32C of
// the length, data, masked CRC-32C of the data) around Event protobufs (wall_time, step, summary { value { tag,
// simple_value } }), encoded by hand in protobuf's wire format. TensorBoard reads output_dir as a log directory.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// CRC-32C (Castagnoli), as TFRecord uses it, and its "masked" form stored in the file.
uint32_t crc32c(const void* data, size_t n);
inline uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host>.<pid> and writes the file_version event.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` holding a simple_value per (tag, value).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Removes the event files (events.out.tfevents.*) in `dir`, when a run there starts over: TensorBoard reads every
// event file of a log directory as one run. Returns how many it removed.
int remove_tensorboard_events(const std::string& dir);

// Reads back every record of an event file, checking both CRCs of each (tests, and anyone checking a file): the
// Events' raw bytes. Throws Error naming the file and the record's offset on a damaged record.
std::vector<std::string> read_tfrecords(const std::string& path);

}  // namespace kiln
