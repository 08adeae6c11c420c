"""What an epoch costs when most bindings have nothing: 16 documents bindings, epoch 1 gives each
a file, then 6 runs each give one binding a one-document file; each run (Open included) is timed,
wall and CPU (this process and its JVM), and the median of the last five printed. Measured in
docs/performance.md ("Many tables"):

    python -m tests.bench_idle_bindings /tmp/idle-bindings
"""
import json, os, shutil, statistics, sys, time
from pathlib import Path
root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/idle-bindings"); shutil.rmtree(root, ignore_errors=True)
from materializer.spark import build_session
from materializer.runtime import Runtime
from tests.helpers import binding
from tests.test_holes import config_with
N = 16
spark = build_session("local[2]", {"spark.sql.shuffle.partitions": "2"}, app_name="idle")
def cpu():
    t = os.times(); total = t.user + t.system
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError: continue
        if int(f[1]) == os.getpid(): total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return total
for i in range(N):
    d = root / f"b{i}"; d.mkdir(parents=True)
    (d / "0000.jsonl").write_text(json.dumps({"id": 1, "v": 0}) + "\n")
config = config_with(root, [binding(f"b{i}", root / f"b{i}", root / "tables" / f"b{i}") for i in range(N)], transaction={"parallel_bindings": 2})
Runtime(config, spark).run()
walls, cpus = [], []
for e in range(1, 7):
    (root / f"b{e % N}" / f"{e:04d}.jsonl").write_text(json.dumps({"id": e, "v": e}) + "\n")
    w, c = time.monotonic(), cpu()
    Runtime(config, spark).run()
    walls.append(time.monotonic() - w); cpus.append(cpu() - c)
print(f"epoch with 1 of {N} bindings: wall {statistics.median(walls[1:]):.2f} s, CPU {statistics.median(cpus[1:]):.2f} s (walls {[round(x,1) for x in walls]})")
