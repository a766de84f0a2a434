"""The tokens one global step consumes, for a mixture schedule whose phases end by tokens.

A phase end in tokens becomes a step only where every step consumes the same number of
tokens, known before reading (docs/plan.md, *Mixture schedules in tokens*):

* **packed at read time with fixed rows** (``PackOptions(rows=...)``): a global batch of
  ``B`` documents is ``B / group`` groups of ``rows`` rows of ``seq_len``, so a step is
  ``B / group x rows x seq_len`` tokens, padding included (the positions the model sees).
  ``B``, ``group`` and ``rows`` are plan parameters of the resume state (a resume adopts
  the saved ``group``), so the figure is the same on every world size;
* **a fixed-length token column** (``ndarray:uint16:2048``, what ``build text`` writes):
  ``B x 2048``.

Anything else, documents of varying length read unpacked or packed into as many rows as
they need, is refused with the fix: counting their tokens would need every document's
length in the order before the first step, and the boundary would move with the seed.
"""

from __future__ import annotations

from collections.abc import Mapping

from shardstream.client.batches.packed import Packer
from shardstream.errors import ConfigError
from shardstream.mds import token_column, tokens_per_sample

__all__ = ["tokens_per_step"]

_FIX = (
    "pack the documents at read time into a fixed number of rows "
    "(pack=PackOptions(seq_len=..., rows=...)), or end the phases by step (Phase(until=...))"
)


def tokens_per_step(
    encodings: Mapping[str, str], packer: Packer | None, global_batch_size: int
) -> int:
    """Tokens a global step of ``global_batch_size`` samples consumes (see the module), or
    :class:`ConfigError` naming the fix where that is not fixed."""
    why = "Phase.until_tokens needs the same number of tokens in every step"
    if packer is not None:
        rows, seq_len = packer.options.rows, packer.options.seq_len
        if rows is None:
            raise ConfigError(
                f"{why}, but PackOptions.rows is None: each group of documents takes as "
                f"many rows as it needs, so a step's tokens vary; set PackOptions(rows=...) "
                f"(each group of {packer.group} documents then fills exactly that many rows "
                f"of {seq_len}), or end the phases by step (Phase(until=...))"
            )
        return global_batch_size // packer.group * rows * seq_len
    per_sample = tokens_per_sample(encodings)
    if per_sample is None:
        name = token_column(encodings)
        what = (
            f"column {name!r} holds arrays of varying length ({encodings[name]})"
            if name is not None
            else f"no column is a fixed-length token array (columns: {sorted(encodings)})"
        )
        raise ConfigError(f"{why}, but {what}: {_FIX}")
    return global_batch_size * per_sample
