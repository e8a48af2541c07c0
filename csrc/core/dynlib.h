#pragma once
// RAII dlopen/dlsym that keeps the loader's error text, so a failure can say exactly what was
// tried and why it failed (used by the NCCL loader; gloo's dynamic_library does the same job).
#include <string>

namespace pycollective {

class DynamicLibrary {
 public:
  DynamicLibrary() = default;
  ~DynamicLibrary();
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  // dlopen(name, RTLD_NOW | RTLD_LOCAL). On failure returns an unloaded library and sets
  // *error to dlerror()'s text.
  static DynamicLibrary open(const std::string& name, std::string* error);

  bool loaded() const { return handle_ != nullptr; }
  const std::string& name() const { return name_; }

  // dlsym(name); nullptr with *error set when the symbol is missing.
  void* symbol(const char* symbolName, std::string* error) const;

  // The file the loader actually opened (dladdr of a symbol), or name() when unknown.
  std::string resolvedPath(const char* anySymbol) const;

 private:
  void* handle_ = nullptr;
  std::string name_;
};

}  // namespace pycollective
