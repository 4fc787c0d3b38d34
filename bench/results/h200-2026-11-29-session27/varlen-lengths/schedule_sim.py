# Simulates next_item (attention_sm90.kernel) for the varlen batch: per block, the key blocks of its items.
import math
lens=[7294, 1672, 4568, 2186, 263, 401]
BM=128; BN=128; KVH=8; GROUP=4; G=132; SNAKE=True
qb=math.ceil(max(lens)/BM)
items=[]  # compacted order: rank-major, then (b, kv head) pairs, then group's query heads
for rank in range(qb):
    row0=(qb-1-rank)*BM
    for b,L in enumerate(lens):
        if row0>=L: continue
        for kvh in range(KVH):
            for g in range(GROUP):
                # causal bottom-right, lq == lk: key blocks up to row0+BM-1
                last=min(row0+BM, L)
                nkb=math.ceil(last/BN)
                items.append(nkb)
def sim(items, G, snake, over=0):
    work=[0]*G; cnt=[0]*G
    for t,w in enumerate(items):
        k, c = divmod(t, G)
        if snake and k&1: c=G-1-c
        work[c]+=w+over; cnt[c]+=1
    return work,cnt
tot=sum(items)
for over in (0,1,2):
    w,c=sim(items,G,SNAKE,over)
    mean=(tot+over*len(items))/G
    print(f"overhead {over} kv-blocks/item: items {len(items)}, max {max(w)} mean {mean:.1f} max/mean {max(w)/mean:.4f}; items per block {min(c)}-{max(c)}")
# dense s7294 b1
items2=[]
L=7294
for rank in range(qb):
    row0=(qb-1-rank)*BM
    for kvh in range(KVH):
        for g in range(GROUP):
            items2.append(math.ceil(min(row0+BM,L)/BN))
for over in (0,1,2):
    w,c=sim(items2,G,SNAKE,over); mean=(sum(items2)+over*len(items2))/G
    print(f"dense: overhead {over}: items {len(items2)} max/mean {max(w)/mean:.4f}")
# LPT greedy (dynamic) bound
import heapq
def greedy(items,G,over):
    h=[0]*G
    for w in items:
        x=heapq.heappop(h); heapq.heappush(h,x+w+over)
    return max(h)
for over in (0,2):
    print("dynamic (greedy in this order) varlen max/mean", greedy(items,G,over)/((sum(items)+over*len(items))/G), "dense", greedy(items2,G,over)/((sum(items2)+over*len(items2))/G))
