// The emulator's registry: every kernel entry point of kernels/*.cu, by name (build.rs writes one
// translation unit per kernel file, each listing its entries from src/kernels.rs).
#ifndef KVLAB_EMU_REGISTRY_H
#define KVLAB_EMU_REGISTRY_H

#include <cstddef>
#include <type_traits>
#include <utility>

namespace kvlab_emu {

struct KernelEntry {
    const char* name;
    // Calls the kernel with args[i] pointing at its i-th parameter (cuLaunchKernel's layout).
    void (*run)(void** args);
};

template <typename... P, std::size_t... I>
void call_with(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}
template <typename... P>
void call(void (*kernel)(P...), void** args) {
    call_with(kernel, args, std::index_sequence_for<P...>{});
}

const KernelEntry* find_kernel(const char* name);

}  // namespace kvlab_emu

#endif
