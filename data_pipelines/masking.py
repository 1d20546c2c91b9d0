"""Online stage of BERT pretraining data: masking, afresh at every load.

``masked_lm_prob`` = 15 %, 80 % [MASK] / 10 % random token / 10 % unchanged,
``num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))``,
optional whole-word masking, positions sorted (google-research/bert's rules).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines import tokenization


@dataclasses.dataclass(frozen=True)
class MaskingParams:
    """Parameters of the masked-LM stage."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    whole_word_masking: bool = False

    def validate(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")


def num_to_predict(num_tokens: int, params: MaskingParams) -> int:
    """BERT's count of masked positions for a sequence of ``num_tokens`` (incl. [CLS]/[SEP])."""
    # Python's round (half to even), as in the original under Python 3.
    return min(params.max_predictions_per_seq,
               max(1, int(round(num_tokens * params.masked_lm_prob))))


def mask_sequence(input_ids: np.ndarray, len_a: int, len_b: int, params: MaskingParams,
                  special: tokenization.SpecialTokenIds, vocab_size: int,
                  is_continuation: np.ndarray | None, rng: np.random.Generator,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked-LM selection on one ``[CLS] A [SEP] B [SEP]`` sequence, in place.

    Candidates are all positions except [CLS] and the two [SEP]s. Without whole-word masking,
    ``num_to_predict`` distinct candidates are chosen uniformly. With it, candidates are grouped
    into words (a ``##`` piece joins the previous piece of the same segment), the words are
    shuffled and taken greedily, skipping a word that would overshoot ``num_to_predict``.
    Every chosen position independently becomes [MASK] (80 %), stays (10 %) or becomes a token
    drawn uniformly from the whole vocabulary (10 %), as in the original.

    Args:
      input_ids: int32 [n] with n = len_a + len_b + 3; modified in place.
      len_a, len_b: segment lengths.
      is_continuation: bool [vocab_size] (``##`` pieces); needed for whole-word masking.
      rng: the example's generator.

    Returns:
      (positions int32 [k] sorted, original ids int32 [k]) with k <= max_predictions_per_seq.
    """
    n = len_a + len_b + 3
    k = num_to_predict(n, params)
    candidates = np.concatenate([np.arange(1, 1 + len_a), np.arange(2 + len_a, 2 + len_a + len_b)])
    if not params.whole_word_masking:
        chosen = candidates[rng.permutation(len(candidates))[:k]]
    else:
        if is_continuation is None:
            raise ValueError("whole_word_masking needs the vocab's continuation flags")
        starts = ~is_continuation[input_ids[candidates]]
        # A segment's first piece always starts a word (the original's group could cross [SEP]).
        starts[0] = True
        starts[len_a] = True
        group_starts = np.flatnonzero(starts)
        group_ends = np.append(group_starts[1:], len(candidates))
        chosen_list: list[int] = []
        for g in rng.permutation(len(group_starts)):
            if len(chosen_list) >= k:
                break
            size = group_ends[g] - group_starts[g]
            if len(chosen_list) + size > k:
                continue
            chosen_list.extend(candidates[group_starts[g]:group_ends[g]].tolist())
        chosen = np.asarray(chosen_list, dtype=np.int64)
    chosen = np.sort(chosen)
    original = input_ids[chosen].copy()
    m = len(chosen)
    u = rng.random(m)
    keep = rng.random(m) < 0.5
    random_ids = rng.integers(0, vocab_size, size=m)
    replacement = np.where(u < 0.8, special.mask, np.where(keep, original, random_ids))
    input_ids[chosen] = replacement
    return chosen.astype(np.int32), original.astype(np.int32)
