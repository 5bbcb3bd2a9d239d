// Kiln's error hierarchy: callers catch by type, never by matching strings.
#pragma once
#include <stdexcept>
#include <string>

namespace kiln {

// Base of every error Kiln throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad configuration value, key or file. The host app maps it to exit code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A plugin could not be loaded or registered (missing file, no entry, wrong API version).
class PluginError : public Error {
 public:
  using Error::Error;
};

// A device or driver call failed, or a device does not exist.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// Input data is missing, truncated or malformed.
class DataError : public Error {
 public:
  using Error::Error;
};

// A numeric failure during training (non-finite loss or activation).
class NumericError : public Error {
 public:
  using Error::Error;
};

}  // namespace kiln
