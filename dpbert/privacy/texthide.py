r"""TextHide: (m, k)-TextHide encryption of sentence representations (Huang et al. 2020).

Fine-tuning on *hidden* representations. Each training step (Algorithm 1 of the paper):

    E = f(x_1..x_b)                      [b, d]  encoder output (BERT pooled output)
    π_1 = identity; π_2..π_k             i.i.d. uniform permutations of [b] (fixed points allowed)
    Λ[i, :] = |g_i| / Σ_j |g_ij|,        g_i ~ N(0, I_k)   (rows on the simplex, E Λ_ij = 1/k)
    σ_i ~ Uniform(M)                     per example and per step, M = {σ_1..σ_m} ⊂ {−1,+1}^d
    ẽ_i = σ_i ∘ Σ_j Λ_ij E[π_j(i)]       ỹ_i = Σ_j Λ_ij Y[π_j(i)]
    L   = mean_i −Σ_c ỹ_ic log softmax(h(ẽ_i))_c     (regression: mean_i (h(ẽ_i) − ỹ_i)²)

Gradients reach the encoder and the head through the mix and the mask (nothing is decrypted).

* **Mask pool** `M` is drawn ONCE from a secret key (`make_mask_pool(key, m, d)`), kept by the
  data owner and never shipped with the model. m = 0: no mask (σ = 1). m = ∞ (`INFINITE_POOL`,
  the official code's −1): a fresh uniform mask per example per step.
* **Inter-TextHide** (`public_reps=`): the ⌈k/2⌉ odd 1-based slots (j = 1, 3, …; j = 1 is the
  example itself) are private, the ⌊k/2⌋ even slots (j = 2, 4, …) hold public unlabeled
  examples (a permuted public batch encoded by the same encoder, gradients flow). Labels:
  `label_mode="paper"` (default, the paper's equation) ỹ_i = Σ_{j∈P} Λ_ij Y[π_j(i)] / Σ_{j∈P} Λ_ij
  over the private slots P; `label_mode="code"` (the official code) fills the public slots'
  labels with the labels of the private examples at the same permuted index, unnormalised.
* **Inference**: k = 1 (no mixing) but the mask stays: ŷ = argmax h(σ ∘ f(x)), σ ~ Uniform(M)
  per example (`texthide_eval_logits`). m = 1 makes evaluation deterministic.

## Why this is a BATCH loss, and why per-example DP-SGD is refused

The mixed row ẽ_i depends on k examples (i and π_2(i)..π_k(i)), and every example enters exactly
k rows (once per permutation). A per-example gradient in the DP-SGD sense (the gradient of
example i's own loss, clipped to C) therefore does not exist: the loss of row i carries the
gradients of k examples, and example i influences k rows. Clipping "per example" inside a
`vmap` would see a batch of one (mixing an example only with itself), which silently turns
TextHide off, and clipping the mixed rows bounds a row's, not an example's, contribution (the
sensitivity would be k·C, a group-privacy argument the accountant does not make). So
`texthide_batch_loss` takes the whole batch, refuses to run on an unbatched (vmapped) example,
and `check_privacy_combination` refuses TextHide together with per-example DP-SGD. TextHide's
protection is a hiding argument (k-vector subset sum + secret masks), not differential privacy;
it has no ε.

## Wiring (fine-tuning loop, non-DP)

    pool = texthide.make_mask_pool(secret_pool_key, m, d)          # once per client, kept secret
    def encoder_apply(params, inputs, dropout_key) -> [b, d]        # pooled output
    def head_apply(params, reps, dropout_key) -> [b, C]
    loss, metrics = texthide_batch_loss(encoder_apply, head_apply, params, batch,
                                        jax.random.fold_in(secret_step_key, step), pool=pool,
                                        k=k, dropout_key=dropout_key, public_inputs=public_batch)
    eval: logits = texthide_eval_logits(encoder_apply, head_apply, params, inputs, key, pool=pool)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from dpbert import prng

INFINITE_POOL = -1  # m = ∞: a fresh uniform mask per example per step (official code: −1)
LABEL_MODES = ("paper", "code")
TASKS = ("classification", "regression")
HEAD_INPUT_NORMS = ("none", "rms")

EncoderApply = Callable[[Any, Mapping[str, jax.Array], "jax.Array | None"], jax.Array]
HeadApply = Callable[[Any, jax.Array, "jax.Array | None"], jax.Array]


class IncompatiblePrivacyModes(ValueError):
    """TextHide asked for together with per-example DP-SGD (see the module docstring)."""


def check_privacy_combination(*, per_example_dp: bool) -> None:
    """Raises `IncompatiblePrivacyModes` if TextHide would be combined with per-example DP-SGD."""
    if per_example_dp:
        raise IncompatiblePrivacyModes(
            "TextHide cannot be combined with per-example DP-SGD: its loss mixes k examples per "
            "row and every example enters k rows, so there is no per-example gradient to clip "
            "(a vmapped per-example loss would mix each example only with itself, silently "
            "disabling TextHide). Run TextHide with a non-DP optimizer; its protection is "
            "hiding (secret masks + mixing), not an ε.")


VARIANTS = ("intra", "inter")


@dataclasses.dataclass(frozen=True)
class TextHideSpec:
    """The validated TextHide settings of a run (`privacy.m`, `privacy.k`, `privacy.variant`,
    `privacy.label_mode`), with the line a results file / model card should carry."""

    m: int = 256
    k: int = 4
    variant: str = "intra"
    label_mode: str = "paper"

    def __post_init__(self):
        _check_m(self.m)
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"TextHide k must be a positive integer, got {self.k!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"TextHide variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant == "inter" and self.k < 2:
            raise ValueError("inter-TextHide mixes public examples into slots 2, 4, …: k ≥ 2")
        if self.label_mode not in LABEL_MODES:
            raise ValueError(f"label_mode must be one of {LABEL_MODES}, got {self.label_mode!r}")

    def report(self) -> dict:
        m = "∞" if self.m == INFINITE_POOL else self.m
        return {"mechanism": "texthide", "m": self.m, "k": self.k, "variant": self.variant,
                "label_mode": self.label_mode, "epsilon": None,
                "note": f"({m}, {self.k})-TextHide {self.variant}: hiding by secret sign masks "
                        f"and mixing, not differential privacy (no ε)"}


# ----------------------------------------------------------------------------- mask pool


def _check_m(m: int) -> None:
    if not isinstance(m, int) or isinstance(m, bool) or (m < 0 and m != INFINITE_POOL):
        raise ValueError(f"TextHide pool size m must be an integer ≥ 0 or INFINITE_POOL (−1), "
                         f"got {m!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MaskPool:
    """A client's secret mask pool.

    masks: float32 [m, d] with entries exactly ±1 (shape [0, d] when m is 0 or ∞).
    m: pool size (static): 0 = no mask, INFINITE_POOL = fresh mask per example per step.
    d: representation width (static).
    """

    masks: jax.Array
    m: int = dataclasses.field(metadata=dict(static=True))
    d: int = dataclasses.field(metadata=dict(static=True))


def make_mask_pool(key: jax.Array | None, m: int, d: int) -> MaskPool:
    """Draws the pool M = {σ_1..σ_m}, σ_j i.i.d. uniform on {−1,+1}^d, from a SECRET key.

    The key must come from secret randomness (OS entropy at run start, stored only with the
    private state): anyone holding it can remove the masks. `key` may be None only for m = 0
    and m = ∞, which draw nothing here.
    """
    _check_m(m)
    if not isinstance(d, int) or d <= 0:
        raise ValueError(f"representation width d must be a positive integer, got {d!r}")
    if m in (0, INFINITE_POOL):
        return MaskPool(jnp.zeros((0, d), jnp.float32), m, d)
    if key is None:
        raise ValueError("a mask pool with m ≥ 1 needs a secret key")
    masks = jax.random.rademacher(key, (m, d), dtype=jnp.float32)
    return MaskPool(masks, m, d)


def choose_mask_indices(key: jax.Array, b: int, m: int) -> jax.Array:
    """int32 [b]: for each example an index drawn uniformly from the pool [0, m)."""
    if m < 1:
        raise ValueError(f"choosing from a pool needs m ≥ 1, got {m}")
    return jax.random.randint(key, (b,), 0, m, dtype=jnp.int32)


def draw_masks(key: jax.Array, pool: MaskPool, b: int) -> jax.Array:
    """float32 [b, d]: σ_i for each of b examples (ones for m = 0, fresh signs for m = ∞)."""
    if pool.m == 0:
        return jnp.ones((b, pool.d), jnp.float32)
    if pool.m == INFINITE_POOL:
        return jax.random.rademacher(key, (b, pool.d), dtype=jnp.float32)
    return pool.masks[choose_mask_indices(key, b, pool.m)]


def apply_masks(masks: jax.Array, reps: jax.Array) -> jax.Array:
    """σ ∘ e (coordinate-wise sign flips; σ ∘ σ ∘ e = e)."""
    return reps * masks.astype(reps.dtype)


# ----------------------------------------------------------------------------- mixing


def mixing_coefficients(key: jax.Array, b: int, k: int) -> jax.Array:
    """float32 [b, k]: Λ[i] = |g_i| / Σ_j |g_ij|, g_i ~ N(0, I_k). k = 1 gives exactly 1."""
    g = jnp.abs(jax.random.normal(key, (b, k), jnp.float32))
    return g / jnp.sum(g, axis=1, keepdims=True)


def mixing_permutations(key: jax.Array, b: int, k: int) -> jax.Array:
    """int32 [k, b]: row 0 the identity π_1, rows 1..k−1 i.i.d. uniform permutations of [b]."""
    identity = jnp.arange(b, dtype=jnp.int32)
    if k == 1:
        return identity[None]
    keys = jax.random.split(key, k - 1)
    others = jax.vmap(lambda kk: jax.random.permutation(kk, b))(keys).astype(jnp.int32)
    return jnp.concatenate([identity[None], others], axis=0)


def public_slots(k: int) -> tuple[int, ...]:
    """0-based slot indices that hold public examples in inter-TextHide (1-based j = 2, 4, …)."""
    return tuple(range(1, k, 2))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Hidden:
    """One TextHide-encrypted batch and the secrets used (the secrets never leave the client).

    reps:   [b, d] ẽ.            labels: [b, C] (classification) or [b] (regression) ỹ.
    coefficients: [b, k] Λ.      permutations: [k, b] π (private batch indices).
    public_permutations: [k, b] indices into the public batch (inter; zeros otherwise).
    masks:  [b, d] σ.
    """

    reps: jax.Array
    labels: jax.Array
    coefficients: jax.Array
    permutations: jax.Array
    public_permutations: jax.Array
    masks: jax.Array


def encrypt(key: jax.Array, reps: jax.Array, labels: jax.Array, pool: MaskPool, k: int, *,
            public_reps: jax.Array | None = None, label_mode: str = "paper") -> Hidden:
    """Algorithm 1 on an encoded batch.

    Args:
      key: secret per-step key (fold the step into a secret base key).
      reps: [b, d] private representations E.
      labels: [b, C] one-hot / soft labels, or [b] regression targets.
      pool: the client's `MaskPool` (pool.d == d).
      k: number of representations mixed per row (k ≥ 1).
      public_reps: [b_pub, d] public unlabeled representations for inter-TextHide (b_pub ≥ b;
        `label_mode="code"` needs b_pub == b); None = intra-TextHide.
      label_mode: "paper" (normalise by the private slots' Λ) or "code" (see module docstring).
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"TextHide k must be a positive integer, got {k!r}")
    if label_mode not in LABEL_MODES:
        raise ValueError(f"label_mode must be one of {LABEL_MODES}, got {label_mode!r}")
    if reps.ndim != 2:
        raise ValueError(f"representations must be [b, d], got shape {reps.shape}")
    b, d = reps.shape
    if pool.d != d:
        raise ValueError(f"mask pool width {pool.d} != representation width {d}")
    if labels.shape[0] != b:
        raise ValueError(f"{labels.shape[0]} labels for {b} representations")
    k_perm, k_coef, k_mask, k_pub = jax.random.split(key, 4)
    perms = mixing_permutations(k_perm, b, k)
    lam = mixing_coefficients(k_coef, b, k)
    masks = draw_masks(k_mask, pool, b)

    inter = public_reps is not None
    pub_perms = jnp.zeros((k, b), jnp.int32)
    slot_is_public = [False] * k
    if inter:
        if public_reps.ndim != 2 or public_reps.shape[1] != d:
            raise ValueError(f"public representations must be [b_pub, {d}], got "
                             f"{public_reps.shape}")
        b_pub = public_reps.shape[0]
        if b_pub < b:
            raise ValueError(f"inter-TextHide needs a public batch at least as large as the "
                             f"private one ({b_pub} < {b})")
        if label_mode == "code" and b_pub != b:
            raise ValueError("label_mode='code' indexes the public batch with the private "
                             f"permutation, so it needs b_pub == b (got {b_pub} != {b})")
        for j in public_slots(k):
            slot_is_public[j] = True
            if label_mode == "code":
                pub_perms = pub_perms.at[j].set(perms[j])
            else:
                kj = jax.random.fold_in(k_pub, j)
                pub_perms = pub_perms.at[j].set(
                    jax.random.permutation(kj, b_pub)[:b].astype(jnp.int32))

    mixed = None
    for j in range(k):
        source = public_reps[pub_perms[j]] if slot_is_public[j] else reps[perms[j]]
        term = lam[:, j:j + 1].astype(reps.dtype) * source
        mixed = term if mixed is None else mixed + term

    soft = labels.astype(jnp.float32)
    if soft.ndim == 1:
        soft_slots = soft[perms]                       # [k, b]
        weight = lambda j: lam[:, j]
    else:
        soft_slots = soft[perms]                       # [k, b, C]
        weight = lambda j: lam[:, j:j + 1]
    mixed_labels = None
    for j in range(k):
        if slot_is_public[j] and label_mode == "paper":
            continue                                   # public slots carry no label
        term = weight(j) * soft_slots[j]
        mixed_labels = term if mixed_labels is None else mixed_labels + term
    if inter and label_mode == "paper":
        private_mass = sum(lam[:, j] for j in range(k) if not slot_is_public[j])
        mixed_labels = mixed_labels / (private_mass if soft.ndim == 1 else private_mass[:, None])

    return Hidden(apply_masks(masks, mixed), mixed_labels, lam, perms, pub_perms, masks)


# ----------------------------------------------------------------------------- losses


def soft_cross_entropy(logits: jax.Array, soft_labels: jax.Array) -> jax.Array:
    """[b]: −Σ_c ỹ_c log softmax(logits)_c (float32). With one-hot ỹ this is the usual CE."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(soft_labels.astype(jnp.float32) * logp, axis=-1)


def dropout_keys(dropout_key: jax.Array | None) -> tuple[Any, Any, Any]:
    """(private encoder, public encoder, head) dropout keys; all None when deterministic.

    A plain fine-tuning step that wants to match TextHide with (m, k) = (0, 1) bit for bit uses
    the first key for the encoder and the third for the head.
    """
    if dropout_key is None:
        return None, None, None
    enc, pub, head = jax.random.split(dropout_key, 3)
    return enc, pub, head


def texthide_batch_loss(encoder_apply: EncoderApply, head_apply: HeadApply, params: Any,
                        batch: Mapping[str, jax.Array], key: jax.Array, *, pool: MaskPool,
                        k: int, num_classes: int | None = None, task: str = "classification",
                        public_inputs: Mapping[str, jax.Array] | None = None,
                        label_mode: str = "paper", dropout_key: jax.Array | None = None
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The TextHide training loss of one batch (differentiable in `params`).

    Args:
      encoder_apply: (params, inputs, dropout_key | None) -> [b, d] representations.
      head_apply: (params, reps [b, d], dropout_key | None) -> logits [b, C] (regression [b, 1]
        or [b]).
      params: the trainable pytree both callbacks read.
      batch: encoder inputs plus "labels" (int [b] classes, or float [b] regression targets).
        The whole batch is passed to `encoder_apply`.
      key: SECRET per-step key (permutations, coefficients, mask choice).
      pool: the client's `MaskPool`; k: representations per row.
      num_classes: C (classification; defaults to the head's output width).
      public_inputs: encoder inputs of a public unlabeled batch → inter-TextHide.
      label_mode: inter label rule, "paper" or "code".
      dropout_key: None = deterministic; otherwise split by `dropout_keys`.

    Returns:
      (loss, metrics) with metrics {"loss", "mixed_label_agreement"} (argmax h(ẽ) vs argmax ỹ;
      classification only).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    labels = batch["labels"]
    if labels.ndim != 1:
        raise ValueError(
            f"texthide_batch_loss needs a batch of labels [b], got shape {labels.shape}. It is a "
            "BATCH-level loss (rows mix k examples) and must not be vmapped per example; "
            "per-example DP-SGD cannot be combined with TextHide (see check_privacy_combination)")
    enc_key, pub_key, head_key = dropout_keys(dropout_key)
    reps = encoder_apply(params, batch, enc_key)
    public_reps = None
    if public_inputs is not None:
        public_reps = encoder_apply(params, public_inputs, pub_key)
    if task == "classification":
        if num_classes is None:
            raise ValueError("classification needs num_classes")
        targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
    else:
        targets = labels.astype(jnp.float32)
    hidden = encrypt(key, reps, targets, pool, k, public_reps=public_reps, label_mode=label_mode)
    logits = head_apply(params, hidden.reps, head_key)
    metrics = {}
    if task == "classification":
        per_row = soft_cross_entropy(logits, hidden.labels)
        metrics["mixed_label_agreement"] = jnp.mean(
            (jnp.argmax(logits, -1) == jnp.argmax(hidden.labels, -1)).astype(jnp.float32))
    else:
        pred = logits.reshape(logits.shape[0], -1)[:, 0].astype(jnp.float32)
        per_row = jnp.square(pred - hidden.labels)
    loss = jnp.mean(per_row)
    metrics["loss"] = loss
    return loss, metrics


def texthide_eval_representations(key: jax.Array, reps: jax.Array, pool: MaskPool) -> jax.Array:
    """Inference-time hiding: no mixing (k = 1), one pool mask per example."""
    return apply_masks(draw_masks(key, pool, reps.shape[0]), reps)


def texthide_eval_logits(encoder_apply: EncoderApply, head_apply: HeadApply, params: Any,
                         inputs: Mapping[str, jax.Array], key: jax.Array, *, pool: MaskPool
                         ) -> jax.Array:
    """Logits h(σ ∘ f(x)) of an eval batch (deterministic encoder and head, mask kept)."""
    reps = encoder_apply(params, inputs, None)
    return head_apply(params, texthide_eval_representations(key, reps, pool), None)


# ----------------------------------------------------------------------------- head


class TextHideHead(nnx.Module):
    """h_θ2: dropout(p) on the input → L × (Dense(hidden) + tanh) → Dense(C).

    Paper: three hidden layers of width d ((768, 768, 768) for BERT-base). The official code
    applies ONE Dense(d) three times (`tie_hidden=True`, needs hidden == d) and has a
    `small_cls` option with two hidden layers. Dropout only on the input (as in the code).

    `input_norm="rms"` (not in the paper) divides each hidden row by its root mean square
    before the first layer. The RMS is the same for every sign mask (|σ ∘ e| = |e|), so this
    reads nothing the released row does not carry; it puts the tanh layers in their non-linear
    range when the encoder's pooled output is small (MiniLM's untrained pooler: RMS 0.06),
    where a near-linear head sees, averaged over the masks, no gradient at all.
    """

    def __init__(self, d: int, num_classes: int, *, hidden: int | None = None,
                 dropout: float = 0.0, tie_hidden: bool = False, small_cls: bool = False,
                 initializer_range: float = 0.02, input_norm: str = "none", rngs: nnx.Rngs):
        hidden = d if hidden is None else hidden
        if tie_hidden and hidden != d:
            raise ValueError(f"tie_hidden applies one Dense({d}) repeatedly, so hidden must be "
                             f"{d}, got {hidden}")
        if input_norm not in HEAD_INPUT_NORMS:
            raise ValueError(f"input_norm must be one of {HEAD_INPUT_NORMS}, got {input_norm!r}")
        self.input_norm = input_norm
        self.num_hidden_layers = 2 if small_cls else 3
        self.tie_hidden = tie_hidden
        init = nnx.initializers.truncated_normal(stddev=initializer_range)
        dense = lambda i, o: nnx.Linear(i, o, kernel_init=init, rngs=rngs)
        if tie_hidden:
            self.hidden = nnx.List([dense(d, d)])
        else:
            widths = [d] + [hidden] * self.num_hidden_layers
            self.hidden = nnx.List([dense(widths[i], widths[i + 1])
                                    for i in range(self.num_hidden_layers)])
        self.out_proj = dense(hidden, num_classes)
        self.dropout = prng.Dropout(dropout)

    def __call__(self, x: jax.Array, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """x: [b, d] → float32 logits [b, C]."""
        if self.input_norm == "rms":
            x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True)
                                  + 1e-12).astype(x.dtype)
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        for i in range(self.num_hidden_layers):
            layer = self.hidden[0] if self.tie_hidden else self.hidden[i]
            x = jnp.tanh(layer(x))
        return self.out_proj(x).astype(jnp.float32)
