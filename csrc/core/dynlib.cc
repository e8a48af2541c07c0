#include "core/dynlib.h"

#include <dlfcn.h>

#include <utility>

namespace pycollective {

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

DynamicLibrary::DynamicLibrary(DynamicLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), name_(std::move(other.name_)) {}

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
  }
  return *this;
}

DynamicLibrary DynamicLibrary::open(const std::string& name, std::string* error) {
  DynamicLibrary lib;
  lib.name_ = name;
  dlerror();  // clear a stale error
  lib.handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle_ == nullptr && error != nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : "dlopen failed without an error message";
  }
  return lib;
}

void* DynamicLibrary::symbol(const char* symbolName, std::string* error) const {
  if (handle_ == nullptr) {
    if (error != nullptr) *error = "library not loaded";
    return nullptr;
  }
  dlerror();
  void* sym = dlsym(handle_, symbolName);
  if (sym == nullptr && error != nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : std::string("symbol ") + symbolName + " is null";
  }
  return sym;
}

std::string DynamicLibrary::resolvedPath(const char* anySymbol) const {
  void* sym = symbol(anySymbol, nullptr);
  Dl_info info{};
  if (sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr) return info.dli_fname;
  return name_;
}

}  // namespace pycollective
