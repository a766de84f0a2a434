"""Tokenizers: HF ``tokenizers`` from a local ``tokenizer.json``, or a byte-level fallback.

Both turn a batch of documents into one token array with the EOS id after every document,
which is exactly the stream the packer cuts into sequences. Special tokens (BOS, templates)
are not added: the EOS between documents is the only separator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardstream.errors import ConfigError

# Tried in order when no --eos-token is given.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[EOS]", "<|eos|>")
BYTE_EOS_ID = 256

TokenArray = npt.NDArray[np.unsignedinteger[Any]]
_U16 = np.dtype(np.uint16)


class DocTokenizer(Protocol):
    """What the builder needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def encode_docs(self, docs: Sequence[str]) -> TokenArray:
        """All documents' ids, each followed by EOS, as one array of :func:`token_dtype`."""
        ...

    def encode_lengths(self, docs: Sequence[str]) -> tuple[TokenArray, npt.NDArray[np.int64]]:
        """:meth:`encode_docs` and each document's length in it (its EOS included)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON description kept in the dataset metadata."""
        ...


def _join_with_eos(
    pieces: Sequence[Any], lengths: Sequence[int], eos_id: int, dtype: np.dtype[Any]
) -> TokenArray:
    """One array: each piece (a sequence of ids) followed by ``eos_id``.

    A slice assignment per document: faster than ``np.insert`` (which builds a mask over
    every token) for all but tiny documents.
    """
    out = np.empty(sum(lengths) + len(lengths), dtype=dtype)
    pos = 0
    for piece, length in zip(pieces, lengths, strict=True):
        out[pos : pos + length] = piece
        pos += length
        out[pos] = eos_id
        pos += 1
    return out


def _with_eos(lengths: Sequence[int]) -> npt.NDArray[np.int64]:
    return np.asarray(lengths, dtype=np.int64) + 1


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255 and EOS 256: no file needed, every text encodes."""

    vocab_size = BYTE_EOS_ID + 1
    eos_id = BYTE_EOS_ID

    def encode_docs(self, docs: Sequence[str]) -> TokenArray:
        """UTF-8 bytes of each document followed by 256."""
        return self.encode_lengths(docs)[0]

    def encode_lengths(self, docs: Sequence[str]) -> tuple[TokenArray, npt.NDArray[np.int64]]:
        """:meth:`encode_docs` and each document's length (EOS included)."""
        encoded = [np.frombuffer(d.encode("utf-8"), dtype=np.uint8) for d in docs]
        lengths = [len(b) for b in encoded]
        return _join_with_eos(encoded, lengths, self.eos_id, _U16), _with_eos(lengths)

    def describe(self) -> dict[str, Any]:
        """``{"kind": "bytes", ...}``."""
        return {"kind": "bytes", "vocab_size": self.vocab_size, "eos_id": self.eos_id}


class HFTokenizer:
    """A HF ``tokenizers`` tokenizer loaded from a local ``tokenizer.json``."""

    def __init__(self, path: Path, eos_token: str | None = None) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception for every problem
            raise ConfigError(
                f"{path}: tokenizer file does not load ({exc}); pass a tokenizer.json saved "
                "by HF tokenizers (Tokenizer.save) or leave --tokenizer out for byte-level ids"
            ) from exc
        self._path = path
        self._vocab = int(self._tok.get_vocab_size(with_added_tokens=True))
        candidates = (eos_token,) if eos_token else _EOS_CANDIDATES
        for token in candidates:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                self._eos_token, self._eos = token, int(token_id)
                break
        else:
            raise ConfigError(
                f"{path}: the tokenizer has no end-of-sequence token "
                f"{' or '.join(repr(c) for c in candidates)}; name one with --eos-token"
            )

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._vocab

    @property
    def eos_id(self) -> int:
        """Id placed after every document."""
        return self._eos

    def encode_docs(self, docs: Sequence[str]) -> TokenArray:
        """Batch-encode (no special tokens) and join with EOS."""
        return self.encode_lengths(docs)[0]

    def encode_lengths(self, docs: Sequence[str]) -> tuple[TokenArray, npt.NDArray[np.int64]]:
        """:meth:`encode_docs` and each document's length (EOS included)."""
        encodings = self._tok.encode_batch_fast(list(docs), add_special_tokens=False)
        ids = [e.ids for e in encodings]
        lengths = [len(i) for i in ids]
        joined = _join_with_eos(ids, lengths, self._eos, token_dtype(self._vocab))
        return joined, _with_eos(lengths)

    def describe(self) -> dict[str, Any]:
        """Kind, file path and sha256, vocabulary size and EOS."""
        return {
            "kind": "tokenizers",
            "path": str(self._path),
            "sha256": file_sha256(self._path),
            "vocab_size": self._vocab,
            "eos_token": self._eos_token,
            "eos_id": self._eos,
        }


@dataclass(frozen=True)
class TokenizerSpec:
    """How to build a tokenizer (picklable, sent to worker processes)."""

    path: Path | None = None
    eos_token: str | None = None

    def load(self) -> DocTokenizer:
        """The tokenizer; raises :class:`ConfigError` if the file does not load."""
        return _load(self.path, self.eos_token)


@cache
def _load(path: Path | None, eos_token: str | None) -> DocTokenizer:
    # Cached so each worker process loads the file once, not once per chunk.
    if path is None:
        return ByteTokenizer()
    return HFTokenizer(path, eos_token)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a small file (the tokenizer), recorded for lineage."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """``uint16`` when every id fits, else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)
