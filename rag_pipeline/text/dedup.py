"""Near-duplicate detection with MinHash signatures and LSH banding (datasketch).

Chunks whose estimated Jaccard similarity (on word shingles) reaches the threshold, whose documents carry
exactly the same ACL labels, and which state the same figures, fall into one group; each index version stores
one row per group. Figures matter: last year's and this year's statement differ only in their numbers, and
collapsing them would answer a question about one year with the other's.
The LSH state lives in Postgres (`chunk_groups`, `chunk_group_bands`), so it survives runs, grows
incrementally and shrinks with deletions; these functions only compute signatures and band keys.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# datasketch is imported where it is used: its package import pulls scipy (about 0.8 s), which a refresh with
# nothing to chunk never needs.

NUM_PERM = 128
SEED = 1  # fixed: signatures must be comparable across runs and processes
SHINGLE_WORDS = 3
_WORD_RE = re.compile(r"\w+", re.UNICODE)
_FIGURE_RE = re.compile(r"\d[\d,.]*")


@dataclass(frozen=True)
class LshParams:
    threshold: float
    bands: int
    rows: int

    @property
    def key(self) -> str:
        return f"minhash{NUM_PERM}:s{SHINGLE_WORDS}:b{self.bands}r{self.rows}:figures"


@lru_cache(maxsize=8)
def lsh_params(threshold: float) -> LshParams:
    """Bands x rows from datasketch's optimiser, weighted towards recall: every LSH candidate is verified
    against its signature afterwards, so a false positive costs one comparison while a false negative
    leaves a duplicate in the index."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"dedup threshold must be in (0, 1], got {threshold}")
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM, weights=(0.1, 0.9))
    return LshParams(threshold, lsh.b, lsh.r)


def shingles(text: str) -> set[bytes]:
    words = [w.lower() for w in _WORD_RE.findall(text)]
    if len(words) < SHINGLE_WORDS:
        return {" ".join(words).encode()} if words else {b""}
    return {" ".join(words[i : i + SHINGLE_WORDS]).encode() for i in range(len(words) - SHINGLE_WORDS + 1)}


def signature(text: str) -> np.ndarray:
    from datasketch import MinHash

    minhash = MinHash(num_perm=NUM_PERM, seed=SEED)
    minhash.update_batch(list(shingles(text)))
    return np.asarray(minhash.hashvalues, dtype=np.int64)


def similarity(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> float:
    """Estimated Jaccard similarity: the share of equal MinHash values."""
    return float(np.mean(np.asarray(a, dtype=np.int64) == np.asarray(b, dtype=np.int64)))


def acl_key(labels: Sequence[str]) -> str:
    """Groups never span label sets: the sorted labels are part of every band key."""
    return "\x1f".join(sorted(set(labels)))


def figures_key(text: str) -> str:
    """The figures a text states, in order: near-duplicates must state the same ones."""
    figures = [f.rstrip(",.") for f in _FIGURE_RE.findall(text)]
    return hashlib.blake2b("\x1f".join(figures).encode(), digest_size=8).hexdigest()


def band_buckets(sig: np.ndarray, params: LshParams, labels_key: str, figures: str = "") -> list[int]:
    """One 63-bit bucket per band, keyed by the LSH parameters, the ACL label set and the figures stated."""
    buckets = []
    for band in range(params.bands):
        chunk = sig[band * params.rows : (band + 1) * params.rows].tobytes()
        digest = hashlib.blake2b(f"{params.key}|{labels_key}|{figures}|{band}|".encode() + chunk, digest_size=8)
        buckets.append(int.from_bytes(digest.digest(), "big") >> 1)  # fits a signed bigint
    return buckets


def closest_group(
    sig: np.ndarray, candidates: Iterable[tuple[str, Sequence[int]]], threshold: float
) -> str | None:
    """The candidate group most similar to a chunk's signature, if it reaches the threshold (ties: lowest id)."""
    scored = sorted(((similarity(sig, candidate), group_id) for group_id, candidate in candidates),
                    key=lambda item: (-item[0], item[1]))
    return scored[0][1] if scored and scored[0][0] >= threshold else None
