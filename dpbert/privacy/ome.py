r"""OME (Lyu et al. 2020): local randomizers for sentence representations, with the TRUE ε.

Pipeline (paper Alg. 1). The user embeds a sentence with a frozen encoder, v ∈ R^r, z-scores it
(`zscore`), writes each coordinate as l = 1 + m + n bits (`encode`: sign, m integer bits MSB
first, n fraction bits, clipped to 2^m − 2^−n) and randomizes the r·l bits independently:

    P(B'[i] = 1 | B[i] = 1) = p_i,   P(B'[i] = 1 | B[i] = 0) = q_i.

The server trains on B' directly (r·l binary features); test inputs are randomized too.

## Mechanisms

* `OME(eps, lam, r)`: Theorem 1 as published: with i the 1-based global bit index,
  p_i = λ/(1+λ) on one parity (`high_p_parity`, default even) and 1/(1+λ³) on the other,
  q = 1/(1 + λ e^{ε/(rl)}).
* `CalibratedOME(eps, r)`: randomized response per bit with budget ε_i, Σ ε_i = ε:
  p_i = e^{ε_i}/(1+e^{ε_i}), q_i = 1 − p_i. Its TRUE ε equals the requested ε. Why RR: each bit
  is a binary input, and for binary inputs randomized response is the optimal ε_i-LDP
  mechanism — every other ε_i-LDP channel on one bit is a post-processing of it (Kairouz, Oh,
  Viswanath 2014, "Extremal mechanisms for local DP", binary case) — so no choice of (p_i, q_i)
  under the true per-bit constraint carries more information about the bit. The only freedom
  left is how ε is split over bit positions (`bit_weights`, per position within a coordinate;
  uniform by default, e.g. (1, 0, …, 0) spends it all on the sign bits).
* `UnaryEncoding("sue" | "oue", eps, r)`: the SUE / OUE baselines (Wang et al. 2017) with
  Δf = 2r on a unary (one-hot) encoding of each coordinate over `levels` bins.

## The privacy caveat (FINETUNE_SPEC §3.2)

Theorem 1's proof multiplies (p/(1−p))·((1−q)/q) over the bits; λ cancels there and the
product is e^ε (`ome_theorem1_log_ratio`). But ε-LDP must bound, for every output B' and inputs
v, v', the ratio P(B'|v)/P(B'|v'). With independent bits and inputs allowed to differ in every
bit, the exact worst case is

    ε_true = Σ_i max( |ln(p_i/q_i)|, |ln((1−p_i)/(1−q_i))| )                 (`worst_case_epsilon`)

(each bit's worst output and orientation can be chosen independently; `encode` maps onto the
whole cube {0,1}^{rl} since every sign/integer/fraction pattern is a value in the clipped
range). For OME a high-p bit leaks ≈ ln λ and a low-p bit ≈ 2 ln λ (|ln(p/q)| with p = 1/(1+λ³),
q ≈ 1/λ), so ε_true ≈ (rl/2)·3 ln λ for large λ whatever ε is: λ = 100, ε = 1, r = 50 gives
≈ 3.45e3. Only λ = 1 keeps ε_true ≤ ε. Every report carries both `epsilon_claimed` and
`epsilon_true`. (Per-vector z-scoring restricts the inputs a little — a z-scored vector cannot
take every bit pattern — so for that input domain ε_true is a tight-in-the-bits upper bound;
with `per_feature` z-scoring or none it is exact.)

## Randomness

Bit flips are secret randomness: `perturb` takes a key (from OS entropy in a real release; a
public seed makes the flips removable). Row r of a batch uses `fold_in(key, row_id)`, so a
release is reproducible per example whatever the chunking. Each Bernoulli(p) is drawn by
comparing 64 random bits with the integer threshold round(p·2^64), so the sampled probability
is p to within 2^−65 (float32 uniforms would round λ = 100's p = 1e−6 by ~10 %);
`worst_case_epsilon` is evaluated on these realized probabilities. A per-bit log-odds beyond
≈ ±44 (p or 1 − p below 2^−64) saturates at 2^−64: the sampler then leaks less than requested,
and the report says so (ε_true is computed from what is sampled).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

M_BITS = 4  # integer bits (paper: m = 4)
N_BITS = 5  # fraction bits (paper: n = 5)
PARITIES = ("even", "odd")
ZSCORE_MODES = ("per_vector", "per_feature", "none")
_TWO64 = 1 << 64


# ----------------------------------------------------------------------------- z-score


def feature_stats(public: np.ndarray, eps: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate mean and sd of PUBLIC vectors [N, r] (for `zscore(mode="per_feature")`)."""
    public = np.asarray(public, np.float64)
    return public.mean(0), np.maximum(public.std(0), eps)


def zscore(v: np.ndarray, mode: str = "per_vector", *, mean: np.ndarray | None = None,
           std: np.ndarray | None = None, eps: float = 1e-12) -> np.ndarray:
    """[..., r] → z-scored float64.

    per_vector (default; the user can do it locally): (v − mean(v)) / sd(v) over the r coordinates.
    per_feature: (v − mean) / std with per-coordinate statistics of PUBLIC data (`feature_stats`).
    none: unchanged.
    """
    v = np.asarray(v, np.float64)
    if mode == "per_vector":
        mu = v.mean(-1, keepdims=True)
        sd = np.maximum(v.std(-1, keepdims=True), eps)
        return (v - mu) / sd
    if mode == "per_feature":
        if mean is None or std is None:
            raise ValueError("zscore(mode='per_feature') needs public mean and std "
                             "(ome.feature_stats)")
        return (v - mean) / np.maximum(std, eps)
    if mode == "none":
        return v
    raise ValueError(f"zscore mode must be one of {ZSCORE_MODES}, got {mode!r}")


# ----------------------------------------------------------------------------- bit encoding


def bit_length(m: int = M_BITS, n: int = N_BITS) -> int:
    """l = 1 + m + n bits per coordinate."""
    return 1 + m + n


def max_magnitude(m: int = M_BITS, n: int = N_BITS) -> float:
    """The largest encodable |v|: 2^m − 2^−n."""
    return 2.0 ** m - 2.0 ** -n


def clip(v: np.ndarray, m: int = M_BITS, n: int = N_BITS) -> np.ndarray:
    """sign(v) · min(|v|, 2^m − 2^−n): what `decode(encode(v))` approximates to within 2^−n."""
    v = np.asarray(v, np.float64)
    return np.sign(v) * np.minimum(np.abs(v), max_magnitude(m, n))


def encode(v: np.ndarray, m: int = M_BITS, n: int = N_BITS) -> np.ndarray:
    """[..., r] floats → uint8 [..., r·l] bits; per coordinate [s, I_{m−1}..I_0, F_{n−1}..F_0].

    s = 1[v < 0]; a = min(|v|, 2^m − 2^−n); I = ⌊a⌋; F = ⌊(a − I)·2^n⌋ (MSB first, truncation).
    """
    if m < 0 or n < 0:
        raise ValueError(f"bit counts must be ≥ 0, got m={m}, n={n}")
    v = np.asarray(v, np.float64)
    if not np.isfinite(v).all():
        raise ValueError("encode: non-finite value")
    a = np.minimum(np.abs(v), max_magnitude(m, n))
    integer = np.floor(a).astype(np.int64)
    fraction = np.floor((a - integer) * (1 << n)).astype(np.int64)
    sign = (v < 0).astype(np.int64)
    code = (sign << (m + n)) | (integer << n) | fraction          # l-bit integer, s = MSB
    shifts = np.arange(m + n, -1, -1)                             # MSB first
    bits = (code[..., None] >> shifts) & 1
    return bits.reshape(*v.shape[:-1], v.shape[-1] * bit_length(m, n)).astype(np.uint8)


def decode(bits: np.ndarray, m: int = M_BITS, n: int = N_BITS) -> np.ndarray:
    """uint8 [..., r·l] → float64 [..., r] (inverse of `encode` on the clipped grid)."""
    l = bit_length(m, n)
    bits = np.asarray(bits).astype(np.int64)
    if bits.shape[-1] % l:
        raise ValueError(f"bit vector length {bits.shape[-1]} is not a multiple of l = {l}")
    bits = bits.reshape(*bits.shape[:-1], -1, l)
    weights = 2.0 ** np.arange(m - 1, -n - 1, -1)                 # I_{m−1} .. F_0
    magnitude = bits[..., 1:] @ weights
    return np.where(bits[..., 0] == 1, -magnitude, magnitude)


def unary_encode(v: np.ndarray, levels: int, value_range: tuple[float, float]) -> np.ndarray:
    """[..., r] → uint8 [..., r·levels]: each coordinate one-hot over `levels` equal bins of
    `value_range` (values outside are clipped into the end bins)."""
    if levels < 2:
        raise ValueError(f"unary encoding needs ≥ 2 levels, got {levels}")
    lo, hi = value_range
    v = np.asarray(v, np.float64)
    idx = np.clip(np.floor((v - lo) / (hi - lo) * levels), 0, levels - 1).astype(np.int64)
    out = (idx[..., None] == np.arange(levels)).astype(np.uint8)
    return out.reshape(*v.shape[:-1], v.shape[-1] * levels)


# ----------------------------------------------------------------------------- probabilities


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


def _threshold(logit: float) -> int:
    """T = round(p·2^64) for p = sigmoid(logit), so that P(u < T) = T/2^64 for 64 uniform bits.

    Computed from the log-odds on the side where p is small (1 − p = sigmoid(−logit)), so
    probabilities near 1 keep their precision; a finite logit (0 < p < 1) never rounds to a
    certain outcome: T ∈ [1, 2^64 − 1]. ±inf give 0 / 2^64.
    """
    if math.isnan(logit):
        raise ValueError("probability log-odds is NaN")
    if logit == math.inf:
        return _TWO64
    if logit == -math.inf:
        return 0
    small = float(_sigmoid(-abs(logit)))            # min(p, 1 − p)
    t_small = min(max(round(small * _TWO64), 1), _TWO64 // 2)
    return t_small if logit < 0 else _TWO64 - t_small


@dataclasses.dataclass(frozen=True, eq=False)
class BitRandomizer:
    """Independent per-bit randomizer over L positions: P(1|1) = p[i], P(1|0) = q[i].

    Built from log-odds (exact even at λ = 1e6); `p`, `q` are the realized probabilities of the
    sampler (threshold/2^64).
    """

    logit_p: np.ndarray
    logit_q: np.ndarray

    def __post_init__(self):
        lp, lq = np.asarray(self.logit_p, np.float64), np.asarray(self.logit_q, np.float64)
        lp, lq = np.broadcast_arrays(lp, lq)
        if lp.ndim != 1:
            raise ValueError("BitRandomizer needs 1-D per-position log-odds")
        object.__setattr__(self, "logit_p", lp.copy())
        object.__setattr__(self, "logit_q", lq.copy())
        tp = [_threshold(float(x)) for x in lp]
        tq = [_threshold(float(x)) for x in lq]
        object.__setattr__(self, "_tp", tp)
        object.__setattr__(self, "_tq", tq)

    @property
    def size(self) -> int:
        return self.logit_p.shape[0]

    @property
    def p(self) -> np.ndarray:
        return np.array([t / _TWO64 for t in self._tp])

    @property
    def q(self) -> np.ndarray:
        return np.array([t / _TWO64 for t in self._tq])

    def log_probs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ln p, ln(1−p), ln q, ln(1−q)) of the realized probabilities (−inf where 0)."""
        def logs(ts):
            ln = lambda t: math.log(t) - 64 * math.log(2) if t > 0 else -math.inf
            return np.array([ln(t) for t in ts]), np.array([ln(_TWO64 - t) for t in ts])
        lp1, lp0 = logs(self._tp)
        lq1, lq0 = logs(self._tq)
        return lp1, lp0, lq1, lq0

    def per_bit_leakage(self) -> np.ndarray:
        """[L]: max(|ln(p/q)|, |ln((1−p)/(1−q))|) per position (inf if some output is
        possible from one input bit and impossible from the other)."""
        lp1, lp0, lq1, lq0 = self.log_probs()
        with np.errstate(invalid="ignore"):
            one = _abs_log_ratio(lp1, lq1)
            zero = _abs_log_ratio(lp0, lq0)
        return np.maximum(one, zero)

    def perturb(self, key: jax.Array, bits: np.ndarray | jax.Array,
                row_ids: np.ndarray | jax.Array | None = None,
                chunk_rows: int = 1024) -> np.ndarray:
        """uint8 [N, L] → randomized uint8 [N, L]; row j uses `fold_in(key, row_ids[j])`.

        `key` is SECRET randomness. row_ids default to 0..N−1.
        """
        bits = np.asarray(bits)
        if bits.ndim != 2 or bits.shape[1] != self.size:
            raise ValueError(f"bits must be [N, {self.size}], got {bits.shape}")
        if not np.isin(bits, (0, 1)).all():
            raise ValueError("bits must be 0/1")
        n = bits.shape[0]
        row_ids = np.arange(n) if row_ids is None else np.asarray(row_ids)
        tables = _threshold_tables(self._tp, self._tq)
        out = np.empty_like(bits, dtype=np.uint8)
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            out[start:stop] = np.asarray(_perturb_rows(
                key, jnp.asarray(bits[start:stop], jnp.uint8),
                jnp.asarray(row_ids[start:stop], jnp.uint32), *tables))
        return out


def _abs_log_ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a − b| for log-probabilities, 0 when both are −inf (an impossible output leaks nothing)."""
    both_impossible = np.isneginf(a) & np.isneginf(b)
    return np.where(both_impossible, 0.0, np.abs(a - b))


def _split64(t: int) -> tuple[int, int, bool]:
    """Threshold T → (hi, lo) of T − 1 and whether T == 0 (never)."""
    if t == 0:
        return 0, 0, True
    t1 = t - 1
    return t1 >> 32, t1 & 0xFFFFFFFF, False


def _threshold_tables(tp: Sequence[int], tq: Sequence[int]):
    """uint32 hi/lo of T−1 and a never-flag, for input bit 1 (p) and 0 (q): 6 arrays [L]."""
    p = [_split64(t) for t in tp]
    q = [_split64(t) for t in tq]
    arr = lambda xs, i, dt: jnp.asarray(np.array([x[i] for x in xs], dt))
    return (arr(p, 0, np.uint32), arr(p, 1, np.uint32), arr(p, 2, bool),
            arr(q, 0, np.uint32), arr(q, 1, np.uint32), arr(q, 2, bool))


@jax.jit
def _perturb_rows(key, bits, row_ids, p_hi, p_lo, p_never, q_hi, q_lo, q_never):
    def one_row(row_bits, row_id):
        u = jax.random.bits(jax.random.fold_in(key, row_id), (row_bits.shape[0], 2), jnp.uint32)
        is_one = row_bits == 1
        hi = jnp.where(is_one, p_hi, q_hi)
        lo = jnp.where(is_one, p_lo, q_lo)
        never = jnp.where(is_one, p_never, q_never)
        # u (64 bits) ≤ T − 1  ⇔  u < T:  P = T / 2^64.
        below = (u[:, 0] < hi) | ((u[:, 0] == hi) & (u[:, 1] <= lo))
        return (below & ~never).astype(jnp.uint8)
    return jax.vmap(one_row)(bits, row_ids)


def worst_case_epsilon(randomizer: BitRandomizer) -> float:
    """Exact worst-case ε of independent per-bit randomization when inputs may differ in every
    bit: Σ_i max(|ln(p_i/q_i)|, |ln((1−p_i)/(1−q_i))|) (realized probabilities)."""
    return float(np.sum(randomizer.per_bit_leakage()))


# ----------------------------------------------------------------------------- OME (Theorem 1)


def _parity_is_high(r_l: int, high_p_parity: str) -> np.ndarray:
    if high_p_parity not in PARITIES:
        raise ValueError(f"high_p_parity must be one of {PARITIES}, got {high_p_parity!r}")
    index = np.arange(1, r_l + 1)                                 # 1-based global bit index
    return (index % 2 == 0) if high_p_parity == "even" else (index % 2 == 1)


def _check_eps_lam(eps: float, lam: float) -> None:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"ε must be a finite number > 0, got {eps!r}")
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"λ must be a finite number > 0, got {lam!r}")


def ome_randomizer(eps: float, lam: float, r: int, l: int,
                   high_p_parity: str = "even") -> BitRandomizer:
    """Theorem 1's per-bit probabilities over r·l bits, as log-odds:
    logit p = ln λ (high parity) or −3 ln λ (other), logit q = −(ln λ + ε/(rl))."""
    _check_eps_lam(eps, lam)
    r_l = r * l
    high = _parity_is_high(r_l, high_p_parity)
    ln_lam = math.log(lam)
    logit_p = np.where(high, ln_lam, -3.0 * ln_lam)
    logit_q = np.full(r_l, -(ln_lam + eps / r_l))
    return BitRandomizer(logit_p, logit_q)


def ome_worst_case_epsilon(eps: float, lam: float, r: int, l: int,
                           high_p_parity: str = "even") -> float:
    """ε_true of Theorem 1's mechanism: the exact worst case over input pairs (see module doc)."""
    return worst_case_epsilon(ome_randomizer(eps, lam, r, l, high_p_parity))


def ome_theorem1_log_ratio(randomizer: BitRandomizer) -> float:
    """ln Π_i (p_i/(1−p_i))·((1−q_i)/q_i): the quantity Theorem 1's proof bounds (= ε for OME).
    Not a privacy guarantee: it is the log-ratio of ONE output (all ones vs all zeros input),
    not the worst case over outputs."""
    lp1, lp0, lq1, lq0 = randomizer.log_probs()
    return float(np.sum(lp1 - lp0 + lq0 - lq1))


# ----------------------------------------------------------------------------- mechanisms


@dataclasses.dataclass(frozen=True)
class OME:
    """Theorem 1's OME on z-scored vectors of width r (ε here is the CLAIMED ε)."""

    eps: float
    lam: float
    r: int
    m: int = M_BITS
    n: int = N_BITS
    high_p_parity: str = "even"
    name: str = "ome"

    @property
    def l(self) -> int:
        return bit_length(self.m, self.n)

    @property
    def randomizer(self) -> BitRandomizer:
        return ome_randomizer(self.eps, self.lam, self.r, self.l, self.high_p_parity)

    @property
    def num_features(self) -> int:
        return self.r * self.l

    def privatize(self, key: jax.Array, v: np.ndarray,
                  row_ids: np.ndarray | None = None) -> np.ndarray:
        """z-scored [N, r] → randomized bits uint8 [N, r·l] (key: SECRET)."""
        return self.randomizer.perturb(key, encode(_check_width(v, self.r), self.m, self.n),
                                       row_ids)

    def privacy_report(self) -> dict:
        rand = self.randomizer
        p, q = rand.p, rand.q
        high = _parity_is_high(self.num_features, self.high_p_parity)
        return dict(mechanism=self.name, epsilon_claimed=float(self.eps),
                    epsilon_true=worst_case_epsilon(rand), lam=float(self.lam), r=self.r,
                    l=self.l, m=self.m, n=self.n, high_p_parity=self.high_p_parity,
                    p_high=float(p[high][0]), p_low=float(p[~high][0]), q=float(q[0]),
                    note="epsilon_claimed is Theorem 1's; epsilon_true is the exact worst case "
                         "over inputs differing in every bit")


@dataclasses.dataclass(frozen=True)
class CalibratedOME:
    """OME's bit encoding with per-bit randomized response whose TRUE ε is `eps`.

    bit_weights: per position within a coordinate (length l), ≥ 0; position i gets
    ε_i = ε · w_i / (r Σ w). Default uniform (ε/(rl) per bit).
    """

    eps: float
    r: int
    m: int = M_BITS
    n: int = N_BITS
    bit_weights: tuple[float, ...] | None = None
    name: str = "ome_calibrated"

    @property
    def l(self) -> int:
        return bit_length(self.m, self.n)

    @property
    def num_features(self) -> int:
        return self.r * self.l

    @property
    def randomizer(self) -> BitRandomizer:
        _check_eps_lam(self.eps, 1.0)
        w = np.ones(self.l) if self.bit_weights is None else np.asarray(self.bit_weights, float)
        if w.shape != (self.l,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"bit_weights must be {self.l} non-negative numbers, not all 0")
        per_bit = np.tile(self.eps * w / (self.r * w.sum()), self.r)
        return BitRandomizer(per_bit, -per_bit)

    def privatize(self, key: jax.Array, v: np.ndarray,
                  row_ids: np.ndarray | None = None) -> np.ndarray:
        return self.randomizer.perturb(key, encode(_check_width(v, self.r), self.m, self.n),
                                       row_ids)

    def privacy_report(self) -> dict:
        true = worst_case_epsilon(self.randomizer)
        saturated = true < self.eps * (1 - 1e-9)
        return dict(mechanism=self.name, epsilon_claimed=float(self.eps), epsilon_true=true,
                    r=self.r, l=self.l, m=self.m, n=self.n,
                    bit_weights=None if self.bit_weights is None else list(self.bit_weights),
                    saturated=saturated,
                    note="per-bit randomized response, ε split over the r·l bits"
                         + ("; per-bit budget beyond the sampler's 2^-64 resolution, so the "
                            "true ε is below the request" if saturated else ""))


UE_KINDS = ("sue", "oue")


def ue_randomizer(kind: str, eps: float, r: int, levels: int) -> BitRandomizer:
    """SUE / OUE with Δf = 2r (paper §2): t = ε/Δf; SUE p = e^t/(1+e^t), q = 1 − p;
    OUE p = 1/2, q = 1/(1+e^t); the same p, q on all r·levels bits."""
    _check_eps_lam(eps, 1.0)
    t = eps / (2 * r)
    if kind == "sue":
        lp, lq = t, -t
    elif kind == "oue":
        lp, lq = 0.0, -t
    else:
        raise ValueError(f"unary encoding kind must be one of {UE_KINDS}, got {kind!r}")
    size = r * levels
    return BitRandomizer(np.full(size, lp), np.full(size, lq))


def ue_worst_case_epsilon(randomizer: BitRandomizer, r: int, levels: int) -> float:
    """Exact worst-case ε of a unary encoding (each of r blocks one-hot over `levels`): two
    inputs differ in at most two bits per block (one 1→0, one 0→1), so per block the worst
    case is max over ordered pairs (a, b), a ≠ b, of leak_a(1 vs 0) + leak_b(0 vs 1)."""
    lp1, lp0, lq1, lq0 = randomizer.log_probs()
    with np.errstate(invalid="ignore"):
        # Input bit 1 in v and 0 in v': best output's ln P(o|1) − ln P(o|0), and reversed.
        up = np.maximum(lp1 - lq1, lp0 - lq0)
        down = np.maximum(lq1 - lp1, lq0 - lp0)
    total = 0.0
    for block in range(r):
        sl = slice(block * levels, (block + 1) * levels)
        u, d = up[sl], down[sl]
        pair = u[:, None] + d[None, :]
        np.fill_diagonal(pair, -np.inf)
        total += float(pair.max())
    return total


@dataclasses.dataclass(frozen=True)
class UnaryEncoding:
    """SUE / OUE (Wang et al. 2017) on z-scored vectors: `levels` bins over `value_range`."""

    kind: str
    eps: float
    r: int
    levels: int = 32
    value_range: tuple[float, float] = (-4.0, 4.0)

    @property
    def name(self) -> str:
        return self.kind

    @property
    def num_features(self) -> int:
        return self.r * self.levels

    @property
    def randomizer(self) -> BitRandomizer:
        return ue_randomizer(self.kind, self.eps, self.r, self.levels)

    def privatize(self, key: jax.Array, v: np.ndarray,
                  row_ids: np.ndarray | None = None) -> np.ndarray:
        bits = unary_encode(_check_width(v, self.r), self.levels, self.value_range)
        return self.randomizer.perturb(key, bits, row_ids)

    def privacy_report(self) -> dict:
        return dict(mechanism=self.kind, epsilon_claimed=float(self.eps),
                    epsilon_true=ue_worst_case_epsilon(self.randomizer, self.r, self.levels),
                    r=self.r, levels=self.levels, value_range=list(self.value_range),
                    note="Δf = 2r; epsilon_true is the exact worst case over one-hot inputs")


def _check_width(v: np.ndarray, r: int) -> np.ndarray:
    v = np.asarray(v, np.float64)
    if v.ndim != 2 or v.shape[1] != r:
        raise ValueError(f"expected representations [N, {r}], got {v.shape}")
    return v
