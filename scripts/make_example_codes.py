"""Write code2wav/assets/example_codes.npy: 50 deterministic random frames [50, 16] int64 in [0, 2048).

Not speech: random codes of the right shape and range, so the README command decodes something
real-shaped. Re-running it reproduces the committed file byte for byte.
"""

from pathlib import Path

import numpy as np

FRAMES, QUANTIZERS, CODEBOOK_SIZE, SEED = 50, 16, 2048, 0
TARGET = Path(__file__).resolve().parent.parent / "code2wav" / "assets" / "example_codes.npy"


def example_codes() -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, CODEBOOK_SIZE, size=(FRAMES, QUANTIZERS), dtype=np.int64)


if __name__ == "__main__":
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    np.save(TARGET, example_codes())
    print(f"wrote {TARGET}")
