"""Alternate epochs of the tree before the meter (off) and with it (on), ABBA, in two
long-lived processes; print best-of-three and the median paired ratio."""
import statistics, subprocess, sys, time, os

path, workers, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BUSY = float(sys.argv[4]) if len(sys.argv) > 4 else 0.10
HERE = os.path.dirname(os.path.abspath(__file__))
# "off": a worktree of the commit before the meter (git worktree add /tmp/wt-old bb75188^).
trees = {"off": os.environ.get("OFF_TREE", "/tmp/wt-old"),
         "on": os.path.dirname(os.path.dirname(HERE))}
procs = {}
for name, root in trees.items():
    env = dict(os.environ, PYTHONPATH=root)
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "epoch_server.py"), path, str(workers)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    print(name, p.stdout.readline().strip(), flush=True)
    procs[name] = p

def epoch(name):
    p = procs[name]
    p.stdin.write("go\n"); p.stdin.flush()
    wall, cpu = map(float, p.stdout.readline().split())
    return wall, cpu

def busy(seconds=1.0):
    def read():
        v = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    t1, i1 = read(); time.sleep(seconds); t2, i2 = read()
    return 1 - (i2 - i1) / max(1, t2 - t1)

for name in procs:  # warm-up epochs (worker start, page cache, lazy opens)
    epoch(name); epoch(name)
rates = {"off": [], "on": []}
cpus = {"off": [], "on": []}
ratios = []
cratios = []
for k in range(pairs):
    for _ in range(120):
        if busy() < BUSY:
            break
    order = ("off", "on") if k % 2 == 0 else ("on", "off")
    got = {n: epoch(n) for n in order}
    for n in got:
        rates[n].append(got[n][0]); cpus[n].append(got[n][1])
    ratios.append(got["on"][0] / got["off"][0])
    cratios.append(got["on"][1] / got["off"][1])
    print(f"pair {k}: samples/s off {got['off'][0]:,.0f} on {got['on'][0]:,.0f} ({ratios[-1]:.4f}); "
          f"per CPU s off {got['off'][1]:,.0f} on {got['on'][1]:,.0f} ({cratios[-1]:.4f})", flush=True)
for p in procs.values():
    p.stdin.close(); p.wait()
best = {n: sorted(v)[-3:] for n, v in rates.items()}
print(f"workers {workers}: best-of-three off {max(rates['off']):,.0f} on {max(rates['on']):,.0f} "
      f"({(1 - max(rates['on']) / max(rates['off'])) * 100:+.2f}% overhead); "
      f"median paired on/off {statistics.median(ratios):.4f} "
      f"({(1 - statistics.median(ratios)) * 100:+.2f}% overhead), "
      f"quartiles {[round(q, 4) for q in statistics.quantiles(ratios, n=4)]}; pairs {len(ratios)}")
print(f"workers {workers}: samples per CPU second, best-of-three off {max(cpus['off']):,.0f} "
      f"on {max(cpus['on']):,.0f} ({(1 - max(cpus['on']) / max(cpus['off'])) * 100:+.2f}%); "
      f"median paired on/off {statistics.median(cratios):.4f} "
      f"({(1 - statistics.median(cratios)) * 100:+.2f}% overhead), quartiles "
      f"{[round(q, 4) for q in statistics.quantiles(cratios, n=4)]}")
