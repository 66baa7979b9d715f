// The emulator's stand-in for CUDA's cuda_fp16.h: everything is in cuda_emu.h.
#include "cuda_emu.h"
