// Kernels with bugs planted on purpose, compiled into the emulator only (never into the engine):
// crates/cuda/tests/emu_planted.rs shows that the emulator's checks catch each.

// Writes x[0..=n]: one element past the end of its n elements (AddressSanitizer's report, under
// scripts/cuda/emu-sanitize.sh).
extern "C" __global__ void planted_out_of_bounds_v1(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) x[i] = 1.0f;
}

// Reverses x (blockDim.x elements) through shared memory, without the __syncthreads between
// the writes and the reads: a thread reads a slot another thread has not written yet. The
// emulator runs each thread until it blocks, first to last (or last to first with
// KVLAB_EMU_REVERSE=1), so the stale read shows in the result on every run.
extern "C" __global__ void planted_missing_sync_v1(float* x) {
    __shared__ float s[1024];
    s[threadIdx.x] = x[threadIdx.x];
    x[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}
