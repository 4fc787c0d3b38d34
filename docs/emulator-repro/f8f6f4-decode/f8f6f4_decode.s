// Two unscaled v_mfma_f32_32x32x64_f8f6f4 with the same inputs (gfx950): A = B = e4m3 1.0, C = 0,
// so D = 64 everywhere. Each is preceded by two adds of 1 and 2 to a counter (3 when both ran).
// MFMA 1: an 8-byte then a 4-byte instruction before it (no instruction starts 8 bytes before it).
// MFMA 2: two 4-byte instructions before it (one starts 8 bytes before it).
// Output per lane l: out[16 l + r] = MFMA 1's register r, out[1024 + 16 l + r] = MFMA 2's,
// out[2048 + l] = counter 1 (v49), out[2112 + l] = counter 2 (v48).
  .text
  s_load_dwordx2 s[2:3], s[0:1], 0
  v_mov_b32 v2, 0x38383838
  v_mov_b32 v3, 0x38383838
  v_mov_b32 v4, 0x38383838
  v_mov_b32 v5, 0x38383838
  v_mov_b32 v6, 0x38383838
  v_mov_b32 v7, 0x38383838
  v_mov_b32 v8, 0x38383838
  v_mov_b32 v9, 0x38383838
  v_mov_b32 v10, 0x38383838
  v_mov_b32 v11, 0x38383838
  v_mov_b32 v12, 0x38383838
  v_mov_b32 v13, 0x38383838
  v_mov_b32 v14, 0x38383838
  v_mov_b32 v15, 0x38383838
  v_mov_b32 v16, 0x38383838
  v_mov_b32 v17, 0x38383838
  .irp r, 32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,48,49
  v_mov_b32 v\r, 0
  .endr
  v_add_u32_e64 v49, 1, v49
  v_add_u32 v49, 2, v49
  v_mfma_f32_32x32x64_f8f6f4 v[32:47], v[2:9], v[10:17], v[32:47]
  v_add_u32 v48, 1, v48
  v_add_u32 v48, 2, v48
  v_mfma_f32_32x32x64_f8f6f4 v[64:79], v[2:9], v[10:17], v[64:79]
  s_nop 7
  s_nop 7
  s_nop 7
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v22, 6, v0                // 64 bytes per lane
  v_mov_b32 v23, s3
  v_add_co_u32 v22, vcc, s2, v22
  v_addc_co_u32 v23, vcc, 0, v23, vcc
  global_store_dwordx4 v[22:23], v[32:35], off
  global_store_dwordx4 v[22:23], v[36:39], off offset:16
  global_store_dwordx4 v[22:23], v[40:43], off offset:32
  global_store_dwordx4 v[22:23], v[44:47], off offset:48
  v_add_co_u32 v22, vcc, 0x1000, v22       // + 4096 bytes: MFMA 2
  v_addc_co_u32 v23, vcc, 0, v23, vcc
  global_store_dwordx4 v[22:23], v[64:67], off
  global_store_dwordx4 v[22:23], v[68:71], off offset:16
  global_store_dwordx4 v[22:23], v[72:75], off offset:32
  global_store_dwordx4 v[22:23], v[76:79], off offset:48
  v_lshlrev_b32 v24, 2, v0                 // 4 bytes per lane: the counters
  v_mov_b32 v25, s3
  v_add_co_u32 v24, vcc, s2, v24
  v_addc_co_u32 v25, vcc, 0, v25, vcc
  v_add_co_u32 v24, vcc, 0x2000, v24       // + 8192 bytes
  v_addc_co_u32 v25, vcc, 0, v25, vcc
  global_store_dword v[24:25], v49, off
  global_store_dword v[24:25], v48, off offset:256
  s_endpgm
