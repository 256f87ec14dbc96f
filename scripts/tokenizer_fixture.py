#!/usr/bin/env python3
"""Makes the tokenizer fixture of `ingot data tokenize` (trainer/tests/fixtures/tokenizer/):

- tokenizer.json: a GPT-2 style byte-level BPE (ByteLevel pre-tokenizer with GPT-2's regex,
  ByteLevel decoder), trained by Hugging Face's `tokenizers` on this repository's README.md
  (a few KB is enough; the vocabulary is 512, so the file stays small);
- sample.txt: a text to encode (ASCII, UTF-8 beyond it, newlines, runs of spaces);
- sample_ids.json: the Python library's encoding of sample.txt, the ids Ingot must reproduce.

Run from the repository root with a Python that has `tokenizers` (0.23 made the committed
files):  python scripts/tokenizer_fixture.py
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = "trainer/tests/fixtures/tokenizer"


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    with open("README.md", encoding="utf-8") as f:
        text = f.read()[:8000]
    tok.train_from_iterator([text], trainer=trainer)
    tok.save(f"{OUT}/tokenizer.json")
    sample = (
        "Ingot compiles a neural-network training step; the plan is the allocation.\n"
        "  Two spaces, a tab\there, digits 12345 and 2026, and UTF-8: naïve café, 日本語, ✓.\n"
        "It's what they'll do: don't panic!<|endoftext|>The end.\n"
    )
    with open(f"{OUT}/sample.txt", "w", encoding="utf-8") as f:
        f.write(sample)
    ids = Tokenizer.from_file(f"{OUT}/tokenizer.json").encode(sample).ids
    with open(f"{OUT}/sample_ids.json", "w") as f:
        json.dump(ids, f)
        f.write("\n")
    print(f"{len(ids)} ids for {len(sample)} characters; vocabulary {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
