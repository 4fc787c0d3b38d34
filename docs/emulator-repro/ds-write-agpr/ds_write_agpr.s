  .text
  // kernarg: in, out (64 lanes x 16 bytes each)
  s_load_dwordx4 s[4:7], s[0:1], 0
  v_lshlrev_b32 v1, 4, v0                 // byte offset 16 * lane
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v3, s5
  v_add_co_u32 v2, vcc, s4, v1
  v_addc_co_u32 v3, vcc, 0, v3, vcc       // v[2:3] = in + 16 lane
  global_load_dwordx4 v[20:23], v[2:3], off
  s_waitcnt vmcnt(0)
  v_accvgpr_write_b32 a0, v20
  v_accvgpr_write_b32 a1, v21
  v_accvgpr_write_b32 a2, v22
  v_accvgpr_write_b32 a3, v23
  ds_write_b128 v1, a[0:3]                // LDS[16 lane ..] = a[0:3] (the ACC bit of DS)
  s_waitcnt lgkmcnt(0)
  ds_read_b128 v[4:7], v1
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v9, s7
  v_add_co_u32 v8, vcc, s6, v1
  v_addc_co_u32 v9, vcc, 0, v9, vcc
  global_store_dwordx4 v[8:9], v[4:7], off // out[16 lane ..] must equal in[16 lane ..]
  s_endpgm
