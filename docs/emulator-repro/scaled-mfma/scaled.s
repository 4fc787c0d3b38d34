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
  v_mov_b32 v19, 0x7f
  v_mov_b32 v20, 0x80
  v_cmp_eq_u32 vcc, 0, v0
  v_cndmask_b32 v18, v19, v20, vcc        // A's scale: 2^1 in lane 0 (row 0, k 0..31), 2^0 elsewhere
  v_mov_b32 v21, 0x7f                     // B's scale: 2^0 everywhere
  v_mov_b32 v32, 0
  v_mov_b32 v33, 0
  v_mov_b32 v34, 0
  v_mov_b32 v35, 0
  v_mov_b32 v36, 0
  v_mov_b32 v37, 0
  v_mov_b32 v38, 0
  v_mov_b32 v39, 0
  v_mov_b32 v40, 0
  v_mov_b32 v41, 0
  v_mov_b32 v42, 0
  v_mov_b32 v43, 0
  v_mov_b32 v44, 0
  v_mov_b32 v45, 0
  v_mov_b32 v46, 0
  v_mov_b32 v47, 0
  v_mfma_scale_f32_32x32x64_f8f6f4 v[32:47], v[2:9], v[10:17], v[32:47], v18, v21
  s_nop 7
  s_nop 7
  s_nop 7
  v_lshlrev_b32 v22, 6, v0
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v23, s3
  v_add_co_u32 v22, vcc, s2, v22
  v_addc_co_u32 v23, vcc, 0, v23, vcc
  global_store_dwordx4 v[22:23], v[32:35], off offset:0
  global_store_dwordx4 v[22:23], v[36:39], off offset:16
  global_store_dwordx4 v[22:23], v[40:43], off offset:32
  global_store_dwordx4 v[22:23], v[44:47], off offset:48
  s_endpgm
