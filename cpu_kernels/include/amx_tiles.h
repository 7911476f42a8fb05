// What every AMX body shares: the tile configuration's layout and the request for the
// tile state. Present in the amx build only.
#pragma once

#include "isa.h"

#ifdef PAGODE_AMX
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace pagode_amx {

// The 64 bytes LDTILECFG reads (palette 1): each tile's rows and bytes per row.
struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Linux hands out the tile state on request, once per process; a tile instruction without
// it faults.
inline void request_tiles() {
    static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    (void)granted;
}

// Every one of the eight tiles as 16 rows of 64 bytes (the full size), loaded for this thread.
inline void configure_full_tiles() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

}  // namespace pagode_amx

#endif  // PAGODE_AMX
