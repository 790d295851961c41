#!/usr/bin/env python3
"""
The code a steady state runs, from a callgrind profile taken with --dump-instr=yes --compress-pos=no
--compress-strings=no (bench/sdp_footprint.sh). An instruction belongs to the steady state when it ran at least
MIN times (the round trips of the run): loops of the start-up also pass, which is why the dynamic loader shows up.

    callgrind_footprint.py FILE MIN [TOP]

prints, per object, the distinct instructions and 4 KiB code pages of the steady state, the functions with the
most of those instructions, and the calls per round trip (caller -> callee, edges taken at least MIN times).
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


def main():
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
