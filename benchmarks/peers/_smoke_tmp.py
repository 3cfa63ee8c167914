import sys, json
from benchmarks.peers.brokers import PEERS, stop_all
try:
    for key in sys.argv[2:]:
        cls = PEERS[key]
        print(cls.versions(), cls.missing())
        b = cls(sys.argv[1]); b.start()
        print("started", b.port, b.proc.pid)
        try:
            r = b.drive(50, 5000, ["enqueue", "drain", "latency"], rounds=300)
            print(json.dumps(r, indent=None))
        finally:
            b.stop()
finally:
    stop_all()
