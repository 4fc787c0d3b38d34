  .text
  // kernarg: in (64 lanes x 16 bytes: A's 4 halves, then B's 4), out (64 lanes x 3 x 64 bytes)
  s_load_dwordx4 s[4:7], s[0:1], 0
  v_lshlrev_b32 v1, 4, v0                  // 16 * lane
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v3, s5
  v_add_co_u32 v2, vcc, s4, v1
  v_addc_co_u32 v3, vcc, 0, v3, vcc        // v[2:3] = in + 16 lane
  global_load_dwordx4 v[20:23], v[2:3], off // A = v[20:21], B = v[22:23]
  s_waitcnt vmcnt(0)
  v_accvgpr_write_b32 a0, v20
  v_accvgpr_write_b32 a1, v21
  v_accvgpr_write_b32 a2, v22
  v_accvgpr_write_b32 a3, v23
  s_nop 2
  v_mfma_f32_32x32x8_f16 v[32:47], v[20:21], v[22:23], 0   // reference: A and B in VGPRs
  v_mfma_f32_32x32x8_f16 v[48:63], a[0:1], v[22:23], 0     // A in AGPRs (ACC bit 59)
  v_mfma_f32_32x32x8_f16 v[64:79], v[20:21], a[2:3], 0     // B in AGPRs (ACC bit 60)
  s_nop 7
  s_nop 7
  s_nop 7
  v_mul_u32_u24 v4, 0xc0, v0               // 192 * lane
  v_mov_b32 v9, s7
  v_add_co_u32 v8, vcc, s6, v4
  v_addc_co_u32 v9, vcc, 0, v9, vcc        // v[8:9] = out + 192 lane
  global_store_dwordx4 v[8:9], v[32:35], off
  global_store_dwordx4 v[8:9], v[36:39], off offset:16
  global_store_dwordx4 v[8:9], v[40:43], off offset:32
  global_store_dwordx4 v[8:9], v[44:47], off offset:48
  global_store_dwordx4 v[8:9], v[48:51], off offset:64
  global_store_dwordx4 v[8:9], v[52:55], off offset:80
  global_store_dwordx4 v[8:9], v[56:59], off offset:96
  global_store_dwordx4 v[8:9], v[60:63], off offset:112
  global_store_dwordx4 v[8:9], v[64:67], off offset:128
  global_store_dwordx4 v[8:9], v[68:71], off offset:144
  global_store_dwordx4 v[8:9], v[72:75], off offset:160
  global_store_dwordx4 v[8:9], v[76:79], off offset:176
  s_endpgm
