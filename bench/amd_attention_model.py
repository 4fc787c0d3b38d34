"""Throughput model of the MFMA attention kernels (**modelled, not measured**; docs/attention.md,
"AMD throughput model"). No AMD GPU has run them: an upper bound from the compiled code's static
report and datasheet rates.

Inputs, in DIR, for ARCH in gfx942 gfx950 and D in 64 128 (heads 32/8, bf16, seq 8192,
non-causal), from `kiln inspect` on a build whose lib/attention.kernel
`attention_tile_needs_mask` returns false (so that only the unmasked copy of a tile's body is
compiled and the hot loop is one interior tile):
  kiln inspect OP -p heads=32,kv_heads=8,head_dim=D,layout=0,batch=1,seqlen_q=8192,seqlen_k=8192 \
      --dtype bf16 --arch ARCH --emit meta > DIR/ARCH-D-OP.meta      (OP: attention, attention_bwd)
  ... --emit asm > DIR/ARCH-D-OP.s
Usage: python3 bench/amd_attention_model.py DIR
"""
import re
import sys
DEV={'gfx942':dict(name='MI300X',cus=304,clk=2.1e9,mfma=512,lds=128),
     'gfx950':dict(name='MI355X',cus=256,clk=2.4e9,mfma=1024,lds=256)}
def funcs(path):
    out={};cur=None
    for l in open(path):
        m=re.match(r'^(kiln_\w+):',l)
        if m: cur=m.group(1); out[cur]=[]; continue
        if cur and l.startswith('\t') and not l.startswith('\t.'): out[cur].append(l.split()[0] if l.split() else '')
    return out
def ldsbytes(op):
    for k,b in (('b128',16),('b96',12),('read2st64_b64',16),('write2st64_b64',16),('read2_b64',16),('write2_b64',16),('b64',8),('read2',8),('write2',8)):
        if k in op: return b
    return 4
def meta(path):
    t=open(path).read()
    hot=re.search(r'hot loop .*?(\d+) instructions: (\d+) MFMA, (\d+) LDS, .*?(\d+) other VALU',t)
    occ=re.search(r'occupancy\s+\d+ waves per SIMD \((\d+) per CU',t)
    regs=re.search(r'registers\s+(\d+) VGPRs',t); lds=re.search(r'^LDS\s+(\d+)',t,re.M)
    d=dict(mfma=int(hot.group(2)),valu=int(hot.group(4)),wcu=int(occ.group(1)),vgpr=int(regs.group(1)),lds=int(lds.group(1)),instr=int(hot.group(1)))
    dq=re.search(r'kiln_attention_bwd_dq: (\d+) VGPRs.*?LDS (\d+) bytes.*?\((\d+) per CU.*?hot loop (\d+) instructions, (\d+) MFMA, (\d+) LDS, (\d+) other VALU',t)
    if dq: d['dq']=dict(vgpr=int(dq.group(1)),lds=int(dq.group(2)),wcu=int(dq.group(3)),instr=int(dq.group(4)),mfma=int(dq.group(5)),valu=int(dq.group(7)))
    return d
def rate(k,fn,dev):
    # tiles per cycle per CU
    ops=fn; nexp=sum(1 for o in ops if o.startswith('v_exp_f32'))
    ldsc=sum(64*ldsbytes(o) for o in ops if o.startswith('ds_'))/dev['lds']
    V=4*k['valu']+12*nexp; M=k['mfma_cycles']
    w=k['wcu']; per=[w//4+(1 if i< w%4 else 0) for i in range(4)]
    r=sum(x/max(x*V,x*M,V+M) for x in per if x>0)
    bound='VALU' if V>=M else 'MFMA'
    if ldsc>0 and 1/ldsc<r: r=1/ldsc; bound='LDS'
    return r,dict(V=V,M=M,L=ldsc,exp=nexp,per=per,bound=bound)
DIR = sys.argv[1] if len(sys.argv) > 1 else '.'
for a in ('gfx942','gfx950'):
    dev=DEV[a]
    for D in (64,128):
        f=meta(f'{DIR}/{a}-{D}-attention.meta'); fa=funcs(f'{DIR}/{a}-{D}-attention.s')
        b=meta(f'{DIR}/{a}-{D}-attention_bwd.meta'); fb=funcs(f'{DIR}/{a}-{D}-attention_bwd.s')
        useful=2*32*32*2*D
        f['mfma_cycles']=2*32*32*2*D/dev['mfma']
        rf,xf=rate(f,fa['kiln_attention_fwd'],dev)
        fwd=useful*rf*dev['cus']*dev['clk']/1e12
        b['mfma_cycles']=2*32*32*4*D/dev['mfma']
        rk,xk=rate(b,fb['kiln_attention_bwd_dkdv'],dev)
        q=b['dq']; q['mfma_cycles']=2*32*32*3*D/dev['mfma']
        rq,xq=rate(q,fb['kiln_attention_bwd_dq'],dev)
        bwd=2.5*useful/(1/rk+1/rq)*dev['cus']*dev['clk']/1e12
        print(f"{a} D{D}: fwd {fwd:.0f} TF ({xf}, vgpr {f['vgpr']} lds {f['lds']} valu {f['valu']} instr {f['instr']} wcu {f['wcu']}) | bwd {bwd:.0f} TF dkdv({xk}, vgpr {b['vgpr']} lds {b['lds']} valu {b['valu']} instr {b['instr']} wcu {b['wcu']}) dq({xq}, vgpr {q['vgpr']} lds {q['lds']} valu {q['valu']} instr {q['instr']} wcu {q['wcu']})")
