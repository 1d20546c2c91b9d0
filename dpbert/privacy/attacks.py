r"""What an eavesdropper recovers from a protected sentence representation.

The attacker holds a public corpus with its baseline representations (the index) and sees a
protected representation of one corpus sentence; the attack returns a corpus sentence x*, and
the leakage is measured on the pair (x, x*) (TextHide paper §4.2, FINETUNE_SPEC §2.5).

* **RSS** (representation similarity search, `rss`): x* = the index sentence whose baseline
  representation is nearest to the query (cosine; the paper's "argmin cos" read as the nearest).
* **abs-RSS** (`abs_rss`): RSS on |·|, which sign masks cannot change (|σ ∘ e| = |e|): against
  TextHide it leaves only the protection of the mixing.
* **RepRecon** (`train_reprecon`): an MLP (1024, 1024) trained with L2 to map protected → baseline
  representations on pairs the attacker can make itself (train split), then RSS on its output.
* **Bit recovery** (`ml_bit_recovery`): for OME / SUE / OUE bit vectors, the maximum-likelihood
  index entry under the (public) randomizer: argmax_i Σ_j ln P(b'_j | B_ij). This is the optimal
  attacker for a uniform prior over the index; nearest-Hamming is a special case. For dχ-noised
  representations (noise density decreasing in ‖·‖) the ML answer is the Euclidean nearest
  neighbour (`nearest_neighbours(metric="euclidean")`).

Metrics (`pair_metrics`, means over queries): Identity 1[x* = x] (same text), Jaccard of the
lower-cased word sets, TF-IDF cosine (`Tfidf`, fit on the corpus; scikit-learn's defaults:
raw counts, smooth idf ln((1+n)/(1+df)) + 1, l2 rows, tokens \b\w\w+\b), Label 1[y* = y], and
the cosine of a frozen sentence encoder's embeddings (pass them; e.g. MiniLM mean pooling via
`dpbert.models.features.encode_texts(..., pooling="mean")`). `random_baseline` answers a uniformly random
index entry (the paper's Rand).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import sparse

METRICS = ("identity", "jaccard", "tfidf", "label", "sentence_cosine")
_WORD = re.compile(r"\w+", re.UNICODE)
_TFIDF_TOKEN = re.compile(r"(?u)\b\w\w+\b")


# ----------------------------------------------------------------------------- text metrics


def word_set(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORD.findall(text))


def jaccard(a: frozenset, b: frozenset) -> float:
    """|A ∩ B| / |A ∪ B| (1.0 for two empty sets)."""
    union = len(a | b)
    return 1.0 if union == 0 else len(a & b) / union


class Tfidf:
    """TF-IDF rows (sparse, l2-normalised) of a corpus; `cosine(i, j)` for index pairs."""

    def __init__(self, corpus: Sequence[str]):
        docs = [_TFIDF_TOKEN.findall(t.lower()) for t in corpus]
        vocab: dict[str, int] = {}
        rows, cols, vals = [], [], []
        for r, tokens in enumerate(docs):
            counts: dict[int, int] = {}
            for tok in tokens:
                c = vocab.setdefault(tok, len(vocab))
                counts[c] = counts.get(c, 0) + 1
            for c, v in counts.items():
                rows.append(r)
                cols.append(c)
                vals.append(v)
        n = len(docs)
        tf = sparse.csr_matrix((np.asarray(vals, np.float64), (rows, cols)),
                               shape=(n, max(len(vocab), 1)))
        df = np.bincount(tf.indices, minlength=tf.shape[1])
        self.idf = np.log((1 + n) / (1 + df)) + 1.0
        x = tf.multiply(self.idf[None, :]).tocsr()
        norms = np.sqrt(np.asarray(x.multiply(x).sum(1)).ravel())
        self.matrix = sparse.diags(1.0 / np.maximum(norms, 1e-300)) @ x
        self.vocabulary = vocab

    def cosine(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """[Q] cosine of corpus rows i[q] and j[q]."""
        a, b = self.matrix[np.asarray(i)], self.matrix[np.asarray(j)]
        return np.asarray(a.multiply(b).sum(1)).ravel()


@dataclasses.dataclass
class Corpus:
    """The attacker's corpus: texts, labels, and (optional) frozen sentence-encoder embeddings.

    sentence_embeddings: [N, d] (any scale; cosines are taken).
    """

    texts: Sequence[str]
    labels: np.ndarray
    sentence_embeddings: np.ndarray | None = None

    def __post_init__(self):
        self.labels = np.asarray(self.labels)
        if len(self.labels) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels")
        self._words = [word_set(t) for t in self.texts]
        self._tfidf = Tfidf(self.texts)
        if self.sentence_embeddings is not None:
            e = np.asarray(self.sentence_embeddings, np.float64)
            if e.shape[0] != len(self.texts):
                raise ValueError("one sentence embedding per text is needed")
            self._unit = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)

    def __len__(self) -> int:
        return len(self.texts)


def pair_metrics(corpus: Corpus, query_ids: np.ndarray, answer_ids: np.ndarray
                 ) -> dict[str, float]:
    """Mean leakage metrics over pairs (x = corpus[query_ids[q]], x* = corpus[answer_ids[q]])."""
    q = np.asarray(query_ids)
    a = np.asarray(answer_ids)
    if q.shape != a.shape:
        raise ValueError("query_ids and answer_ids must have the same shape")
    out = {
        "identity": float(np.mean([corpus.texts[i] == corpus.texts[j] for i, j in zip(q, a)])),
        "jaccard": float(np.mean([jaccard(corpus._words[i], corpus._words[j])
                                  for i, j in zip(q, a)])),
        "tfidf": float(np.mean(corpus._tfidf.cosine(q, a))),
        "label": float(np.mean(corpus.labels[q] == corpus.labels[a])),
    }
    if corpus.sentence_embeddings is not None:
        out["sentence_cosine"] = float(np.mean(np.sum(corpus._unit[q] * corpus._unit[a], 1)))
    return out


# ----------------------------------------------------------------------------- search


def nearest_neighbours(index: np.ndarray, queries: np.ndarray, metric: str = "cosine",
                       chunk: int = 512) -> np.ndarray:
    """int [Q]: for each query the index row nearest by `metric` ("cosine" | "euclidean")."""
    index = np.asarray(index, np.float32)
    queries = np.asarray(queries, np.float32)
    if index.ndim != 2 or queries.ndim != 2 or index.shape[1] != queries.shape[1]:
        raise ValueError(f"index {index.shape} and queries {queries.shape} must be [*, d]")
    if metric == "cosine":
        unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        idx, offset = unit(index), None
        queries = unit(queries)
    elif metric == "euclidean":
        # argmin ‖x − z‖² = argmax 2 x·z − ‖x‖²
        idx, offset = index, -np.sum(index * index, 1)
        queries = 2 * queries
    else:
        raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}")
    out = np.empty(len(queries), np.int64)
    for s in range(0, len(queries), chunk):
        scores = queries[s:s + chunk] @ idx.T
        if offset is not None:
            scores = scores + offset
        out[s:s + chunk] = np.argmax(scores, 1)
    return out


def bit_log_likelihood_weights(query_bits: np.ndarray, randomizer: Any) -> np.ndarray:
    """float [Q, L]: w_j = ln P(b'_j | B_j = 1) − ln P(b'_j | B_j = 0) for each observed bit, so
    that ln P(b' | B_i) = const(b') + B_i · w."""
    lp1, lp0, lq1, lq0 = (np.maximum(x, -1e4) for x in randomizer.log_probs())
    b = np.asarray(query_bits, np.float64)
    return b * (lp1 - lq1) + (1 - b) * (lp0 - lq0)


def ml_bit_recovery(index_bits: np.ndarray, query_bits: np.ndarray, randomizer: Any,
                    chunk: int = 256) -> np.ndarray:
    """int [Q]: argmax_i ln P(query | index_bits[i]) under the known per-bit randomizer."""
    index = np.asarray(index_bits, np.float32)
    w = bit_log_likelihood_weights(query_bits, randomizer).astype(np.float32)
    out = np.empty(len(w), np.int64)
    for s in range(0, len(w), chunk):
        out[s:s + chunk] = np.argmax(w[s:s + chunk] @ index.T, 1)
    return out


def rss(corpus: Corpus, index_reps: np.ndarray, query_ids: np.ndarray, query_reps: np.ndarray,
        metric: str = "cosine") -> dict[str, float]:
    """RSS: answer each protected query by its nearest index representation; mean metrics."""
    answers = nearest_neighbours(index_reps, query_reps, metric)
    return pair_metrics(corpus, query_ids, answers)


def abs_rss(corpus: Corpus, index_reps: np.ndarray, query_ids: np.ndarray,
            query_reps: np.ndarray) -> dict[str, float]:
    """RSS on coordinate-wise absolute values: |σ ∘ e| = |e| for any sign mask σ, so this
    attack needs no mask and sees through TextHide's masks entirely (only mixing is left)."""
    return rss(corpus, np.abs(index_reps), query_ids, np.abs(query_reps))


def random_baseline(rng: np.random.Generator, corpus: Corpus, query_ids: np.ndarray
                    ) -> dict[str, float]:
    """Rand: each query answered by a uniformly random corpus entry."""
    return pair_metrics(corpus, query_ids, rng.integers(0, len(corpus), size=len(query_ids)))


def hide_corpus(reps: np.ndarray, labels: np.ndarray, m: int, k: int, batch: int, seed: int,
                public_reps: np.ndarray | None = None) -> np.ndarray:
    """What a TextHide eavesdropper sees for every corpus sentence: float32 [N, d].

    The corpus [N, d] is hidden in shuffled batches of `batch` (`dpbert.privacy.texthide.encrypt`
    with a pool of m masks and k-way mixing; with `public_reps` [N_pub, d], N_pub >= batch,
    inter-TextHide with public rows in the even slots). Row i of the result is the hidden row
    whose first (identity-permutation) slot holds sentence i, so an attack on row i is scored
    against sentence i. A benchmark tool: the pool and the hiding are SEEDED (`seed`),
    never a private release.
    """
    from dpbert.privacy import texthide  # noqa: PLC0415 (texthide imports flax modules)

    n, d = reps.shape
    if public_reps is not None and len(public_reps) < batch:
        raise ValueError(f"inter hiding draws {batch} public rows per batch; only "
                         f"{len(public_reps)} public rows given")
    key = jax.random.key(seed)
    pool = texthide.make_mask_pool(jax.random.fold_in(key, 0), m, d)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    order = np.concatenate([order, order[:(-n) % batch]])
    public = None if public_reps is None else jnp.asarray(public_reps, jnp.float32)
    enc = jax.jit(lambda kk, e, y, pub: texthide.encrypt(kk, e, y, pool, k,
                                                         public_reps=pub).reps)
    onehot = np.eye(int(labels.max()) + 1, dtype=np.float32)[labels]
    out = np.zeros_like(reps, dtype=np.float32)
    for b, start in enumerate(range(0, len(order), batch)):
        idx = order[start:start + batch]
        pub = (None if public is None
               else public[rng.choice(len(public_reps), size=batch, replace=False)])
        out[idx] = np.asarray(enc(jax.random.fold_in(key, b + 1), jnp.asarray(reps[idx]),
                                  jnp.asarray(onehot[idx]), pub))  # padded repeats: a later row
    return out


# ----------------------------------------------------------------------------- RepRecon


def _mlp_init(key, sizes):
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = jax.random.normal(jax.random.fold_in(key, i), (a, b), jnp.float32) * np.sqrt(2.0 / a)
        params.append({"w": w, "b": jnp.zeros((b,), jnp.float32)})
    return params


def _mlp_apply(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


@functools.lru_cache(maxsize=8)
def _reprecon_epoch(learning_rate: float, batch_size: int):
    """A jitted epoch of Adam on the L2 loss (cached, so repeated attacks compile once)."""
    tx = optax.adam(learning_rate)

    def loss_fn(p, xb, yb):
        return jnp.mean(jnp.sum(jnp.square(_mlp_apply(p, xb) - yb), -1))

    @jax.jit
    def epoch(params, opt, x, y, key):
        n = x.shape[0]
        steps = max(n // batch_size, 1)
        order = jax.random.permutation(key, n)[:steps * batch_size].reshape(steps, -1)

        def step(c, idx):
            p, o = c
            loss, g = jax.value_and_grad(loss_fn)(p, x[idx], y[idx])
            upd, o = tx.update(g, o, p)
            return (optax.apply_updates(p, upd), o), loss
        (params, opt), losses = jax.lax.scan(step, (params, opt), order)
        return params, opt, jnp.mean(losses)

    return tx, epoch


def train_reprecon(key: jax.Array, protected: np.ndarray, baseline: np.ndarray, *,
                   hidden: Sequence[int] = (1024, 1024), epochs: int = 20, batch_size: int = 64,
                   learning_rate: float = 1e-3):
    """Trains f: protected → baseline (MLP, ReLU, mean squared L2 loss, Adam; the paper names
    only the architecture, the L2 objective and 20 epochs). Returns `apply(x) -> [N, d]`."""
    x = jnp.asarray(protected, jnp.float32)
    y = jnp.asarray(baseline, jnp.float32)
    if x.shape[0] != y.shape[0]:
        raise ValueError("one baseline representation per protected one is needed")
    k_init, k_data = jax.random.split(key)
    params = _mlp_init(k_init, [x.shape[1], *hidden, y.shape[1]])
    tx, epoch = _reprecon_epoch(float(learning_rate), int(batch_size))
    opt = tx.init(params)
    for e in range(epochs):
        params, opt, _ = epoch(params, opt, x, y, jax.random.fold_in(k_data, e))
    apply = jax.jit(_mlp_apply)
    return lambda z: np.asarray(apply(params, jnp.asarray(z, jnp.float32)))
