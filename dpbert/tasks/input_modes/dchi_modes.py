"""Qu et al.'s input modes (`dpbert.privacy.input_privacy`): dχ on the tokens (token_rep,
text_to_text), on the sentence vector (seq_rep), or no release at all (none).

    none / token_rep / text_to_text   the encoder reads the (released) tokens: any task with
                                      TOKENS; every clipper loss shape (the ghost clippers'
                                      factored loss too)
    seq_rep                           the head reads a noisy sentence vector from the frozen
                                      encoder: tasks with SENTENCE; no factored loss (the ghost
                                      clippers differentiate the encoder's input vectors)
"""

from __future__ import annotations

import dataclasses

from dpbert.errors import ConfigError
from dpbert.privacy import input_privacy
from dpbert.tasks.input_modes.base import SENTENCE, TOKENS, InputMode


@dataclasses.dataclass(frozen=True)
class DchiMode(InputMode):
    name: str
    needs: tuple[str, ...] = (TOKENS,)
    loss_shapes: tuple[str, ...] = ("per_example", "batch", "factored")

    def settings(self, config) -> input_privacy.InputPrivacyConfig:
        p = config.privacy
        try:
            return input_privacy.InputPrivacyConfig(
                mode=self.name, eta=None if self.name == "none" else p.eta,
                fresh_noise_each_epoch=bool(p.fresh_noise_each_epoch),
                seq_rep_source=p.seq_rep_source, tokens_per_call=p.tokens_per_call,
                examples_per_call=p.examples_per_call, chunk_size=p.chunk_size)
        except ValueError as e:
            raise ConfigError(f"config.{e}") from None

    def validate(self, config) -> None:
        self.settings(config)

    def user_side(self, config, model, vocab_file: str):
        return input_privacy.InputPrivatizer.from_model(self.settings(config), model, vocab_file)

    def eta(self, config) -> float | None:
        return None if self.name == "none" else float(config.privacy.eta)

    def trainable(self, config):
        return None if self.name == "none" else input_privacy.trainable_filter(self.name)

    def frozen(self, config) -> list[str]:
        return input_privacy.frozen_parts(self.name)


# In input_privacy.MODES's order.
MODES = (DchiMode("none"), DchiMode("token_rep"), DchiMode("text_to_text"),
         DchiMode("seq_rep", needs=(SENTENCE,), loss_shapes=("per_example", "batch")))
