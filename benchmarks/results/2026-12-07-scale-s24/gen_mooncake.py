"""Seeded Mooncake-format hash-block trace with realistic prefix sharing."""

import json
import sys
import numpy as np


def main(n, path, seed=0, rate=5.0):
    rng = np.random.default_rng(seed)
    next_id = 0

    def fresh(k):
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    prompts = [fresh(int(rng.integers(1, 8))) for _ in range(20)]
    sessions = []  # list of hash-id lists (active)
    t = 0.0
    with open(path, "w") as f:
        for _ in range(n):
            t += rng.exponential(1000.0 / rate)
            if sessions and rng.random() < 0.6:
                j = int(rng.integers(len(sessions)))
                base = sessions[j]
                ids = base + fresh(int(rng.integers(1, 4)))
                if len(ids) > 120:
                    sessions[j] = sessions[-1]
                    sessions.pop()
                else:
                    sessions[j] = ids
            else:
                ids = prompts[int(rng.integers(len(prompts)))] + fresh(int(rng.integers(1, 10)))
                sessions.append(ids)
                if len(sessions) > 2000:
                    k = int(rng.integers(len(sessions)))
                    sessions[k] = sessions[-1]
                    sessions.pop()
            inp = (len(ids) - 1) * 512 + int(rng.integers(1, 513))
            out = int(rng.integers(1, 800))
            f.write(
                json.dumps({"timestamp": int(t), "input_length": inp, "output_length": out, "hash_ids": ids}) + "\n"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
