# Reads `ncu -i REP --page source --csv --print-source sass` (SASS with per-instruction warp-stall
# samples) and prints the instructions with at least THRESHOLD samples, and every barrier, mbarrier
# wait, WGMMA wait, reduction and branch, with their three largest stall reasons:
#   python3 stalls.py src.csv [THRESHOLD] > stalls.txt
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[1]
ia=hdr.index("Warp Stall Sampling (All Samples)")
st=[i for i,h in enumerate(hdr) if h.startswith('stall_') and 'Not Issued' not in h]
ie=hdr.index("Instructions Executed")
out=[]
tot=0
for r in rows[2:]:
    try: a=int(r[ia] or 0)
    except: continue
    tot+=a
    reasons=sorted(((int(r[i] or 0),hdr[i][6:]) for i in st), reverse=True)[:3]
    out.append((r[0][-5:], a, r[ie], r[1].strip(), reasons))
thr=int(sys.argv[2]) if len(sys.argv)>2 else 300
for o in out:
    if o[1]>=thr or any(k in o[3] for k in ('BAR.','SYNCS','DEPBAR','WARPSYNC','REDG','UTMA','EXIT','SETMAXREG','BRA')):
        print(f"{o[0]} {o[1]:6d} {100*o[1]/tot:4.1f}% ex={o[2]:>9} {o[3][:70]:70s} {' '.join(f'{n}:{c}' for c,n in o[4] if c)}")
