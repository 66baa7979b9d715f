// The emulator's stand-in for CUDA's cuda_fp8.h: everything is in cuda_emu.h.
#include "cuda_emu.h"
