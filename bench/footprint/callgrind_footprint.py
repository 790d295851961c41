#!/usr/bin/env python3
"""
The code a steady state runs, from a callgrind profile taken with --dump-instr=yes --compress-pos=no
--compress-strings=no (bench/sdp_footprint.sh). An instruction belongs to the steady state when it ran at least
MIN times (the round trips of the run): loops of the start-up also pass, which is why the dynamic loader shows up.

    callgrind_footprint.py FILE MIN [TOP]

prints, per object, the distinct instructions and 4 KiB code pages of the steady state, the functions with the
most of those instructions, and the calls per round trip (caller -> callee, edges taken at least MIN times).

    callgrind_footprint.py --per-trip FILE_SHORT FILE_LONG EXTRA_TRIPS [TOP]

prints the instructions executed and the calls made per round trip: the difference between two profiles of the
same program, one run EXTRA_TRIPS round trips longer than the other, so that start-up and teardown cancel out.
Under TCG each distinct block a call runs, and each call and return (an indirect jump QEMU looks up), costs the
call and slows the kernel work after it (docs/results/sdp-verbs.md).
"""
import collections
import sys


def parse(path):
    counts = collections.Counter()
    owner = {}
    edges = collections.Counter()
    ob = fn = cfn = '?'
    cob = None
    after_calls = False
    with open(path, errors='replace') as f:
        for line in f:
            if line.startswith('ob='):
                ob = line[3:].strip().split('/')[-1]
            elif line.startswith('fn='):
                fn = line[3:].strip()
            elif line.startswith('cob='):
                cob = line[4:].strip().split('/')[-1]
            elif line.startswith('cfn='):
                cfn = line[4:].strip()
            elif line.startswith('calls='):
                # cob= is given only when the callee is in another object, and holds for this call only
                edges[(ob + ':' + fn, (cob or ob) + ':' + cfn)] += int(line[6:].split()[0])
                cob = None
                after_calls = True
            elif line.startswith('0x'):
                if after_calls:         # the inclusive cost of the call just named, not an instruction of fn
                    after_calls = False
                    continue
                parts = line.split()
                addr = int(parts[0], 16)
                counts[(ob, addr)] += int(parts[-1])
                owner[(ob, addr)] = fn
    return counts, owner, edges


def per_trip(short, long_, trips, top):
    totals = []
    for path in (short, long_):
        counts, owner, edges = parse(path)
        per_ob, per_fn = collections.Counter(), collections.Counter()
        for (ob, addr), c in counts.items():
            per_ob[ob] += c
            per_fn[(ob, owner[(ob, addr)])] += c
        totals.append((per_ob, per_fn, sum(edges.values())))
    (ob_a, fn_a, calls_a), (ob_b, fn_b, calls_b) = totals
    delta = {ob: (ob_b[ob] - ob_a[ob]) / trips for ob in set(ob_a) | set(ob_b)}
    print(f'instructions executed per round trip: {sum(delta.values()):.0f}')
    for ob, v in sorted(delta.items(), key=lambda kv: -kv[1]):
        if abs(v) >= 1:
            print(f'  {v:8.0f}  {ob}')
    print('functions:')
    fns = sorted(((fn_b[k] - fn_a[k]) / trips, k) for k in fn_b)
    for v, (ob, fn) in reversed(fns[-top:]):
        print(f'  {v:8.1f}  {ob}:{fn}')
    print(f'calls per round trip: {(calls_b - calls_a) / trips:.1f}')


def main():
    if sys.argv[1] == '--per-trip':
        per_trip(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 25)
        return
    path, minc = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    counts, owner, edges = parse(path)
    instrs = collections.Counter()
    pages = collections.defaultdict(set)
    per_fn = collections.Counter()
    for (ob, addr), c in counts.items():
        if c >= minc:
            instrs[ob] += 1
            pages[ob].add(addr >> 12)
            per_fn[(ob, owner[(ob, addr)])] += 1
    print(f'steady-state instructions (run >= {minc} times): {sum(instrs.values())}')
    for ob, n in instrs.most_common():
        print(f'  {n:6d} instructions {len(pages[ob]):4d} pages  {ob}')
    print('functions:')
    for (ob, fn), n in per_fn.most_common(top):
        print(f'  {n:6d}  {ob}:{fn}')
    steady = [(c / minc, a, b) for (a, b), c in edges.items() if c >= minc]
    print(f'calls per round trip (edges taken >= {minc} times): {sum(r for r, _, _ in steady):.1f}')
    for r, a, b in sorted(steady, reverse=True)[:top]:
        print(f'  {r:6.1f}  {a} -> {b}')


if __name__ == '__main__':
    main()
