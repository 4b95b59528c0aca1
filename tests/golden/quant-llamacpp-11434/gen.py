import random, struct, sys, array
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
n, rw, ra = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def row():
    x = []
    for b in range(n // 32):
        kind = rng.randrange(12)
        sc = 10 ** rng.uniform(-3, 1)
        if kind == 0: v = [0.0] * 32
        elif kind == 1: v = [abs(rng.uniform(-1, 1)) * sc + sc for _ in range(32)]
        elif kind == 2: v = [(rng.randrange(255) - 127) * 0.5 for _ in range(32)]
        elif kind == 3:
            v = [rng.gauss(0, 1) * sc for _ in range(32)]; v[rng.randrange(32)] *= 20
        elif kind == 4: v = [-abs(rng.gauss(0, 1)) * sc for _ in range(32)]
        elif kind == 5: v = [rng.gauss(0, 1) * 1e-20 for _ in range(32)]
        else: v = [rng.gauss(0, 1) * sc for _ in range(32)]
        x += v
    return x
vals = []
for _ in range(rw + ra): vals += row()
open(sys.argv[1], 'wb').write(struct.pack('<3I', n, rw, ra) + array.array('f', vals).tobytes())
