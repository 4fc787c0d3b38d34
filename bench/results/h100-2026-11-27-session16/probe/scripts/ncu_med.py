import csv, sys, statistics as st
by = {}
for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')):
    if r['Metric Name'] == 'gpu__time_duration.sum':
        by.setdefault(r['Kernel Name'], []).append(float(r['Metric Value'].replace(',', '')) / 1e3)
for k, v in by.items():
    print(f"  {k:40s} {st.median(v):9.2f} us (median of {len(v)})")
