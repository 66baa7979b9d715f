// runtime.cpp: runs a kernel's grid on the CPU. Each CUDA thread of a block is a fiber (a
// ucontext with its own stack) on the launching host thread; a scheduler runs them in turn, each
// until it reaches a barrier or returns, and releases a barrier once every fiber that still runs
// the kernel has reached it. Blocks run one after another (so a function-local static is the
// running block's __shared__ memory) and launches one at a time, process-wide. Deterministic:
// the same launch interleaves its threads the same way every time, first thread to last, or
// last to first with KVLAB_EMU_REVERSE=1; a thread runs until it blocks, so a shared-memory read
// that lacks its barrier reads a slot a thread later in the order has not written yet.
#if !defined(__x86_64__) || defined(KVLAB_EMU_UCONTEXT)
#define KVLAB_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(KVLAB_EMU_USE_UCONTEXT)
// AddressSanitizer is told about every stack switch (its fiber interface), so it keeps checking
// the fibers' stacks instead of mistaking a switch for a stack overflow.
#define KVLAB_EMU_ASAN_FIBERS 1
#include <sanitizer/common_interface_defs.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_emu.h"
#include "kvlab_emu.h"

namespace kvlab_emu {

dim3 thread_idx;
dim3 block_idx;
dim3 block_dim;
dim3 grid_dim;

namespace {

// A fiber's saved machine state and how to switch to it. On x86-64 a switch saves the
// callee-saved registers on the old stack and loads the new stack pointer (no system call;
// swapcontext's signal-mask calls made the emulator ten times slower); elsewhere, and under
// -DKVLAB_EMU_UCONTEXT, ucontext (which sanitizers know how to follow).
#ifdef KVLAB_EMU_USE_UCONTEXT
struct Context {
    ucontext_t uc;
};
#else
struct Context {
    void* sp = nullptr;
};
extern "C" void kvlab_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl kvlab_emu_switch
    .type kvlab_emu_switch,@function
kvlab_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kvlab_emu_switch, .-kvlab_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

enum class Wait { None, Block, Warp, Done };

struct Fiber {
    Context ctx;
    std::unique_ptr<char[]> stack;
    dim3 idx;
    Wait wait = Wait::None;
};

// Bytes of stack per CUDA thread: the kernels keep a few hundred bytes of locals.
constexpr size_t kStack = 64 * 1024;

struct Launch {
    const KernelEntry* entry = nullptr;
    void** args = nullptr;
    std::vector<Fiber> fibers;
    Context scheduler;
    int running = -1;          // the fiber now running
    bool reverse = false;      // KVLAB_EMU_REVERSE=1: run the fibers last to first
    uint32_t slots[1024];      // warp exchange: one slot per thread
};

Launch* L = nullptr;

#ifdef KVLAB_EMU_ASAN_FIBERS
// The scheduler's stack, as ASan reported it at the first switch into a fiber.
const void* scheduler_stack_bottom = nullptr;
size_t scheduler_stack_size = 0;
#endif

// Switches to `load`, whose stack is [bottom, bottom + size) (the scheduler's: nullptr, 0).
// `leaving`: the current fiber never runs again.
void switch_to(Context& save, Context& load, const void* bottom, size_t size, bool leaving) {
#ifdef KVLAB_EMU_USE_UCONTEXT
    (void)bottom;
    (void)size;
    (void)leaving;
    swapcontext(&save.uc, &load.uc);
#else
#ifdef KVLAB_EMU_ASAN_FIBERS
    void* fake_stack = nullptr;
    if (bottom == nullptr) {
        bottom = scheduler_stack_bottom;
        size = scheduler_stack_size;
    }
    __sanitizer_start_switch_fiber(leaving ? nullptr : &fake_stack, bottom, size);
#else
    (void)bottom;
    (void)size;
    (void)leaving;
#endif
    kvlab_emu_switch(&save.sp, load.sp);
#ifdef KVLAB_EMU_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
#endif
}

void fiber_main() {
#ifdef KVLAB_EMU_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
    L->entry->run(L->args);
    Fiber& f = L->fibers[L->running];
    f.wait = Wait::Done;
    switch_to(f.ctx, L->scheduler, nullptr, 0, true);  // never resumed
    std::abort();
}

// A fresh context for fiber f that starts in fiber_main on f's stack.
void start(Fiber& f) {
#ifdef KVLAB_EMU_USE_UCONTEXT
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc.uc_stack.ss_size = kStack;
    f.ctx.uc.uc_link = nullptr;
    makecontext(&f.ctx.uc, fiber_main, 0);
#else
    // The first switch pops six zero registers and "returns" into fiber_main with the stack
    // 8 bytes off a 16-byte boundary, as after a call.
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.get()) + kStack) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                                    // fiber_main's return address: none
    *--sp = reinterpret_cast<void*>(&fiber_main);        // where the first switch returns
    for (int i = 0; i < 6; ++i) *--sp = nullptr;         // r15 r14 r13 r12 rbx rbp
    f.ctx.sp = sp;
#endif
}

// Parks the running fiber at a barrier of `kind` and returns once the scheduler releases it.
void park(Wait kind) {
    Fiber& f = L->fibers[L->running];
    f.wait = kind;
    switch_to(f.ctx, L->scheduler, nullptr, 0, false);
}

int warp_of(int t) { return t / 32; }

// Releases what can be released; false when no fiber can run (every one done, or deadlock).
bool release(int n) {
    bool any = false;
    // A warp barrier opens when every live lane of the warp waits at it.
    for (int w0 = 0; w0 < n; w0 += 32) {
        const int w1 = std::min(n, w0 + 32);
        bool all = true, some = false;
        for (int t = w0; t < w1; ++t) {
            const Wait k = L->fibers[t].wait;
            if (k == Wait::Done) continue;
            if (k != Wait::Warp) all = false; else some = true;
        }
        if (all && some) {
            for (int t = w0; t < w1; ++t)
                if (L->fibers[t].wait == Wait::Warp) L->fibers[t].wait = Wait::None;
            any = true;
        }
    }
    if (any) return true;
    // The block barrier opens when every live thread waits at it.
    bool all = true, some = false;
    for (int t = 0; t < n; ++t) {
        const Wait k = L->fibers[t].wait;
        if (k == Wait::Done) continue;
        if (k != Wait::Block) all = false; else some = true;
    }
    if (all && some) {
        for (int t = 0; t < n; ++t)
            if (L->fibers[t].wait == Wait::Block) L->fibers[t].wait = Wait::None;
        return true;
    }
    if (some || std::any_of(L->fibers.begin(), L->fibers.end(),
                            [](const Fiber& f) { return f.wait == Wait::Warp; })) {
        std::fprintf(stderr,
                     "kvlab-cuda-emu: deadlock in block (%u, %u, %u): threads wait at different "
                     "barriers (a __syncthreads or warp function not reached by every thread)\n",
                     block_idx.x, block_idx.y, block_idx.z);
        std::abort();
    }
    return false;  // every fiber is done
}

void run_block() {
    const int n = (int)L->fibers.size();
    for (int t = 0; t < n; ++t) {
        Fiber& f = L->fibers[t];
        f.wait = Wait::None;
        start(f);
    }
    for (;;) {
        bool ran = false;
        for (int i = 0; i < n; ++i) {
            const int t = L->reverse ? n - 1 - i : i;
            Fiber& f = L->fibers[t];
            if (f.wait != Wait::None) continue;
            L->running = t;
            thread_idx = f.idx;
            switch_to(L->scheduler, f.ctx, f.stack.get(), kStack, false);
            ran = true;
        }
        if (!ran && !release(n)) return;
    }
}

}  // namespace

void sync_block() { park(Wait::Block); }

uint32_t warp_exchange(uint32_t bits, int src) {
    const int me = L->running;
    const int base = warp_of(me) * 32;
    L->slots[me] = bits;
    park(Wait::Warp);
    const int n = (int)L->fibers.size();
    const int from = base + src;
    const uint32_t got =
        (src >= 0 && src < 32 && from < n && L->fibers[from].wait != Wait::Done) ? L->slots[from]
                                                                                  : bits;
    park(Wait::Warp);  // nobody overwrites a slot before every lane has read
    return got;
}

bool warp_any(bool pred) {
    const int me = L->running;
    const int base = warp_of(me) * 32;
    L->slots[me] = pred ? 1u : 0u;
    park(Wait::Warp);
    const int n = std::min((int)L->fibers.size(), base + 32);
    bool any = false;
    for (int t = base; t < n; ++t) any = any || (L->fibers[t].wait != Wait::Done && L->slots[t]);
    park(Wait::Warp);
    return any;
}

}  // namespace kvlab_emu

using namespace kvlab_emu;

extern "C" int kvlab_emu_launch(const char* name, const unsigned int grid[3],
                                const unsigned int block[3], void** args) {
    const KernelEntry* entry = find_kernel(name);
    if (entry == nullptr) return 1;
    const long long threads = (long long)block[0] * block[1] * block[2];
    if (threads <= 0 || threads > 1024 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return 2;
    static std::mutex one_launch_at_a_time;
    std::lock_guard<std::mutex> guard(one_launch_at_a_time);
    Launch l;
    l.entry = entry;
    l.args = args;
    const char* rev = std::getenv("KVLAB_EMU_REVERSE");
    l.reverse = rev != nullptr && rev[0] == '1';
    l.fibers.resize((size_t)threads);
    for (int t = 0; t < (int)threads; ++t) {
        l.fibers[t].stack.reset(new char[kStack]);
        l.fibers[t].idx =
            dim3{t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
    }
    L = &l;
    grid_dim = dim3{grid[0], grid[1], grid[2]};
    block_dim = dim3{block[0], block[1], block[2]};
    for (unsigned int z = 0; z < grid[2]; ++z)
        for (unsigned int y = 0; y < grid[1]; ++y)
            for (unsigned int x = 0; x < grid[0]; ++x) {
                block_idx = dim3{x, y, z};
                run_block();
            }
    L = nullptr;
    return 0;
}
